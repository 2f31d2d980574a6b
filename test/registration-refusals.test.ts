// The node's registration client against a market whose answers the test scripts (a plain HTTP
// server on 127.0.0.1): a heartbeat the market refuses (stale, invalid, unsigned, …) makes the node
// not ready and register again at once; one it only fails to answer (429, 408, 5xx) does not; a
// market that refuses the registrations too is retried with backoff, never in a tight loop.
import http from 'node:http';
import net from 'node:net';
import { afterEach, describe, expect, test } from 'vitest';
import { toHex } from '../attestation/bytes.ts';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import { createMarket } from '../src/market/market.ts';
import { readiness, type MarketplaceStatus, type Registration, type RegistrationOptions } from '../src/registration.ts';
import { heartbeatOf, provider, registeringNode, type LogLine } from './helpers/market-provider.ts';
import { testKey } from './helpers/receipts.ts';
import { until } from './helpers/wait.ts';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined);
});

type Route = 'register' | 'heartbeat';
interface Answer {
  status: number;
  /** Sent as JSON, or as it is when `raw`. */
  body: unknown;
  raw?: boolean;
  headers?: Record<string, string>;
}
/** One request as the market saw it, with the node's standing when it arrived. */
interface Seen {
  route: Route;
  /** The registration's issued_at (registrations only). */
  issuedAt?: number;
  status: MarketplaceStatus;
  /** When the market got it (performance.now()). */
  at: number;
}

const ok: Answer = { status: 200, body: { ok: true } };
const registered = (intervalMs = 30): Answer => ({ status: 200, body: { registered: true, heartbeat_interval_ms: intervalMs } });
const error = (status: number, code: string, message: string): Answer => ({ status, body: { error: { code, message } } });

/**
 * A market that answers each request with `script(route, n)` (n counts that route's requests from
 * 1) and records what it saw. `node` is read when a request arrives, for its status at that moment.
 */
async function scriptedMarket(script: (route: Route, n: number) => Answer, node: () => Registration | undefined): Promise<{ url: string; seen: Seen[] }> {
  const seen: Seen[] = [];
  const counts = { register: 0, heartbeat: 0 };
  const server = http.createServer((req, res) => {
    let text = '';
    req.on('data', (d: Buffer) => (text += d.toString()));
    req.on('end', () => {
      const route: Route | undefined = req.url === '/v1/providers/register' ? 'register' : req.url === '/v1/providers/heartbeat' ? 'heartbeat' : undefined;
      const answer = route === undefined ? error(404, 'not_found', 'no such route') : script(route, ++counts[route]);
      if (route !== undefined) {
        const envelope = JSON.parse(text) as DsseEnvelope;
        const issuedAt = route === 'register' ? (JSON.parse(Buffer.from(envelope.payload, 'base64').toString()) as { issued_at: number }).issued_at : undefined;
        seen.push({ route, ...(issuedAt !== undefined ? { issuedAt } : {}), status: node()!.status(), at: performance.now() });
      }
      res.writeHead(answer.status, { 'content-type': 'application/json', ...answer.headers }).end(answer.raw ? String(answer.body) : JSON.stringify(answer.body));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => new Promise((r) => server.close(() => r())));
  return { url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`, seen };
}

const p = provider();
const { key } = p;
/** The heartbeat body: the scripted market does not read it. */
const snapshot: DsseEnvelope = { payloadType: 'application/vnd.service.capacity.v1+json', payload: '', signatures: [] };

/** The node's registration with the market at `marketUrl`, logging into `lines`. */
function registerNode(marketUrl: string, over: Partial<RegistrationOptions> = {}): { reg: Registration; lines: LogLine[] } {
  const n = registeringNode(marketUrl, p, { capacity: () => snapshot, backoff: { initialMs: 20, maxMs: 80 }, minIntervalMs: 10, ...over });
  cleanups.push(() => n.reg.stop());
  return n;
}

/** A market scripted by `script` and a node registering with it. */
async function scenario(script: (route: Route, n: number) => Answer, over: Partial<RegistrationOptions> = {}) {
  let reg: Registration | undefined;
  const market = await scriptedMarket(script, () => reg);
  const node = registerNode(market.url, over);
  reg = node.reg;
  return { ...node, seen: market.seen, url: market.url };
}

const routes = (seen: Seen[]) => seen.map((s) => s.route);

describe('a heartbeat the market refuses', () => {
  test.each([
    [409, 'heartbeat_stale', 'at: 1767225600000 is not newer than the last heartbeat taken', 40, 'the marketplace took a heartbeat as stale (not newer than what it already took: has the clock stepped back?); registering again'],
    [400, 'heartbeat_invalid', "at: 1767225600000 is more than 5 minutes from the market's clock", 40, 'the marketplace refused a heartbeat; registering again'],
    [401, 'signature_invalid', 'no valid signature by the provider', 40, 'the marketplace refused a heartbeat; registering again'],
    [403, 'http_403', '', 40, 'the marketplace refused a heartbeat; registering again'],
    [409, 'conflict', 'something else', 40, 'the marketplace refused a heartbeat; registering again'],
    [404, 'unknown_provider', 'provider … is not registered here: register again', 30, 'the marketplace does not know this node; registering again'],
  ])('%i %s: not ready until the node registered again, which it does next', async (status, code, message, level, logged) => {
    const answer = code.startsWith('http_') ? { status, body: {} } : error(status, code, message);
    const n = await scenario((route, i) => (route === 'register' ? registered() : i === 1 ? answer : ok));
    await until('a heartbeat accepted after the refusal', () => n.reg.status().last_heartbeat_at !== null);
    expect(routes(n.seen).slice(0, 4)).toEqual(['register', 'heartbeat', 'register', 'heartbeat']);
    // When the registration after the refusal arrived, the node counted itself unregistered, and said why.
    const during = n.seen[2]!.status;
    expect(during).toMatchObject({ registered: false, last_error: { during: 'heartbeat', status, code, reason: message } });
    const r = readiness(false, true, during);
    expect(r.ready).toBe(false);
    expect(r.reasons).toEqual([`not registered with the marketplace at ${n.url}: last heartbeat failed: ${code}${message ? ` (${message})` : ''}`]);
    // Logged once, with the market's code, never the node's key or what it signs.
    expect(n.lines.filter((l) => l.msg === logged)).toEqual([expect.objectContaining({ level, status, code, reason: message })]);
    expect(JSON.stringify(n.lines)).not.toContain(toHex(key.seed));
    // Registered again, and ready.
    expect(n.reg.status()).toMatchObject({ registered: true, last_error: null });
    expect(readiness(false, true, n.reg.status())).toEqual({ ready: true, reasons: [] });
  });

  test('after the clock stepped back, the registration after a stale heartbeat is still later than the last one', async () => {
    let clock = 1_767_225_600_000;
    // The clock steps back a minute as the market takes the first heartbeat (which comes at once after the registration).
    const n = await scenario((route, i) => (route === 'register' ? registered() : i === 1 ? ((clock -= 60_000), error(409, 'heartbeat_stale', 'at: not newer than the last heartbeat taken')) : ok), { now: () => clock });
    await until('registered again', () => n.seen.filter((s) => s.route === 'register').length === 2 && n.reg.registered);
    const [first, second] = n.seen.filter((s) => s.route === 'register').map((s) => s.issuedAt!);
    expect(first).toBe(1_767_225_600_000);
    // The market refuses an older issued_at, and takes the same one as a replay that changes nothing.
    expect(second).toBeGreaterThan(first!);
    expect(n.reg.status().registered_at).toBe(1_767_225_540_000);
  });

  test('refused every heartbeat but taken every registration: one registration per heartbeat interval, logged once', async () => {
    const n = await scenario((route) => (route === 'register' ? registered(20) : error(400, 'heartbeat_invalid', 'at: too far from the market clock')));
    // The fifth registration arrives once the node has handled the four before it and their heartbeats.
    await until('five registrations', () => n.seen.filter((s) => s.route === 'register').length >= 5);
    // An interval (20 ms) after each registration that followed a second refusal in a row, never a
    // tight loop (a lower bound; after the first, the heartbeat comes at once).
    const regs = n.seen.filter((s) => s.route === 'register');
    expect(regs[4]!.at - regs[2]!.at).toBeGreaterThanOrEqual(2 * 20);
    await n.reg.stop();
    // Each registration is followed by a heartbeat at the interval, never straight by another registration.
    const seen = routes(n.seen);
    expect(seen.every((r, i) => r === (i % 2 === 0 ? 'register' : 'heartbeat'))).toBe(true);
    // The first refusal warns; the same cycle again is at debug.
    expect(n.lines.filter((l) => l.msg === 'the marketplace refused a heartbeat; registering again').map((l) => l.level).slice(0, 4)).toEqual([40, 20, 20, 20]);
    // Info for the first registration and the one after the first refusal; the rest of the cycle at debug.
    expect(n.lines.filter((l) => l.msg === 'registered with the marketplace').map((l) => l.level).slice(0, 4)).toEqual([30, 30, 20, 20]);
  });

  test('after the market forgot the node (404 unknown_provider: it restarted), the heartbeat after the registration comes at once, not an interval later', async () => {
    // An interval of 10 s: the market must not take the node for accepting, every slot free, that long.
    const n = await scenario((route, i) => (route === 'register' ? registered(10_000) : i === 1 ? error(404, 'unknown_provider', 'no such provider') : ok));
    await until('the heartbeat after the second registration', () => n.seen.filter((s) => s.route === 'heartbeat').length >= 2, 30_000);
    expect(routes(n.seen).slice(0, 4)).toEqual(['register', 'heartbeat', 'register', 'heartbeat']);
    const [, , reg2, hb2] = n.seen;
    expect(hb2!.at - reg2!.at).toBeLessThan(5_000); // (at once; an interval would be 10 s)
  });

  test('a refusal for another reason than the last one is logged at its level again', async () => {
    const answers = [error(409, 'heartbeat_stale', 'at: not newer'), error(409, 'heartbeat_stale', 'at: not newer'), error(400, 'heartbeat_invalid', 'at: too far')];
    const n = await scenario((route, i) => (route === 'register' ? registered() : (answers[i - 1] ?? ok)));
    await until('a heartbeat accepted after the refusals', () => n.reg.status().last_heartbeat_at !== null);
    expect(n.lines.filter((l) => /registering again$/.test(l.msg)).map((l) => [l.code, l.level])).toEqual([
      ['heartbeat_stale', 40],
      ['heartbeat_stale', 20],
      ['heartbeat_invalid', 40],
    ]);
  });

  test('refused every heartbeat and then every registration: the registration backs off, the node is not ready and says why', async () => {
    const n = await scenario((route, i) =>
      route === 'register' ? (i === 1 ? registered() : error(400, 'registration_invalid', "issued_at: 1767225600000 is more than 5 minutes from the market's clock")) : error(401, 'signature_invalid', 'no valid signature'),
    );
    await until('five refused registrations', () => n.lines.filter((l) => l.msg === 'the marketplace refused the registration; retrying').length >= 5);
    const retries = n.lines.filter((l) => l.msg === 'the marketplace refused the registration; retrying');
    // Doubling from 20 ms up to 80: the backoff, not a tight loop.
    expect(retries.slice(0, 5).map((l) => l.retry_in_ms)).toEqual([20, 40, 80, 80, 80]);
    expect(retries.slice(0, 5).map((l) => l.level)).toEqual([50, 20, 20, 20, 20]);
    // No heartbeat while unregistered.
    expect(routes(n.seen).slice(0, 3)).toEqual(['register', 'heartbeat', 'register']);
    expect(routes(n.seen).slice(2).every((r) => r === 'register')).toBe(true);
    expect(n.reg.registered).toBe(false);
    expect(readiness(false, true, n.reg.status()).reasons).toEqual([
      `not registered with the marketplace at ${n.url}: last registration failed: registration_invalid (issued_at: 1767225600000 is more than 5 minutes from the market's clock)`,
    ]);
  });
});

describe('the development market', () => {
  test("a node whose clock stepped back past its registration goes on sending heartbeats the market counts: none stale, no new registration", async () => {
    const market = createMarket({ seed: testKey().seed, heartbeatIntervalMs: 50 });
    const url = (await market.listen()).url;
    cleanups.push(() => market.close());
    // The node's clock: the market's, until the test steps it back.
    let offset = 0;
    const clock = () => Date.now() + offset;
    const n = registerNode(url, { capacity: (at) => heartbeatOf(p, { at }), now: clock });
    const record = () => market.store.providers.get(key.id);
    await until('a heartbeat taken', () => record()?.capacity !== undefined);
    // Back by twice the time since the registration: the clock now reads earlier than issued_at.
    const registered = record()!.issued_at;
    offset = -2 * (clock() - registered) - 1000;
    expect(clock()).toBeLessThan(registered);
    const taken = record()!.capacity!.at;
    // Ten more intervals of heartbeats, each one counted.
    await until('heartbeats taken after the step', () => record()!.capacity!.at >= taken + 10);
    expect(record()!.issued_at).toBe(registered);
    expect(n.lines.filter((l) => l.code === 'heartbeat_stale')).toEqual([]);
    await until('the market to list it live', async () => ((await (await fetch(`${url}/v1/providers`)).json()) as { provider: string; live: boolean }[]).some((p) => p.provider === key.id && p.live));
    expect(n.reg.status()).toMatchObject({ registered: true, last_error: null });
  });
});

describe('a heartbeat the market fails to answer keeps the node registered and ready (docs/decisions.md §Readiness)', () => {
  test.each([
    [429, error(429, 'rate_limited', 'slow down'), { status: 429, code: 'rate_limited', reason: 'slow down' }],
    [408, error(408, 'request_timeout', 'too slow'), { status: 408, code: 'request_timeout', reason: 'too slow' }],
    [503, error(503, 'unavailable', 'restarting'), { reason: 'HTTP 503 unavailable' }],
    [500, { status: 500, body: 'not json', raw: true }, { reason: 'HTTP 500 with a body that is not JSON' }],
  ])('%i', async (_status, answer, lastError) => {
    const n = await scenario((route, i) => (route === 'register' ? registered() : i <= 2 ? answer : ok));
    await until('a heartbeat accepted after the failures', () => n.reg.status().last_heartbeat_at !== null);
    // Heartbeats again at the interval: no registration in between.
    expect(routes(n.seen).slice(0, 4)).toEqual(['register', 'heartbeat', 'heartbeat', 'heartbeat']);
    const during = n.seen[2]!.status;
    expect(during).toMatchObject({ registered: true, last_heartbeat_at: null, last_error: { during: 'heartbeat', ...lastError } });
    expect(readiness(false, true, during)).toEqual({ ready: true, reasons: [] });
    expect(n.lines.filter((l) => l.msg === 'heartbeat failed; still serving, will keep trying')).toEqual([expect.objectContaining({ level: 40 })]);
    expect(n.lines.some((l) => /registering again/.test(l.msg))).toBe(false);
  });
});

describe('a registration the market answers 408 or 429 (busy, not a refusal: docs/market-api.md)', () => {
  test.each([429, 408])('%i is a warning that it will be retried, not an error that it was refused', async (status) => {
    const n = await scenario((route, i) => (route === 'register' ? (i === 1 ? error(status, 'busy', 'try later') : registered()) : ok));
    await until('registered after the busy answer', () => n.reg.registered);
    expect(n.lines.filter((l) => /registration/.test(l.msg)).map((l) => [l.level, l.msg])).toEqual([[40, 'marketplace unreachable; registration will be retried']]);
  });
});

describe("answers that are not the market's API are not taken at face value", () => {
  test('a heartbeat refused with a 4xx without the API\'s body (a proxy\'s HTML page) is a refusal: the node registers again', async () => {
    const n = await scenario((route, i) => (route === 'register' ? registered() : i === 1 ? { status: 404, body: '<html>Not Found</html>', raw: true } : ok));
    await until('a registration after the refusal', () => routes(n.seen).filter((r) => r === 'register').length >= 2);
    expect(routes(n.seen).slice(0, 3)).toEqual(['register', 'heartbeat', 'register']);
    expect(n.seen[2]!.status).toMatchObject({ registered: false, last_error: { during: 'heartbeat', code: 'http_404' } });
  });

  test('a 200 whose body is not the API\'s answer ({ok: false}, an error body, the wrong shape) is a failure, not a success', async () => {
    const notAnswers: Answer[] = [{ status: 200, body: { ok: false } }, { status: 200, body: { error: { code: 'x', message: 'y' } } }, { status: 200, body: [1, 2, 3] }];
    for (const wrong of notAnswers) {
      const hb = await scenario((route, i) => (route === 'register' ? registered() : i === 1 ? wrong : ok));
      await until('a heartbeat after the wrong one', () => routes(hb.seen).filter((r) => r === 'heartbeat').length >= 2);
      expect(hb.seen[2]!.status, JSON.stringify(wrong.body)).toMatchObject({ registered: true, last_heartbeat_at: null, last_error: { during: 'heartbeat', reason: "HTTP 200 with an answer that is not the API's" } });
      const reg = await scenario((route, i) => (route === 'register' ? (i === 1 ? wrong : registered()) : ok));
      await until('a second registration', () => routes(reg.seen).filter((r) => r === 'register').length >= 2);
      expect(reg.seen[1]!.status, JSON.stringify(wrong.body)).toMatchObject({ registered: false, last_error: { during: 'registration' } });
    }
  });

  test('a redirect is not followed: the signed registration goes to marketplace.url only', async () => {
    let elsewhere = 0;
    const other = http.createServer((_req, res) => {
      elsewhere++;
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ registered: true, heartbeat_interval_ms: 1000 }));
    });
    await new Promise<void>((r) => other.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise((r) => other.close(() => r())));
    const to = `http://127.0.0.1:${(other.address() as net.AddressInfo).port}/v1/providers/register`;
    for (const status of [307, 301]) {
      const n = await scenario((route) => (route === 'register' ? { status, body: '', raw: true, headers: { location: to } } : ok));
      await until('a registration retried', () => routes(n.seen).length >= 2);
      expect(n.reg.status(), String(status)).toMatchObject({ registered: false, last_error: { during: 'registration', reason: expect.stringMatching(new RegExp(`^HTTP ${status}: a redirect \\(not followed`)) } });
    }
    expect(elsewhere).toBe(0);
  });

  test('an answer larger than 64 KiB is not read: a failure, named', async () => {
    const n = await scenario((route, i) => (route === 'register' ? registered() : i === 1 ? { status: 200, body: JSON.stringify({ ok: true, pad: 'x'.repeat(200_000) }), raw: true } : ok));
    await until('a heartbeat after the large one', () => routes(n.seen).filter((r) => r === 'heartbeat').length >= 2);
    expect(n.seen[2]!.status).toMatchObject({ registered: true, last_error: { during: 'heartbeat', reason: 'HTTP 200 with an answer larger than 65536 bytes' } });
  });
});

test('a ticket key read wrong once is read again at each heartbeat until trusted: the node does not stay out of work', async () => {
  const trustedKey = testKey();
  let keyReads = 0;
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const body =
        req.url === '/v1/market'
          ? { public_key: ++keyReads === 1 ? testKey().id : trustedKey.id } // a wrong key once (a replica mid-rotation)
          : req.url === '/v1/providers/register'
            ? { registered: true, heartbeat_interval_ms: 1000 }
            : { ok: true };
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => new Promise((r) => server.close(() => r())));
  const n = registerNode(`http://127.0.0.1:${(server.address() as net.AddressInfo).port}`, { trustedKeys: [trustedKey.id] });
  await until('the key read again and trusted', () => n.reg.status().ticket_key?.trusted === true, 5000);
  // Read wrong first (said at error level), then again at a heartbeat, and trusted.
  expect(n.lines.filter((l) => /not in marketplace\.public_keys/.test(l.msg)).map((l) => l.level)).toEqual([50]);
  expect(n.lines.some((l) => l.msg === 'the marketplace now signs tickets with a trusted key')).toBe(true);
  expect(keyReads).toBeGreaterThanOrEqual(2);
});


test('a market that asks for heartbeats faster than once a second gets them once a second', async () => {
  const n = await scenario((route) => (route === 'register' ? registered(1) : ok), { minIntervalMs: undefined });
  await until('two heartbeats', () => routes(n.seen).filter((r) => r === 'heartbeat').length >= 2, 5000);
  const beats = n.seen.filter((s) => s.route === 'heartbeat').map((s) => s.at);
  expect(beats[1]! - beats[0]!).toBeGreaterThan(900);
  expect(n.lines.find((l) => l.msg === 'registered with the marketplace')).toMatchObject({ heartbeat_interval_ms: 1000 });
});
