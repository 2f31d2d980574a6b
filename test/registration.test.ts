// The node's registration client against a real market over HTTP on 127.0.0.1: registers,
// heartbeats, survives the market going away, registers again with a market that forgot it.
import net from 'node:net';
import { afterEach, describe, expect, test } from 'vitest';
import { createMarket, type Market } from '../src/market/market.ts';
import { readiness, type Registration, type RegistrationOptions } from '../src/registration.ts';
import { provider, registeringNode, type LogLine } from './helpers/market-provider.ts';
import { testKey } from './helpers/receipts.ts';
import { until } from './helpers/wait.ts';

const marketKey = testKey();
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined);
});

async function startMarket(port = 0, heartbeatIntervalMs = 100): Promise<{ market: Market; url: string; port: number }> {
  const market = createMarket({ seed: marketKey.seed, port, heartbeatIntervalMs });
  const addr = await market.listen();
  // Closed by the test or after it, whichever comes first.
  const closeOnce = market.close;
  let closed: Promise<void> | undefined;
  const close = () => (closed ??= closeOnce());
  cleanups.push(close);
  return { market: { ...market, close }, url: addr.url, port: addr.port };
}

/** A port nothing listens on (bound, then released). */
async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

function node(marketUrl: string, over: Partial<RegistrationOptions> = {}): { reg: Registration; id: string; lines: LogLine[] } {
  const p = provider();
  const n = registeringNode(marketUrl, p, { backoff: { initialMs: 50, maxMs: 200 }, ...over });
  cleanups.push(() => n.reg.stop());
  return { ...n, id: p.key.id };
}

const listed = async (url: string, id: string) => ((await (await fetch(`${url}/v1/providers`)).json()) as { provider: string; live: boolean }[]).some((p) => p.provider === id && p.live);

describe('announce (a node that stops)', () => {
  test('after it, the node neither heartbeats nor registers again, whatever the market says', async () => {
    const { market, url } = await startMarket(0, 50);
    const n = node(url);
    await until('registration', () => n.reg.registered);
    await until('the first heartbeat', () => market.store.providers.get(n.id)?.capacity !== undefined, 3000);
    await n.reg.announce(1000);
    const at = market.store.providers.get(n.id)?.capacity?.at;
    expect(at).toBeDefined();
    // The market forgets the node (as after a stale heartbeat): a running node would register again.
    market.store.providers.delete(n.id);
    await new Promise((r) => setTimeout(r, 400)); // eight heartbeat intervals
    expect(market.store.providers.get(n.id)).toBeUndefined();
  });
});

describe('startRegistration', () => {
  test('a market asking for a heartbeat interval beyond any timer gets one every ten minutes, not a tight loop', async () => {
    const { market, url } = await startMarket(0, 2 ** 40);
    const n = node(url);
    await until('registration', () => n.reg.registered);
    expect(n.lines.find((l) => l.msg === 'registered with the marketplace')).toMatchObject({ heartbeat_interval_ms: 600_000 });
    // The first heartbeat follows the registration at once, not ten minutes later: the market has
    // the live snapshot (free slots, accepting) from the start.
    await until('the first heartbeat', () => market.store.providers.get(n.id)?.capacity !== undefined, 3000);
  });

  test('registers at start and heartbeats at the interval the market asks for', async () => {
    const { market, url } = await startMarket();
    const n = node(url);
    await until('registration', () => listed(url, n.id));
    expect(n.reg.registered).toBe(true);
    await until('two heartbeats', () => (market.store.providers.get(n.id)?.capacity?.at ?? 0) > 0);
    const first = market.store.providers.get(n.id)!.capacity!.at;
    await until('another heartbeat', () => market.store.providers.get(n.id)!.capacity!.at > first, 2000);
    // (the market asked for 100 ms: raised to the floor, 1 s, so a market cannot take the node's CPU with heartbeats)
    expect(n.lines.find((l) => l.msg === 'registered with the marketplace')).toMatchObject({ heartbeat_interval_ms: 1000 });
    const st = n.reg.status();
    expect(st).toMatchObject({ url: url.replace(/\/+$/, ''), registered: true, last_error: null });
    // A market URL written with its /v1 API prefix names the same market.
    const v1 = node(`${url.replace(/\/+$/, '')}/v1/`);
    await until('registration through a /v1 URL', () => listed(url, v1.id));
    expect(st.registered_at).toBeGreaterThan(0);
    expect(st.last_heartbeat_at!).toBeGreaterThanOrEqual(st.registered_at!);
    expect(readiness(false, true, st)).toEqual({ ready: true, reasons: [] });
  });

  test('the market restarts (same port, empty state): the next heartbeat gets 404 and the node registers again', async () => {
    const a = await startMarket();
    const n = node(a.url);
    await until('registration', () => listed(a.url, n.id));
    await a.market.close();
    // Heartbeats fail while the market is down; the client keeps its state and says so once.
    await until('a failed heartbeat', () => n.lines.some((l) => l.msg.startsWith('heartbeat failed')), 2000);
    expect(n.reg.registered).toBe(true);
    expect(n.reg.status().last_error).toMatchObject({ during: 'heartbeat', reason: 'ECONNREFUSED' });
    // Registered with a failing heartbeat: still ready (the market may only be slow to answer).
    expect(readiness(false, true, n.reg.status()).ready).toBe(true);
    const b = await startMarket(a.port);
    expect(b.market.store.providers.size).toBe(0);
    await until('re-registration', () => listed(b.url, n.id));
    expect(n.lines.some((l) => l.msg === 'the marketplace does not know this node; registering again')).toBe(true);
    expect(n.lines.filter((l) => l.msg.startsWith('heartbeat failed'))).toHaveLength(1);
    await until('a heartbeat accepted again', () => n.reg.status().last_error === null && n.reg.registered);
  });

  test('a market that is down at start: no crash, registration retried with backoff until it comes up', async () => {
    const port = await freePort();
    const n = node(`http://127.0.0.1:${port}/`);
    await until('a few attempts', () => n.lines.filter((l) => /registration will be retried/.test(l.msg)).length >= 3, 3000);
    expect(n.reg.registered).toBe(false);
    // The first failure warns; the retries are quiet (debug).
    const failures = n.lines.filter((l) => /registration will be retried/.test(l.msg));
    expect(failures[0]!.level).toBe(40);
    expect(failures.slice(1).every((l) => l.level === 20)).toBe(true);
    expect(failures[0]).toMatchObject({ reason: 'ECONNREFUSED' });
    expect(n.reg.status()).toMatchObject({ registered: false, registered_at: null, last_heartbeat_at: null, last_error: { during: 'registration', reason: 'ECONNREFUSED' } });
    expect(readiness(false, true, n.reg.status())).toEqual({ ready: false, reasons: [`not registered with the marketplace at http://127.0.0.1:${port}: last registration failed: ECONNREFUSED`] });
    const { url } = await startMarket(port);
    await until('registration once the market is up', () => listed(url, n.id));
  });

  test('a refused registration is logged as an error and retried, never thrown; stop() returns promptly', async () => {
    const { url } = await startMarket();
    // (a retry a minute away: stop() must cut that wait short, not sit it out)
    const n = node(url, { models: [{ id: 'unpriced/model', quantization: 'f32', context: 512, slots: 1, tokens_per_second: 1 }], backoff: { initialMs: 60_000, maxMs: 60_000 } });
    await until('the refusal', () => n.lines.some((l) => l.code === 'registration_invalid'));
    expect(n.lines.find((l) => l.code === 'registration_invalid')).toMatchObject({ level: 50, status: 400, reason: expect.stringMatching(/^price_list: has no price/) });
    expect(n.reg.status().last_error).toMatchObject({ during: 'registration', status: 400, code: 'registration_invalid', reason: expect.stringMatching(/^price_list: has no price/) });
    expect(readiness(false, true, n.reg.status()).reasons[0]).toMatch(/^not registered with the marketplace at .*: last registration failed: registration_invalid \(price_list: has no price/);
    const t0 = Date.now();
    await n.reg.stop();
    expect(Date.now() - t0).toBeLessThan(30_000);
    expect(n.reg.registered).toBe(false);
  });

  test('a capacity callback that throws does not stop the loop', async () => {
    const { url } = await startMarket();
    const n = node(url, {
      capacity: () => {
        throw new Error('snapshot failed');
      },
      backoff: { initialMs: 20, maxMs: 50 },
    });
    await until('the error, twice', () => n.lines.filter((l) => l.msg === 'marketplace registration loop error').length >= 2);
    expect(n.reg.registered).toBe(true);
    expect(await listed(url, n.id)).toBe(true);
  });
});

describe("the market's ticket key", () => {
  test('a node that trusts the key the market signs tickets with says so; one that does not is told, in its status, its readiness and one error line', async () => {
    const { url } = await startMarket();
    const good = node(url, { trustedKeys: [marketKey.id.toUpperCase()] }); // (hex in either case)
    const other = testKey();
    const bad = node(url, { trustedKeys: [other.id] });
    await until('both registered with the key read', () => good.reg.status().ticket_key !== null && bad.reg.status().ticket_key !== null);
    expect(good.reg.status().ticket_key).toEqual({ public_key: marketKey.id, trusted: true });
    expect(readiness(false, true, good.reg.status())).toEqual({ ready: true, reasons: [] });
    expect(bad.reg.status().ticket_key).toEqual({ public_key: marketKey.id, trusted: false });
    expect(readiness(false, true, bad.reg.status())).toEqual({
      ready: false,
      reasons: [`the marketplace at ${url.replace(/\/+$/, '')} signs tickets with key ${marketKey.id}, which is not in marketplace.public_keys: every ticket it issues would be refused`],
    });
    const errors = bad.lines.filter((l) => l.level >= 50);
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatchObject({ market_key: marketKey.id, msg: expect.stringMatching(/^the marketplace signs tickets with a key that is not in marketplace\.public_keys/) });
    expect(good.lines.filter((l) => l.level >= 50)).toEqual([]);
  });

  test('a market that does not say its key leaves it unknown, and the node ready', async () => {
    // A bare HTTP server that takes registrations and heartbeats but has no GET /v1/market.
    const http = await import('node:http');
    const server = http.createServer((req, res) => {
      res.setHeader('content-type', 'application/json');
      if (req.method === 'POST') return void res.end(JSON.stringify({ registered: true, heartbeat_interval_ms: 100 }));
      res.statusCode = 404;
      res.end(JSON.stringify({ error: { code: 'not_found', message: 'no such route' } }));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise((r) => server.close(() => r())));
    const n = node(`http://127.0.0.1:${(server.address() as net.AddressInfo).port}`, { trustedKeys: [marketKey.id] });
    await until('registration', () => n.reg.registered);
    await new Promise((r) => setTimeout(r, 100));
    expect(n.reg.status().ticket_key).toBeNull();
    expect(readiness(false, true, n.reg.status()).ready).toBe(true);
  });
});

describe('readiness', () => {
  const market = { url: 'http://m', registered: true, registered_at: 1, last_heartbeat_at: 2, last_error: null, ticket_key: null };
  test('a stopped receipt log is a reason, first', () => {
    expect(readiness(false, true, market, new Error('receipt log write failed: disk full'))).toEqual({
      ready: false,
      reasons: ['the receipt log has stopped (receipt log write failed: disk full): paid requests are refused until a restart'],
    });
  });
  test('state.db refusing writes is a reason (not accepting work) while it counts', async () => {
    const { workRefused } = await import('../src/registration.ts');
    const full = new Error('database or disk is full');
    expect(readiness(false, true, market, undefined, full)).toEqual({
      ready: false,
      reasons: ['state.db refused a write (database or disk is full): paid requests are refused with 503 until a write succeeds (tried again 30 s after the last failure)'],
    });
    expect(workRefused(false, true, market, undefined, full)).toHaveLength(1);
    expect(workRefused(false, true, market, undefined, undefined)).toEqual([]);
  });
  test('stopping wins over everything', () => {
    expect(readiness(true, false, { ...market, registered: false })).toEqual({ ready: false, reasons: ['stopping'] });
  });
  test('no marketplace key and not registered: both reasons', () => {
    const r = readiness(false, false, { ...market, registered: false, registered_at: null, last_heartbeat_at: null });
    expect(r.ready).toBe(false);
    expect(r.reasons).toEqual(['no marketplace public key configured: every ticket would be refused', 'not registered with the marketplace at http://m: registration in progress']);
  });
  test('no marketplace URL configured: registration does not count', () => {
    expect(readiness(false, true, undefined)).toEqual({ ready: true, reasons: [] });
  });
});
