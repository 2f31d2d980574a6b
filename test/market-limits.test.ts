// The development market's bounds (MarketLimits): registering needs only a key of one's own and
// tickets no credentials, so what the market keeps in memory must be bounded — providers (and the
// models they list), outstanding and remembered tickets, receipt records — while the totals stay
// exact and a settled receipt is never counted twice.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { serializeEnvelope, type DsseEnvelope } from '../attestation/dsse.ts';
import { MarketClient } from '../src/gateway/market-client.ts';
import { createMarket, type Market, type MarketOptions } from '../src/market/market.ts';
import { DEFAULT_MARKET_LIMITS, type MarketLimits } from '../src/market/store.ts';
import { signCapacity } from '../src/p2p/capacity-protocol.ts';
import { call, contractOf, heartbeatOf, provider, registration, TINY, TINY_PRICE, type Provider } from './helpers/market-provider.ts';
import { receiptPayload, signReceipt, testKey } from './helpers/receipts.ts';

const marketKey = testKey();
const markets: Market[] = [];
afterEach(async () => {
  await Promise.all(markets.splice(0).map((m) => m.close()));
});

/** A market with the given limits and a clock the test moves (`at(ms)`: market time = real time + ms). */
async function start(limits: Partial<MarketLimits>, over: Partial<MarketOptions> = {}) {
  let offset = 0;
  const m = createMarket({ seed: marketKey.seed, heartbeatIntervalMs: 1000, limits, now: () => Date.now() + offset, ...over });
  markets.push(m);
  const { url } = await m.listen();
  return {
    m,
    url,
    /** Moves the market's clock to real time + ms. */
    at(ms: number) {
      offset = ms;
    },
    /** Market time now (what a node with a good clock signs). */
    now: () => Date.now() + offset,
    post: (path: string, body: unknown) => call(url, 'POST', path, body),
    get: (path: string) => call(url, 'GET', path),
  };
}

const listed = async (url: string) => ((await call(url, 'GET', '/v1/providers')).body as any[]).map((p) => p.provider as string).sort();

describe('providers', () => {
  test('beyond maxProviders a new provider is 503 too_many_providers and not listed; a known one still re-registers; one silent for over staleProviderMs makes room, and learns it from 404 unknown_provider', async () => {
    const s = await start({ maxProviders: 2, staleProviderMs: 60 * 60_000 });
    const [a, b, c] = [provider(), provider(), provider()];
    expect((await s.post('/v1/providers/register', registration(a))).status).toBe(200);
    expect((await s.post('/v1/providers/register', registration(b))).status).toBe(200);
    const full = await s.post('/v1/providers/register', registration(c));
    expect(full).toMatchObject({ status: 503, body: { error: { code: 'too_many_providers', message: expect.stringMatching(/already lists 2 providers, its limit, and none has been silent for over 60 min/) } } });
    expect(await listed(s.url)).toEqual([a.key.id, b.key.id].sort());
    // A provider already registered re-registers (a later issued_at) while the market is full.
    expect((await s.post('/v1/providers/register', registration(a, { issued_at: Date.now() + 1 }))).status).toBe(200);

    // An hour on, b is still heartbeating, a has been silent: a is dropped for c.
    s.at(61 * 60_000);
    expect((await s.post('/v1/providers/heartbeat', heartbeatOf(b, { at: s.now() }))).status).toBe(200);
    expect((await s.post('/v1/providers/register', registration(c, { issued_at: s.now() }))).status).toBe(200);
    expect(await listed(s.url)).toEqual([b.key.id, c.key.id].sort());
    expect(await s.post('/v1/providers/heartbeat', heartbeatOf(a, { at: s.now() }))).toMatchObject({ status: 404, body: { error: { code: 'unknown_provider' } } });
    // Its registering again finds no room: b and c are both fresh.
    expect((await s.post('/v1/providers/register', registration(a, { issued_at: s.now() }))).body.error.code).toBe('too_many_providers');
  });

  test('maxProviderModels bounds the model entries over all providers (what GET /v1/providers lists)', async () => {
    const s = await start({ maxProviderModels: 3 });
    const two = () => provider({ models: [TINY, { ...TINY, id: 'tiny/two' }], prices: [TINY_PRICE, { ...TINY_PRICE, model: 'tiny/two' }] });
    const three: Provider['models'] = [TINY, { ...TINY, id: 'tiny/two' }, { ...TINY, id: 'tiny/three' }];
    const a = two();
    expect((await s.post('/v1/providers/register', registration(a))).status).toBe(200);
    const r = await s.post('/v1/providers/register', registration(two()));
    expect(r).toMatchObject({ status: 503, body: { error: { code: 'too_many_providers', message: expect.stringMatching(/would bring the registered models to 4, over the market's limit of 3/) } } });
    // A provider replacing its own registration counts its new models instead of its old ones.
    const a3 = provider({ key: a.key, models: three, prices: three.map((m) => ({ ...TINY_PRICE, model: m.id })) });
    expect((await s.post('/v1/providers/register', registration(a3, { issued_at: Date.now() + 1 }))).status).toBe(200);
    expect(((await s.get('/v1/providers')).body as any[])[0].models.map((m: { id: string }) => m.id)).toEqual(['tiny/llama', 'tiny/two', 'tiny/three']);
    expect((await s.post('/v1/providers/register', registration(provider()))).body.error.code).toBe('too_many_providers');
  });

  test('maxContractChars bounds the request contracts held over all providers', async () => {
    const one = contractOf(provider()).payload.length;
    const s = await start({ maxContractChars: one * 2 + 10 });
    for (let i = 0; i < 2; i++) {
      const p = provider();
      expect((await s.post('/v1/providers/register', registration(p, { request_contracts: [contractOf(p)] }))).status).toBe(200);
    }
    const p = provider();
    expect(await s.post('/v1/providers/register', registration(p, { request_contracts: [contractOf(p)] }))).toMatchObject({ status: 503, body: { error: { code: 'too_many_providers', message: expect.stringMatching(/would bring the request contracts held to \d+ characters, over the market's limit of \d+/) } } });
    // Without a contract it fits.
    expect((await s.post('/v1/providers/register', registration(p))).status).toBe(200);
  });

  test('GET /v1/providers carries no price list, and the gateway\'s market client reads every field it uses from it', async () => {
    const s = await start({});
    const p = provider();
    expect((await s.post('/v1/providers/register', registration(p))).status).toBe(200);
    const [entry] = (await s.get('/v1/providers')).body as Record<string, unknown>[];
    expect(Object.keys(entry!).sort()).toEqual(['accepting', 'addresses', 'attestation_tier', 'last_seen', 'live', 'models', 'peer_id', 'price_version', 'provider', 'rates', 'registered_at']);
    expect(await new MarketClient(s.url).providers()).toEqual([
      {
        provider: p.key.id,
        peer_id: p.peerId,
        addresses: ['/ip4/127.0.0.1/tcp/4101'],
        models: [TINY],
        price_version: p.prices.payload.version,
        rates: { 'tiny/llama': { input_per_mtok: '150000', output_per_mtok: '600000' } },
        last_seen: expect.any(Number),
        registered_at: expect.any(Number),
        attestation_tier: 'T1',
        live: true,
        accepting: true,
      },
    ]);
  });

  test('a heartbeat is kept as the free slots and queue of the registered models only, whatever else its snapshot carries', async () => {
    const s = await start({});
    const p = provider();
    expect((await s.post('/v1/providers/register', registration(p))).status).toBe(200);
    const row = (id: string, free: number) => ({ id, context: 512, quantization: 'f32', tokens_per_second: 1, slots: 4, free_slots: free, queued: 0, queue_limit: 4, note: 'x'.repeat(1000) });
    // Unknown fields are tolerated (a newer node may add some), and models it never registered.
    const snapshot = { price_version: p.prices.payload.version, attestation_tier: 'T1', accepting: false, models: [row('tiny/llama', 3), row('tiny/llama', 0), ...Array.from({ length: 50 }, (_, i) => row(`other/${i}`, 1))], extra: 'y'.repeat(10_000) };
    const at = Date.now();
    expect((await s.post('/v1/providers/heartbeat', signCapacity({ seed: p.key.seed, providerId: p.key.id }, snapshot as never, at))).status).toBe(200);
    expect(s.m.store.providers.get(p.key.id)!.capacity).toEqual({ at, accepting: false, models: [{ id: 'tiny/llama', free_slots: 1, queued: 0, queue_limit: 4 }] }); // (3 free said, 1 slot registered: at most 1)
  });
});

/** The ticket's payload fields a receipt must repeat. */
function ticketOf(grant: { ticket: DsseEnvelope }): { ticket_id: string; request_id: string; max_cost_micro_usd: string; price_version: string; body_sha256: string } {
  return JSON.parse(Buffer.from(grant.ticket.payload, 'base64').toString('utf8'));
}

/** A receipt the provider signs for a ticket the market issued it (synthetic usage `i`, billed at TINY_PRICE). */
function receiptFor(p: Provider, grant: { ticket: DsseEnvelope }, i: number, over: Record<string, unknown> = {}): string {
  const t = ticketOf(grant);
  const payload = receiptPayload(p.key, i, {
    request_id: t.request_id,
    ticket_id: t.ticket_id,
    endpoint: 'chat/completions',
    model: 'tiny/llama',
    price: { version: t.price_version, rates: { input_per_mtok: TINY_PRICE.input_per_mtok, output_per_mtok: TINY_PRICE.output_per_mtok } },
    hold_micro_usd: t.max_cost_micro_usd,
    request_sha256: t.body_sha256,
    ...over,
  });
  return serializeEnvelope(signReceipt(p.key, payload));
}

const costOf = (line: string) => BigInt(JSON.parse(Buffer.from(JSON.parse(line).payload, 'base64').toString('utf8')).cost_micro_usd);

async function marketWithProvider(limits: Partial<MarketLimits>) {
  const s = await start(limits);
  const p = provider();
  expect((await s.post('/v1/providers/register', registration(p))).status).toBe(200);
  const ask = async (over: Record<string, unknown> = {}) => s.post('/v1/tickets', { endpoint: 'chat/completions', model: 'tiny/llama', body_sha256: 'ab'.repeat(32), max_cost_micro_usd: '100000', ...over });
  return { ...s, p, ask };
}

describe('tickets', () => {
  test('beyond maxOutstandingTickets a ticket is 503 too_many_tickets, nothing held; a settled or an expired ticket frees its place', async () => {
    const s = await marketWithProvider({ maxOutstandingTickets: 2 });
    const first = await s.ask();
    expect(first.status).toBe(200);
    expect((await s.ask()).status).toBe(200);
    const refused = await s.ask({ request_id: 'req-refused' });
    expect(refused).toMatchObject({ status: 503, body: { error: { code: 'too_many_tickets', message: expect.stringMatching(/^2 tickets are outstanding \(issued, neither settled nor expired\)/) } } });
    expect(s.m.store.outstandingTickets(s.now())).toBe(2);
    // Settling one frees a place.
    expect((await s.post('/v1/receipts', { receipt: receiptFor(s.p, first.body, 1) })).status).toBe(200);
    expect(s.m.store.outstandingTickets(s.now())).toBe(1);
    expect((await s.ask()).status).toBe(200);
    expect((await s.ask()).body.error.code).toBe('too_many_tickets');
    // Past their 60 s, the unsettled ones no longer count.
    s.at(61_000);
    expect((await s.post('/v1/providers/heartbeat', heartbeatOf(s.p, { at: s.now() }))).status).toBe(200);
    expect(s.m.store.outstandingTickets(s.now())).toBe(0);
    expect((await s.ask()).status).toBe(200);
  });

  test('a ticket released by the buyer\'s gateway (it never reached its provider) stops counting as outstanding; a receipt for it still settles; an unknown one is 404', async () => {
    const s = await marketWithProvider({ maxOutstandingTickets: 1 });
    const a = await s.ask();
    expect((await s.ask()).body.error.code).toBe('too_many_tickets');
    const id = ticketOf(a.body).ticket_id;
    expect(await s.post(`/v1/tickets/${id}/release`, undefined)).toMatchObject({ status: 200, body: { released: true } });
    expect(s.m.store.outstandingTickets(s.now())).toBe(0);
    expect((await s.ask()).status).toBe(200);
    expect(await s.post(`/v1/tickets/${id}/release`, undefined)).toMatchObject({ status: 200, body: { released: false } });
    expect((await s.post('/v1/receipts', { receipt: receiptFor(s.p, a.body, 1) })).status).toBe(200);
    expect(await s.post('/v1/tickets/tkt-nothing/release', undefined)).toMatchObject({ status: 404, body: { error: { code: 'unknown_ticket' } } });
  });

  test('released tickets still count against maxTickets until they expire (a receipt for one is still taken): issuing and releasing in a loop is refused at the bound, not remembered without end (s29 review)', async () => {
    const s = await marketWithProvider({ maxOutstandingTickets: 2, maxTickets: 3 });
    const issued: { ticket: DsseEnvelope }[] = [];
    for (let i = 0; i < 3; i++) {
      const t = await s.ask();
      expect(t.status).toBe(200);
      issued.push(t.body);
      expect(await s.post(`/v1/tickets/${ticketOf(t.body).ticket_id}/release`, undefined)).toMatchObject({ status: 200, body: { released: true } });
    }
    expect(s.m.store.outstandingTickets(s.now())).toBe(0);
    const refused = await s.ask();
    expect(refused).toMatchObject({ status: 503, body: { error: { code: 'too_many_tickets', message: expect.stringMatching(/^the market remembers 3 tickets, its limit, none of them settled or expired/) } } });
    // A settled one is forgotten to make room (its receipt already counted); the released ones are all still taken.
    expect((await s.post('/v1/receipts', { receipt: receiptFor(s.p, issued[0]!, 1) })).status).toBe(200);
    expect((await s.ask()).status).toBe(200);
    expect((await s.post('/v1/receipts', { receipt: receiptFor(s.p, issued[1]!, 2) })).status).toBe(200);
    // Expired ones make room too.
    s.at(61_000);
    expect((await s.post('/v1/providers/heartbeat', heartbeatOf(s.p, { at: s.now() }))).status).toBe(200);
    expect((await s.ask()).status).toBe(200);
  });

  test('a receipt a day after its ticket expired is still counted (a gateway looks for one at its node for ~28 h); 30 h after expiry the ticket is forgotten', async () => {
    const s = await marketWithProvider({});
    const a = await s.ask();
    const b = await s.ask();
    expect([a.status, b.status]).toEqual([200, 200]);
    const hour = 60 * 60_000;
    s.at(25 * hour);
    expect((await s.post('/v1/providers/heartbeat', heartbeatOf(s.p, { at: s.now() }))).status).toBe(200);
    expect((await s.ask()).status).toBe(200); // (tickets are pruned as one is issued)
    expect((await s.post('/v1/receipts', { receipt: receiptFor(s.p, a.body, 1) })).status).toBe(200);
    s.at(31 * hour);
    expect((await s.post('/v1/providers/heartbeat', heartbeatOf(s.p, { at: s.now() }))).status).toBe(200);
    expect((await s.ask()).status).toBe(200); // (tickets are pruned as one is issued)
    expect(await s.post('/v1/receipts', { receipt: receiptFor(s.p, b.body, 2) })).toMatchObject({ status: 400, body: { error: { code: 'unknown_ticket' } } });
    expect((await s.get('/v1/totals')).body).toMatchObject({ receipts: 1 });
  });

  test('beyond maxTickets the oldest settled or expired ticket is forgotten: its receipt is then unknown_ticket, never counted twice', async () => {
    const s = await marketWithProvider({ maxOutstandingTickets: 2, maxTickets: 2 });
    const a = await s.ask();
    const lineA = receiptFor(s.p, a.body, 1);
    expect((await s.post('/v1/receipts', { receipt: lineA })).status).toBe(200);
    const b = await s.ask();
    expect(b.status).toBe(200);
    // A third ticket: a (settled) is forgotten, b (outstanding) is kept.
    expect((await s.ask()).status).toBe(200);
    expect(s.m.store.ticket(ticketOf(a.body).ticket_id)).toBeUndefined();
    expect(s.m.store.ticket(ticketOf(b.body).ticket_id)).toBeDefined();
    expect(await s.post('/v1/receipts', { receipt: lineA })).toMatchObject({ status: 400, body: { error: { code: 'unknown_ticket' } } });
    expect((await s.get('/v1/totals')).body).toMatchObject({ receipts: 1, cost_micro_usd: costOf(lineA).toString() });
    expect((await s.post('/v1/receipts', { receipt: receiptFor(s.p, b.body, 2) })).status).toBe(200);
  });
});

describe('receipts', () => {
  test('beyond maxReceipts the oldest records leave the lists; the totals stay exact; a settled ticket still knows its receipt (a retry is counted once, another receipt is a conflict)', async () => {
    const s = await marketWithProvider({ maxReceipts: 2 });
    const lines: string[] = [];
    const requests: string[] = [];
    for (let i = 0; i < 4; i++) {
      const g = await s.ask();
      requests.push(g.body.request_id);
      lines.push(receiptFor(s.p, g.body, i));
      expect((await s.post('/v1/receipts', { receipt: lines[i] })).status).toBe(200);
      // The receipt just settled can always be read back.
      expect((await s.get(`/v1/receipts/${g.body.request_id}`)).body).toMatchObject({ request_id: g.body.request_id, receipt: lines[i] });
    }
    expect(((await s.get('/v1/receipts')).body as any[]).map((r) => r.request_id)).toEqual(requests.slice(2));
    expect((await s.get(`/v1/receipts/${requests[0]}`)).body.error.code).toBe('not_found');
    const sum = lines.reduce((t, l) => t + costOf(l), 0n);
    const totals = { receipts: 4, cost_micro_usd: sum.toString(), by_provider: { [s.p.key.id]: { receipts: 4, cost_micro_usd: sum.toString() } }, by_model: { 'tiny/llama': { receipts: 4, cost_micro_usd: sum.toString() } } };
    expect((await s.get('/v1/totals')).body).toEqual(totals);
    // The first receipt's record is gone, its ticket is not: posted again it is a duplicate, not a new receipt.
    expect(await s.post('/v1/receipts', { receipt: lines[0] })).toMatchObject({ status: 200, body: { ok: true, request_id: requests[0] } });
    const other = JSON.parse(Buffer.from(JSON.parse(lines[0]!).payload, 'base64').toString('utf8'));
    const conflicting = serializeEnvelope(signReceipt(s.p.key, { ...other, finished_at: other.finished_at + 1 }));
    expect(await s.post('/v1/receipts', { receipt: conflicting })).toMatchObject({ status: 409, body: { error: { code: 'receipt_conflict' } } });
    expect((await s.get('/v1/totals')).body).toEqual(totals);
  });

  test('beyond maxTallyKeys a new provider\'s receipts are summed in by_provider_others, exact, also after a restart (s23 h4: the totals grew without end)', async () => {
    const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'market-tallies-')), 'market.db');
    const s = await start({ maxTallyKeys: 1 }, { file });
    const a = provider();
    const b = provider();
    for (const p of [a, b]) expect((await s.post('/v1/providers/register', registration(p))).status).toBe(200);
    const costs: bigint[] = [];
    for (const p of [a, b, b]) {
      const g = await s.post('/v1/tickets', { endpoint: 'chat/completions', model: 'tiny/llama', body_sha256: 'ab'.repeat(32), max_cost_micro_usd: '100000', providers: [p.key.id] });
      expect(g.body.provider).toBe(p.key.id);
      const line = receiptFor(p, g.body, costs.length);
      costs.push(costOf(line));
      expect((await s.post('/v1/receipts', { receipt: line })).status).toBe(200);
    }
    const all = costs.reduce((x, y) => x + y, 0n);
    const expected = {
      receipts: 3,
      cost_micro_usd: all.toString(),
      by_provider: { [a.key.id]: { receipts: 1, cost_micro_usd: costs[0]!.toString() } },
      by_model: { 'tiny/llama': { receipts: 3, cost_micro_usd: all.toString() } },
      by_provider_others: { receipts: 2, cost_micro_usd: (costs[1]! + costs[2]!).toString() },
    };
    expect((await s.get('/v1/totals')).body).toEqual(expected);
    await s.m.close();
    const again = await start({ maxTallyKeys: 1 }, { file });
    expect((await again.get('/v1/totals')).body).toEqual(expected);
  });

  test('maxReceiptBytes bounds the records kept by the size of their lines', async () => {
    const s = await marketWithProvider({});
    const g = await s.ask();
    const size = receiptFor(s.p, g.body, 0).length;
    const t = await marketWithProvider({ maxReceiptBytes: Math.floor(2.5 * size) });
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const grant = await t.ask();
      ids.push(grant.body.request_id);
      expect((await t.post('/v1/receipts', { receipt: receiptFor(t.p, grant.body, 0) })).status).toBe(200);
    }
    expect(((await t.get('/v1/receipts')).body as any[]).map((r) => r.request_id)).toEqual(ids.slice(1));
    expect((await t.get('/v1/totals')).body.receipts).toBe(3);
  });
});

describe('options', () => {
  test('the defaults, and limits that are not positive integers (or maxTickets below maxOutstandingTickets) are refused naming the limit', () => {
    expect(DEFAULT_MARKET_LIMITS).toEqual({ maxProviders: 1000, maxProviderModels: 10_000, maxContractChars: 16 * 1024 * 1024, staleProviderMs: 3_600_000, maxOutstandingTickets: 10_000, maxTickets: 100_000, maxTallyKeys: 10_000, maxReceipts: 20_000, maxReceiptBytes: 64 * 1024 * 1024 });
    const make = (limits: Record<string, unknown>) => () => createMarket({ seed: marketKey.seed, limits: limits as Partial<MarketLimits> });
    expect(make({ maxProviders: 0 })).toThrow(/^market: limits\.maxProviders must be a positive integer, got 0$/);
    expect(make({ maxReceipts: 1.5 })).toThrow(/limits\.maxReceipts must be a positive integer/);
    expect(make({ staleProviderMs: '60000' })).toThrow(/limits\.staleProviderMs must be a positive integer/);
    expect(make({ maxTickets: 5 })).toThrow(/limits\.maxTickets \(5\) must be at least limits\.maxOutstandingTickets \(10000\)/);
    expect(make({ maxProvider: 5 })).toThrow(/limits\.maxProvider is not a limit/);
  });
});
