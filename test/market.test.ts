// The development marketplace through its HTTP API (real fastify on 127.0.0.1, port 0, global
// fetch): registration checks, heartbeats, ticket issuance, receipt collection with real receipts
// from the serving core on the tiny model, totals.
import { computeCost } from '../attestation/money.ts';
import crypto from 'node:crypto';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { fromBase64, toBase64, toHex, utf8 } from '../attestation/bytes.ts';
import { canonicalize } from '../attestation/canonical-json.ts';
import { serializeEnvelope, signEnvelope, type DsseEnvelope } from '../attestation/dsse.ts';
import { RECEIPT_PAYLOAD_TYPE } from '../attestation/receipt.ts';
import { verifyTicket } from '../attestation/ticket-verify.ts';
import { verifyRequestContract } from '../attestation/request-contract.ts';
import { TicketGate } from '../src/dispatch/ticket-gate.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { REGISTRATION_PAYLOAD_TYPE, type RegisteredModel } from '../src/market/registration-payload.ts';
import { peerIdFromSeed } from '../src/p2p/peer-id.ts';
import { signCapacity } from '../src/p2p/capacity-protocol.ts';
import { InferService, type InferResponse } from '../src/serve/infer-service.ts';
import { PAID_ENDPOINTS } from '../src/serve/contract.ts';
import { TINY_PRICE, call, contractOf, heartbeatOf, provider, registration, TINY, type Provider } from './helpers/market-provider.ts';
import { stalledRequest } from './helpers/stalled-request.ts';
import { receiptPayload, signReceipt, signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { startServing, type Serving } from './helpers/serving.ts';

const marketKey = testKey();

const sha = (b: Uint8Array | string) => toHex(crypto.createHash('sha256').update(b).digest());

let market: Market;
let url: string;
const post = (path: string, body: unknown) => call(url, 'POST', path, body);
const get = (path: string) => call(url, 'GET', path);

beforeAll(async () => {
  market = createMarket({ seed: marketKey.seed, heartbeatIntervalMs: 1000 });
  ({ url } = await market.listen());
});
afterAll(async () => {
  await market?.close();
});

describe('market key', () => {
  test('GET /v1/market gives the public key, which is also the key id', async () => {
    const r = await get('/v1/market');
    expect(r).toEqual({ status: 200, body: { public_key: marketKey.id, key_id: marketKey.id } });
    expect(market.publicKey).toBe(marketKey.id);
  });

  test('unknown routes are 404 not_found in the error shape', async () => {
    expect(await get('/v1/nope')).toMatchObject({ status: 404, body: { error: { code: 'not_found' } } });
  });
});

describe('registration', () => {
  test('a good registration is accepted and listed', async () => {
    const p = provider();
    const r = await post('/v1/providers/register', registration(p));
    expect(r).toEqual({ status: 200, body: { registered: true, heartbeat_interval_ms: 1000 } });
    const list = (await get('/v1/providers')).body as any[];
    expect(list.find((x) => x.provider === p.key.id)).toMatchObject({ peer_id: p.peerId, addresses: ['/ip4/127.0.0.1/tcp/4101'], models: [TINY], price_version: p.prices.payload.version, last_seen: expect.any(Number), live: true });
  });

  test('a provider\'s request contracts are verified and listed as signed; its latest heartbeat\'s free slots and queue too', async () => {
    const p = provider();
    const contract = contractOf(p);
    expect((await post('/v1/providers/register', registration(p, { request_contracts: [contract] }))).status).toBe(200);
    const listed = () => ((get('/v1/providers?request_contracts=true') as Promise<{ body: any[] }>).then((r) => r.body.find((x) => x.provider === p.key.id)));
    const before = await listed();
    expect(before.request_contracts).toEqual([contract]);
    // Only when asked for: the listing routing reads for every request stays small.
    expect(((await get('/v1/providers')).body as any[]).find((x) => x.provider === p.key.id).request_contracts).toBeUndefined();
    expect(((await get('/v1/providers?request_contracts=false')).body as any[]).find((x) => x.provider === p.key.id).request_contracts).toBeUndefined();
    expect(await get('/v1/providers?request_contracts=yes')).toMatchObject({ status: 400, body: { error: { code: 'invalid_request', message: 'request_contracts: expected true or false' } } });
    expect(verifyRequestContract(before.request_contracts[0], { provider: p.key.id }).ok).toBe(true);
    expect(before.capacity).toBeUndefined();
    expect((await post('/v1/providers/heartbeat', heartbeatOf(p, { free_slots: 0 }))).status).toBe(200);
    expect((await listed()).capacity).toEqual({ at: expect.any(Number), models: [{ id: 'tiny/llama', free_slots: 0, queued: 0, queue_limit: 4 }] });
    // What is listed is the signed envelope alone: another key or a second signature sent along is not kept.
    const r = provider();
    const sent = { ...contractOf(r), endorsed_by: 'somebody', signatures: [...contractOf(r).signatures, { keyid: 'note', sig: Buffer.from('audited').toString('base64') }] };
    expect((await post('/v1/providers/register', registration(r, { request_contracts: [sent] }))).status).toBe(200);
    expect(((await get('/v1/providers?request_contracts=true')).body as any[]).find((x) => x.provider === r.key.id).request_contracts).toEqual([contractOf(r)]);
    // A heartbeat's free slots are at most the slots registered; its queue figures at most 2^32 − 1.
    const big = signCapacity({ seed: r.key.seed, providerId: r.key.id }, { price_version: r.prices.payload.version, attestation_tier: 'T1', accepting: true, models: [{ id: 'tiny/llama', context: 512, quantization: 'f32', tokens_per_second: 1, slots: 1, free_slots: 2 ** 53 - 1, queued: 2 ** 53 - 1, queue_limit: 2 ** 40 }] });
    expect((await post('/v1/providers/heartbeat', big)).status).toBe(200);
    expect(((await get('/v1/providers')).body as any[]).find((x) => x.provider === r.key.id).capacity.models).toEqual([{ id: 'tiny/llama', free_slots: TINY.slots, queued: 2 ** 32 - 1, queue_limit: 2 ** 32 - 1 }]);
    // A registration without contracts lists none.
    const q = provider();
    await post('/v1/providers/register', registration(q));
    expect(((await get('/v1/providers?request_contracts=true')).body as any[]).find((x) => x.provider === q.key.id).request_contracts).toBeUndefined();
  });

  test('a signature by another key is 401 signature_invalid', async () => {
    const p = provider();
    const r = await post('/v1/providers/register', registration(p, {}, testKey()));
    expect(r.status).toBe(401);
    expect(r.body.error.code).toBe('signature_invalid');
    // Signed by another key under its own key id: not the provider's signature either.
    const other = testKey();
    const env = registration(p);
    const forged = signEnvelope(REGISTRATION_PAYLOAD_TYPE, fromBase64(env.payload)!, { keyid: other.id, seed: other.seed });
    expect((await post('/v1/providers/register', forged)).body.error.code).toBe('signature_invalid');
  });

  const bad: [string, (p: Provider) => DsseEnvelope | unknown, RegExp][] = [
    ['a peer id that is not the PeerId of the key', (p) => registration(p, { peer_id: peerIdFromSeed(testKey().seed).toString() }), /^peer_id: .*is not the PeerId/],
    ['a price list signed for another provider', (p) => registration(p, { price_list: provider().prices.envelope }), /^price_list: does not verify/],
    ['a model the price list has no price for', (p) => registration(p, { models: [TINY, { ...TINY, id: 'big/model' }] }), /^price_list: has no price for models\[1\] "big\/model"/],
    ['a price version that is not the price list\'s', (p) => registration(p, { price_version: 'p-00000000000000000000000000000000' }), /^price_version: /],
    ['a stale issued_at', (p) => registration(p, { issued_at: Date.now() - 6 * 60_000 }), /^issued_at: .*5 minutes/],
    ['an issued_at in the future', (p) => registration(p, { issued_at: Date.now() + 6 * 60_000 }), /^issued_at: /],
    ['a bad model context', (p) => registration(p, { models: [{ ...TINY, context: 0 }] }), /models\[0\]\.context: /],
    // (its worst case, 4294967295 × (10^30 − 1) / 10^6, would not fit a ticket: every uncapped ticket of the model failed while it was picked)
    ['a context whose worst case at its rates no ticket can hold', (p) => registration(provider({ key: p.key, prices: [{ ...TINY_PRICE, input_per_mtok: '9'.repeat(30) }] }), { models: [{ ...TINY, context: 4294967295 }] }), /^models\[0\]\.context: at this model's rates one request's worst case .* is 34 digits of micro-USD, more than a ticket's hold can carry \(30\)$/],
    ['a bad multiaddr', (p) => registration(p, { addresses: ['/ip4/127.0.0.1/tcp/x'] }), /addresses\[0\]: not a multiaddr/],
    // Where a gateway dials the node: TCP to an IP or a DNS name, under this node's peer id if any.
    ['an address under another peer\'s id', (p) => registration(p, { addresses: [`/ip4/127.0.0.1/tcp/4101/p2p/${peerIdFromSeed(testKey().seed).toString()}`] }), /^registration addresses\[0\]: expected \/ip4\|ip6\|dns\|dns4\|dns6\/HOST\/tcp\/PORT, optionally \/p2p\/ with this peer_id$/],
    ['a socket on the dialler\'s own host', (p) => registration(p, { addresses: ['/unix/tmp%2Fnode.sock'] }), /^registration addresses\[0\]: expected /],
    ['a transport the node does not listen on', (p) => registration(p, { addresses: ['/ip4/127.0.0.1/tcp/4101/ws'] }), /^registration addresses\[0\]: expected /],
    ['a model id that is not one', (p) => registration(p, { models: [{ ...TINY, id: '__proto__' }] }), /^registration models\[0\]\.id: does not match/],
    ['a model id with a control character', (p) => registration(p, { models: [{ ...TINY, id: 'tiny/\u0000llama' }] }), /^registration models\[0\]\.id: does not match/],
    ['a quantization that is not a bucket', (p) => registration(p, { models: [{ ...TINY, quantization: 'Q4_K_M (imatrix)' }] }), /^registration models\[0\]\.quantization: does not match/],
    ['more slots than any runtime has (sums over providers must stay exact)', (p) => registration(p, { models: [{ ...TINY, slots: 2 ** 53 - 1 }] }), /^registration models\[0\]\.slots: expected 1 to 65535$/],
    ['a throughput past any hardware', (p) => registration(p, { models: [{ ...TINY, tokens_per_second: 1e308 }] }), /^registration models\[0\]\.tokens_per_second: expected a number from 0 to 1000000000$/],
    ['an endpoint a node does not sell', (p) => registration(p, { models: [{ ...TINY, endpoints: ['completions', 'images'] }] }), /^registration models\[0\]\.endpoints: expected 1 to 4 of chat\/completions, completions, responses, embeddings, none twice$/],
    ['an endpoint listed twice', (p) => registration(p, { models: [{ ...TINY, endpoints: ['completions', 'completions'] }] }), /^registration models\[0\]\.endpoints: expected 1 to 4 of/],
    ['no endpoints', (p) => registration(p, { models: [{ ...TINY, endpoints: [] }] }), /^registration models\[0\]\.endpoints: expected 1 to 4 of/],
    ['endpoints that are not a list', (p) => registration(p, { models: [{ ...TINY, endpoints: 'completions' }] }), /^registration models\[0\]\.endpoints: expected 1 to 4 of/],
    ['no addresses', (p) => registration(p, { addresses: [] }), /addresses: /],
    ['an unknown tier', (p) => registration(p, { attestation_tier: 'T9' }), /attestation_tier: /],
    ['an unknown field', (p) => registration(p, { extra: 1 } as never), /extra: unknown field/],
    ['another payload type', (p) => ({ ...registration(p), payloadType: 'application/vnd.service.pricelist.v1+json' }), /^payloadType: /],
    ['a body that is not an envelope', () => ({ hello: 1 }), /payloadType: missing/],
    ['a request contract signed by another key', (p) => registration(p, { request_contracts: [contractOf(p, { signer: testKey() })] }), /^request_contracts\[0\]: does not verify for provider [0-9a-f]{64} \(signature_invalid/],
    ['a request contract for a model it does not register', (p) => registration(p, { request_contracts: [contractOf(p, { models: ['tiny/llama', 'big/model'] })] }), /^request_contracts\[0\]: covers "big\/model", which the registration does not list/],
    ['two request contracts for one model', (p) => registration(p, { request_contracts: [contractOf(p), contractOf(p)] }), /^request_contracts\[1\]: covers "tiny\/llama", which another contract covers too/],
    ['request contracts that are not a list of envelopes', (p) => registration(p, { request_contracts: [{ payload: 1 }] }), /request_contracts\[0\]: /],
    ['too many request contracts', (p) => registration(p, { request_contracts: Array.from({ length: 5 }, () => contractOf(p)) }), /request_contracts: expected at most 4 envelopes .*got 5/],
    ['request contracts that are not a list', (p) => registration(p, { request_contracts: {} }), /request_contracts: expected a list of signed request contract envelopes/],
    ['a request contract payload over 64 KiB', (p) => registration(p, { request_contracts: [{ ...contractOf(p), payload: 'A'.repeat(64 * 1024 + 4) }] }), /request_contracts\[0\]: a payload of more than 65536/],
    ['a request contract signed under no keyid', (p) => registration(p, { request_contracts: [{ ...contractOf(p), signatures: [{ sig: contractOf(p).signatures[0]!.sig }] }] }), /request_contracts\[0\]: has no signature under keyid = the provider id/],
  ];
  test.each(bad)('%s is 400 registration_invalid naming the field', async (_name, make, message) => {
    const r = await post('/v1/providers/register', make(provider()));
    expect(r.status).toBe(400);
    expect(r.body.error.code).toBe('registration_invalid');
    expect(r.body.error.message).toMatch(message);
  });

  test('a body sent as another Content-Type is a malformed body: 400 with the route\'s code, not 415', async () => {
    for (const [route, code] of [['/v1/providers/register', 'registration_invalid'], ['/v1/tickets', 'invalid_request']] as const) {
      const r = await fetch(`${url}${route}`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: JSON.stringify(registration(provider())) });
      expect(r.status, route).toBe(400);
      expect(await r.json()).toEqual({ error: { code, message: 'body: expected JSON (Content-Type: application/json)' } });
    }
  });

  test('a body over the market\'s 4 MiB limit is 413 request_too_large (the gateway\'s code for it too)', async () => {
    const r = await fetch(`${url}/v1/tickets`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ pad: 'x'.repeat(5 << 20) }) });
    expect(r.status).toBe(413);
    expect(((await r.json()) as { error: { code: string } }).error.code).toBe('request_too_large');
  });

  test('a request whose body stops short is answered 408 and closed once its deadline has passed, not held for ever', async () => {
    const m = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)), requestTimeoutMs: 1000 });
    const { port, host } = await m.listen();
    try {
      const r = await stalledRequest(port, host, '/v1/tickets');
      expect(r.answer).toMatch(/^HTTP\/1\.1 408 /);
      expect(r.answer).toContain('"code":"request_timeout"');
      expect(r.ms).toBeLessThan(10_000);
    } finally {
      await m.close();
    }
  });

  test('an older registration does not replace the one in force', async () => {
    const p = provider();
    const now = Date.now();
    expect((await post('/v1/providers/register', registration(p, { issued_at: now }))).status).toBe(200);
    const r = await post('/v1/providers/register', registration(p, { issued_at: now - 1000, addresses: ['/ip4/10.0.0.1/tcp/1'] }));
    expect(r.body.error).toMatchObject({ code: 'registration_invalid', message: expect.stringMatching(/^issued_at: .*older/) });
    const listed = ((await get('/v1/providers')).body as any[]).find((x) => x.provider === p.key.id);
    expect(listed.addresses).toEqual(['/ip4/127.0.0.1/tcp/4101']);
  });

  test('a registration in force from the future (a node whose clock ran ahead) is replaced by one of the last minute, not kept until the market\'s clock catches up; an older one is still refused', async () => {
    const p = provider();
    const now = Date.now();
    expect((await post('/v1/providers/register', registration(p, { issued_at: now + 4 * 60_000 }))).status).toBe(200);
    expect((await post('/v1/providers/register', registration(p, { issued_at: now - 90_000, addresses: ['/ip4/10.0.0.2/tcp/1'] }))).body.error).toMatchObject({ code: 'registration_invalid' });
    const fixed = await post('/v1/providers/register', registration(p, { issued_at: Date.now(), addresses: ['/ip4/10.0.0.1/tcp/1'] }));
    expect(fixed.status).toBe(200);
    const listed = ((await get('/v1/providers')).body as any[]).find((x) => x.provider === p.key.id);
    expect(listed.addresses).toEqual(['/ip4/10.0.0.1/tcp/1']);
  });

  test('the registration in force sent again changes nothing; other contents under its issued_at are refused', async () => {
    const p = provider();
    const now = Date.now();
    const env = registration(p, { issued_at: now });
    expect((await post('/v1/providers/register', env)).status).toBe(200);
    expect((await post('/v1/providers/heartbeat', heartbeatOf(p, { accepting: false }))).status).toBe(200);
    const before = market.store.providers.get(p.key.id)!;
    const seen = before.last_seen;
    // A replay (anyone can resend a signed envelope) is acknowledged, and keeps the provider's state.
    expect((await post('/v1/providers/register', env)).status).toBe(200);
    const after = market.store.providers.get(p.key.id)!;
    expect(after.last_seen).toBe(seen);
    expect(after.capacity?.accepting).toBe(false);
    const other = await post('/v1/providers/register', registration(p, { issued_at: now, addresses: ['/ip4/10.0.0.9/tcp/1'] }));
    expect(other.body.error).toMatchObject({ code: 'registration_invalid', message: expect.stringMatching(/^issued_at: .*later issued_at/) });
  });

  test('an attestation tier above T1 is refused: this market verifies no evidence yet', async () => {
    for (const tier of ['T2', 'T3', 'T4']) {
      const r = await post('/v1/providers/register', registration(provider(), { attestation_tier: tier }));
      expect(r.body.error, tier).toMatchObject({ code: 'registration_invalid', message: expect.stringMatching(new RegExp(`^attestation_tier: ${tier} needs attestation evidence`)) });
    }
  });
});

describe('heartbeat', () => {
  test('a known provider gets 200; an unknown one 404 unknown_provider; a forged one 401', async () => {
    const p = provider();
    expect((await post('/v1/providers/heartbeat', heartbeatOf(p))).body.error.code).toBe('unknown_provider');
    await post('/v1/providers/register', registration(p));
    expect(await post('/v1/providers/heartbeat', heartbeatOf(p, { free_slots: 0 }))).toEqual({ status: 200, body: { ok: true } });
    expect(market.store.providers.get(p.key.id)?.capacity?.models[0]?.free_slots).toBe(0);
    const forged = signEnvelope(heartbeatOf(p).payloadType, fromBase64(heartbeatOf(p).payload)!, { keyid: p.key.id, seed: testKey().seed });
    expect(await post('/v1/providers/heartbeat', forged)).toMatchObject({ status: 401, body: { error: { code: 'signature_invalid' } } });
  });

  test('a heartbeat under another price version asks the node to register again (404)', async () => {
    const p = provider();
    await post('/v1/providers/register', registration(p));
    expect(await post('/v1/providers/heartbeat', heartbeatOf(p, { price_version: 'p-11111111111111111111111111111111' }))).toMatchObject({ status: 404, body: { error: { code: 'unknown_provider' } } });
  });

  test('a stale snapshot is 400 heartbeat_invalid naming `at`; a malformed body names the field', async () => {
    const p = provider();
    await post('/v1/providers/register', registration(p));
    expect((await post('/v1/providers/heartbeat', heartbeatOf(p, { at: Date.now() - 10 * 60_000 }))).body.error).toMatchObject({ code: 'heartbeat_invalid', message: expect.stringMatching(/^at: /) });
    expect((await post('/v1/providers/heartbeat', { payload: 'x', signatures: [] })).body.error).toMatchObject({ code: 'heartbeat_invalid', message: 'payloadType: missing' });
  });

  test('a node whose clock runs minutes fast (within registration\'s 5-minute bound) registers and heartbeats; beyond it both are refused', async () => {
    const p = provider();
    const fast = 3 * 60_000;
    expect((await post('/v1/providers/register', registration(p, { issued_at: Date.now() + fast }))).status).toBe(200);
    expect((await post('/v1/providers/heartbeat', heartbeatOf(p, { at: Date.now() + fast, accepting: false }))).status).toBe(200);
    expect(market.store.providers.get(p.key.id)?.capacity?.accepting).toBe(false);
    expect((await post('/v1/providers/heartbeat', heartbeatOf(p, { at: Date.now() + 10 * 60_000 }))).body.error).toMatchObject({ code: 'heartbeat_invalid', message: expect.stringMatching(/^at: .*5 minutes/) });
  });

  test('a snapshot from before the registration in force is 409 heartbeat_stale, and neither refreshes liveness nor replaces the capacity', async () => {
    const p = provider();
    const now = Date.now();
    const old = heartbeatOf(p, { at: now - 60_000, accepting: true });
    expect((await post('/v1/providers/register', registration(p, { issued_at: now }))).status).toBe(200);
    const seen = market.store.providers.get(p.key.id)!.last_seen;
    expect(await post('/v1/providers/heartbeat', old)).toMatchObject({ status: 409, body: { error: { code: 'heartbeat_stale', message: expect.stringMatching(/^at: \d+ is older than the registration in force/) } } });
    expect(market.store.providers.get(p.key.id)!.capacity).toBeUndefined();
    expect(market.store.providers.get(p.key.id)!.last_seen).toBe(seen);
  });

  test('after the node\'s clock steps back, its heartbeats are 409 heartbeat_stale (not a silent 200); a registration with a later issued_at makes them count again', async () => {
    // A market clock of its own, so liveness can be read at chosen times.
    let clock = Date.now();
    const m = createMarket({ seed: marketKey.seed, heartbeatIntervalMs: 1000, now: () => clock });
    const base = (await m.listen()).url;
    try {
      const p = provider();
      const t0 = clock;
      const listed = async () => ((await call(base, 'GET', '/v1/providers')).body as any[]).find((x) => x.provider === p.key.id);
      expect((await call(base, 'POST', '/v1/providers/register', registration(p, { issued_at: t0 }))).status).toBe(200);
      clock = t0 + 10_000;
      expect(await call(base, 'POST', '/v1/providers/heartbeat', heartbeatOf(p, { at: t0 + 10_000, free_slots: 0 }))).toEqual({ status: 200, body: { ok: true } });
      // The node's clock steps back 4 s: its next snapshots are older than the one accepted.
      clock = t0 + 11_000;
      for (const at of [t0 + 7_000, t0 + 10_000]) {
        const r = await call(base, 'POST', '/v1/providers/heartbeat', heartbeatOf(p, { at, free_slots: 1 }));
        expect(r, String(at - t0)).toMatchObject({ status: 409, body: { error: { code: 'heartbeat_stale', message: expect.stringMatching(/^at: \d+ is not newer than the last accepted snapshot \(at \d+\)/) } } });
      }
      expect(m.store.providers.get(p.key.id)!.capacity).toMatchObject({ at: t0 + 10_000, models: [{ id: 'tiny/llama', free_slots: 0 }] });
      clock = t0 + 14_000; // more than 3 intervals after the last accepted heartbeat
      expect((await listed()).live).toBe(false);
      // It registers again (issued_at from its stepped-back clock, still later than the first) and its heartbeats count.
      expect((await call(base, 'POST', '/v1/providers/register', registration(p, { issued_at: t0 + 8_000 }))).status).toBe(200);
      expect(await call(base, 'POST', '/v1/providers/heartbeat', heartbeatOf(p, { at: t0 + 9_000, free_slots: 1 }))).toEqual({ status: 200, body: { ok: true } });
      expect(m.store.providers.get(p.key.id)!.capacity).toMatchObject({ at: t0 + 9_000, models: [{ id: 'tiny/llama', free_slots: 1 }] });
      clock = t0 + 16_000;
      expect(await call(base, 'POST', '/v1/providers/heartbeat', heartbeatOf(p, { at: t0 + 11_000 }))).toEqual({ status: 200, body: { ok: true } });
      expect(await listed()).toMatchObject({ live: true, last_seen: t0 + 16_000 });
      // Listed since its first registration: the second does not move it (the catalog's `created`, `sort=listed`).
      expect((await listed()).registered_at).toBe(t0);
    } finally {
      await m.close();
    }
  });
});

describe('tickets', () => {
  // A market of its own, so providers registered by other tests do not compete.
  let m: Market;
  let base: string;
  let offset = 0;
  const p = provider();
  const body = utf8('{"model":"tiny/llama"}');
  beforeAll(async () => {
    m = createMarket({ seed: marketKey.seed, heartbeatIntervalMs: 5000, now: () => Date.now() + offset });
    ({ url: base } = await m.listen());
    expect((await call(base, 'POST', '/v1/providers/register', registration(p))).status).toBe(200);
  });
  afterAll(async () => {
    await m?.close();
  });
  const ask = (over: Record<string, unknown> = {}) => call(base, 'POST', '/v1/tickets', { endpoint: 'chat/completions', model: 'tiny/llama', body_sha256: sha(body), ...over });

  test('a ticket signed by the market for a live provider, with the worst-case hold at the model context', async () => {
    const r = await ask({ routing: { min_context: 256, max_wait_ms: 500, quantization: 'F32' }, account: 'acct-7' });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ request_id: expect.stringMatching(/^[A-Za-z0-9._:-]+$/), provider: p.key.id, peer_id: p.peerId, addresses: ['/ip4/127.0.0.1/tcp/4101'], price_version: p.prices.payload.version });
    const v = verifyTicket(r.body.ticket, { marketplaceKeys: [{ publicKey: m.publicKey }], provider: p.key.id, body });
    expect(v.ok).toBe(true);
    if (!v.ok) return;
    const t = v.value.payload;
    // ceil(512 × max(150000, 600000) / 10^6) = 308
    expect(t).toMatchObject({ endpoint: 'chat/completions', model: 'tiny/llama', price_version: p.prices.payload.version, max_cost_micro_usd: '308', account: 'acct-7', request_id: r.body.request_id, routing: { min_context: 256, max_wait_ms: 500, quantization: 'f32' } });
    expect(t.ticket_id).toMatch(/^[A-Za-z0-9._:-]+$/);
    expect(t.expires_at - t.issued_at).toBe(60_000);
  });

  test('the hold is max_cost_micro_usd when given; request_id is passed through; ids are fresh each time', async () => {
    const a = await ask({ max_cost_micro_usd: '1234', request_id: 'my-req.1' });
    const b = await ask();
    const pa = JSON.parse(Buffer.from(a.body.ticket.payload, 'base64').toString('utf8'));
    const pb = JSON.parse(Buffer.from(b.body.ticket.payload, 'base64').toString('utf8'));
    expect(pa).toMatchObject({ max_cost_micro_usd: '1234', request_id: 'my-req.1' });
    expect(pb.ticket_id).not.toBe(pa.ticket_id);
    expect(pb.request_id).not.toBe(pa.request_id);
  });

  test('model not found is 404; price ceilings 403; routing no provider meets, or a provider not accepting, 503 no_provider', async () => {
    expect(await ask({ model: 'no/such' })).toMatchObject({ status: 404, body: { error: { code: 'model_not_found' } } });
    const r = await ask({ routing: { min_context: 100_000 } });
    expect(r).toMatchObject({ status: 503, body: { error: { code: 'no_provider', message: expect.stringMatching(/context 512 is below 100000/) } } });
    // A price ceiling every provider is above is refused as the spec says: 403 before any hold.
    expect(await ask({ routing: { max_output_price_micro_usd_per_mtok: '1000' } })).toMatchObject({ status: 403, body: { error: { code: 'price_ceiling_exceeded' } } });
    expect(await ask({ routing: { max_input_price_micro_usd_per_mtok: '1' } })).toMatchObject({ status: 403, body: { error: { code: 'price_ceiling_exceeded' } } });
    // The representative-request ceiling (1,000 input + 1,000 output tokens at the provider's rates).
    expect(await ask({ routing: { max_request_price_micro_usd: '1' } })).toMatchObject({ status: 403, body: { error: { code: 'price_ceiling_exceeded', message: expect.stringMatching(/representative request/) } } });
    // A price ceiling together with another unmet control is still "no provider".
    expect((await ask({ routing: { max_output_price_micro_usd_per_mtok: '1000', min_context: 100_000 } })).body.error.code).toBe('no_provider');
    expect((await ask({ routing: { min_attestation_tier: 'T3' } })).body.error.code).toBe('no_provider');
    expect((await call(base, 'POST', '/v1/providers/heartbeat', heartbeatOf(p, { accepting: false }))).status).toBe(200);
    expect((await ask()).body.error.code).toBe('no_provider');
    expect((await call(base, 'POST', '/v1/providers/heartbeat', heartbeatOf(p, { accepting: true }))).status).toBe(200);
    expect((await ask()).status).toBe(200);
  });

  test('a model sold for some endpoints only (no chat template) is ticketed for those; another is 404 model_not_found saying what it is sold for', async () => {
    const BASE = { ...TINY, id: 'base/model', endpoints: ['completions', 'embeddings'] as RegisteredModel['endpoints'] };
    const b = provider({ models: [BASE], prices: [{ ...TINY_PRICE, model: 'base/model' }] });
    expect((await call(base, 'POST', '/v1/providers/register', registration(b))).status).toBe(200);
    const listed = ((await call(base, 'GET', '/v1/providers')).body as { provider: string; models: unknown[] }[]).find((x) => x.provider === b.key.id);
    expect(listed?.models).toEqual([BASE]);
    for (const endpoint of ['chat/completions', 'responses']) {
      expect(await ask({ endpoint, model: 'base/model' })).toMatchObject({ status: 404, body: { error: { code: 'model_not_found', message: `no registered provider serves ${endpoint} for model "base/model" (it is sold for completions, embeddings only)` } } });
    }
    for (const endpoint of ['completions', 'embeddings']) {
      const r = await ask({ endpoint, model: 'base/model' });
      expect([r.status, r.body.provider], endpoint).toEqual([200, b.key.id]);
    }
    // A model without `endpoints` is sold for every one.
    expect((await ask({ endpoint: 'responses' })).status).toBe(200);
  });

  test('a bad request is 400 invalid_request naming the field', async () => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ body_sha256: undefined }, /^body_sha256: missing$/],
      [{ body_sha256: 'abc' }, /^body_sha256: /],
      [{ routing: { min_context: 'big' } }, /^routing\.min_context: /],
      [{ routing: { teleport: true } }, /^routing\.teleport: unknown field/],
      [{ max_cost_micro_usd: '-1' }, /^max_cost_micro_usd: /],
      [{ request_id: 'has space' }, /^request_id: /],
      [{ endpoint: 'Chat' }, /^endpoint: /],
      [{ surprise: 1 }, /^surprise: unknown field$/],
      [{ model: 7 }, /^model: /],
    ];
    for (const [over, message] of cases) {
      const r = await ask(over);
      expect(r.status, JSON.stringify(over)).toBe(400);
      expect(r.body.error.code).toBe('invalid_request');
      expect(r.body.error.message).toMatch(message);
    }
  });

  test('an endpoint nodes take no ticket for is 400 invalid_request naming `endpoint`, and nothing is held', async () => {
    const held = m.store.outstandingTickets(Date.now());
    for (const endpoint of ['nope', 'tokenize', 'count_tokens', 'images/generations', 'chat/completions/x']) {
      const r = await ask({ endpoint });
      expect(r, endpoint).toMatchObject({ status: 400, body: { error: { code: 'invalid_request', message: expect.stringMatching(/^endpoint: ".*" is not one nodes take tickets for \(chat\/completions, completions, responses, embeddings\)$/) } } });
    }
    expect(m.store.outstandingTickets(Date.now())).toBe(held);
    // Every endpoint the gateway pays for is one the market tickets.
    for (const endpoint of PAID_ENDPOINTS) expect((await ask({ endpoint })).status, endpoint).toBe(200);
    expect(m.store.outstandingTickets(Date.now())).toBe(held + PAID_ENDPOINTS.length);
  });

  test('a provider silent for more than 3 heartbeat intervals is not live: 503 no_provider', async () => {
    offset = 16_000; // more than 3 intervals later, no heartbeat
    try {
      expect(await ask()).toMatchObject({ status: 503, body: { error: { code: 'no_provider', message: expect.stringMatching(/none is live/) } } });
      expect(((await call(base, 'GET', '/v1/providers')).body as any[])[0].live).toBe(false);
    } finally {
      offset = 0;
    }
  });

  test('between providers, the one with free slots gets the ticket', async () => {
    const q = provider();
    expect((await call(base, 'POST', '/v1/providers/register', registration(q))).status).toBe(200);
    await call(base, 'POST', '/v1/providers/heartbeat', heartbeatOf(p, { free_slots: 0 }));
    for (let i = 0; i < 3; i++) expect((await ask()).body.provider).toBe(q.key.id);
    await call(base, 'POST', '/v1/providers/heartbeat', heartbeatOf(q, { free_slots: 0 }));
    await call(base, 'POST', '/v1/providers/heartbeat', heartbeatOf(p, { free_slots: 1 }));
    expect((await ask()).body.provider).toBe(p.key.id);
    // X-Service-Prefer-Providers: the list's order decides, and nobody outside it is chosen.
    expect((await ask({ providers: [q.key.id, p.key.id] })).body.provider).toBe(q.key.id);
    expect((await ask({ providers: [p.key.id] })).body.provider).toBe(p.key.id);
    expect(await ask({ providers: [testKey().id] })).toMatchObject({ status: 503, body: { error: { code: 'no_provider' } } });
    expect(await ask({ providers: ['nothex'] })).toMatchObject({ status: 400, body: { error: { code: 'invalid_request' } } });
  });
});

describe('receipts from a real serving core', () => {
  let serving: Serving;
  let service: InferService;
  let m: Market;
  let base: string;
  const node = testKey();
  const nodeProvider = provider({ key: node });

  beforeAll(async () => {
    m = createMarket({ seed: marketKey.seed });
    ({ url: base } = await m.listen());
    serving = await startServing({ nodeSeed: node.seed, nodeId: node.id, marketId: m.publicKey });
    // The helper serves under price version "p1"; the market issues tickets under the version of the
    // price list the node registered, so serve the same model under that version.
    const gate = new TicketGate({ db: serving.db, marketplaceKeys: [{ publicKey: m.publicKey }], providerId: node.id });
    service = new InferService({ log: serving.log, gate, models: new Map([[serving.model.id, serving.model]]), priceVersion: nodeProvider.prices.payload.version });
    expect((await call(base, 'POST', '/v1/providers/register', registration(nodeProvider, { models: [{ ...TINY, context: serving.adapter.info.contextLength }] }))).status).toBe(200);
  });
  afterAll(async () => {
    await serving?.close();
    await m?.close();
  });

  async function serve(ticket: DsseEnvelope, bytes: Uint8Array): Promise<Record<string, any>> {
    let trailer: Record<string, any> = {};
    const res: InferResponse = { head: async () => undefined, data: async () => undefined, trailer: async (t) => void (trailer = t) };
    await service.handle({ head: { endpoint: 'chat/completions', ticket }, body: bytes, signal: new AbortController().signal }, res);
    return trailer;
  }

  async function paidRequest(over: Record<string, unknown> = {}): Promise<{ line: string; requestId: string }> {
    const bytes = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hello' }], max_tokens: 8, seed: 3 }));
    const t = await call(base, 'POST', '/v1/tickets', { endpoint: 'chat/completions', model: 'tiny/llama', body_sha256: sha(bytes), ...over });
    expect(t.status).toBe(200);
    const trailer = await serve(t.body.ticket, bytes);
    expect(trailer.status, JSON.stringify(trailer)).toBe('completed');
    return { line: trailer.receipt as string, requestId: t.body.request_id };
  }

  test('a receipt for a market-issued ticket is collected once, however often it is posted', async () => {
    const { line, requestId } = await paidRequest({ max_cost_micro_usd: '100000' });
    const cost = JSON.parse(Buffer.from(JSON.parse(line).payload, 'base64').toString('utf8')).cost_micro_usd as string;
    const first = await call(base, 'POST', '/v1/receipts', { receipt: line });
    expect(first).toEqual({ status: 200, body: { ok: true, request_id: requestId, cost_micro_usd: cost } });
    expect(await call(base, 'POST', '/v1/receipts', { receipt: line })).toEqual(first);
    const list = (await call(base, 'GET', '/v1/receipts')).body as any[];
    expect(list).toEqual([{ request_id: requestId, provider: node.id, model: 'tiny/llama', status: 'completed', cost_micro_usd: cost, seq: expect.any(String) }]);
    const one = await call(base, 'GET', `/v1/receipts/${requestId}`);
    expect(one.body).toMatchObject({ request_id: requestId, provider: node.id, receipt: line, cost_micro_usd: cost });
    expect((await call(base, 'GET', '/v1/receipts/req-none')).status).toBe(404);
    expect((await call(base, 'GET', '/v1/totals')).body).toEqual({ receipts: 1, cost_micro_usd: cost, by_provider: { [node.id]: { receipts: 1, cost_micro_usd: cost } }, by_model: { 'tiny/llama': { receipts: 1, cost_micro_usd: cost } } });
  });

  test('extra signatures on a receipt are dropped: it is stored as the node\'s line, and the node\'s line is a duplicate of it, not a conflict', async () => {
    for (const junkFirst of [false, true]) {
      const { line, requestId } = await paidRequest({ max_cost_micro_usd: '100000' });
      const env = JSON.parse(line) as DsseEnvelope;
      // A signature by a key that is not the provider's is ignored by the verifier (one under the
      // provider's keyid that does not verify is refused: signature_invalid).
      const junk = [{ keyid: '11'.repeat(32), sig: toBase64(new Uint8Array(64).fill(7)) }];
      const padded = { ...env, signatures: junkFirst ? [...junk, ...env.signatures] : [...env.signatures, ...junk] };
      const first = await call(base, 'POST', '/v1/receipts', { receipt: JSON.stringify(padded) });
      expect(first.status).toBe(200);
      expect((await call(base, 'GET', `/v1/receipts/${requestId}`)).body).toMatchObject({ receipt: line });
      expect(await call(base, 'POST', '/v1/receipts', { receipt: line })).toEqual(first);
    }
  });

  test('a copy of the line under another keyid, or in URL-safe unpadded base64, is stored as the node\'s line: the node\'s line is then a duplicate, not a conflict', async () => {
    const variants = [
      (l: string, id: string) => l.replace(`"keyid":"${id}"`, '"keyid":"not-the-provider"'),
      (l: string) => {
        const env = JSON.parse(l) as DsseEnvelope;
        const url = (b: string) => b.replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
        return JSON.stringify({ ...env, payload: url(env.payload), signatures: env.signatures.map((g) => ({ ...g, sig: url(g.sig) })) });
      },
    ];
    for (const variant of variants) {
      const { line, requestId } = await paidRequest({ max_cost_micro_usd: '100000' });
      const first = await call(base, 'POST', '/v1/receipts', { receipt: variant(line, node.id) });
      expect(first.status, JSON.stringify(first.body)).toBe(200);
      expect((await call(base, 'GET', `/v1/receipts/${requestId}`)).body).toMatchObject({ receipt: line });
      expect(await call(base, 'POST', '/v1/receipts', { receipt: line })).toEqual(first);
    }
  });

  test('the worst-case hold covers a real request', async () => {
    const { line } = await paidRequest();
    const r = JSON.parse(Buffer.from(JSON.parse(line).payload, 'base64').toString('utf8'));
    expect(r.hold_micro_usd).toBe('308');
    expect((await call(base, 'POST', '/v1/receipts', { receipt: line })).status).toBe(200);
  });

  test('a tampered receipt gets the verifier\'s code; a receipt for a ticket this market never issued is unknown_ticket', async () => {
    const { line } = await paidRequest({ max_cost_micro_usd: '100000' });
    const env = JSON.parse(line) as DsseEnvelope;
    const payload = JSON.parse(Buffer.from(env.payload, 'base64').toString('utf8'));
    const tampered = { ...env, payload: toBase64(utf8(canonicalize({ ...payload, cost_micro_usd: '1' }))) };
    expect(await call(base, 'POST', '/v1/receipts', { receipt: JSON.stringify(tampered) })).toMatchObject({ status: 400, body: { error: { code: 'signature_invalid' } } });
    // Re-signed by the node with a wrong cost: the signature holds, the arithmetic does not.
    const wrongCost = signEnvelope(RECEIPT_PAYLOAD_TYPE, utf8(canonicalize({ ...payload, cost_micro_usd: String(BigInt(payload.cost_micro_usd) + 1n) })), { keyid: node.id, seed: node.seed });
    expect((await call(base, 'POST', '/v1/receipts', { receipt: serializeEnvelope(wrongCost) })).body.error.code).toBe('cost_mismatch');
    expect((await call(base, 'POST', '/v1/receipts', { receipt: 'not json' })).body.error.code).toBe('envelope_not_json');
    expect((await call(base, 'POST', '/v1/receipts', { nope: 1 })).body.error).toMatchObject({ code: 'invalid_request', message: 'receipt: missing' });

    // A ticket signed with the market's key but never issued by it: the node serves it, the market refuses the receipt.
    const bytes = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }));
    const foreign = signTicket(marketKey, ticketPayload(node.id, { price_version: nodeProvider.prices.payload.version, body_sha256: sha(bytes), max_cost_micro_usd: '100000' }));
    const trailer = await serve(foreign, bytes);
    expect(trailer.status).toBe('completed');
    expect(await call(base, 'POST', '/v1/receipts', { receipt: trailer.receipt })).toMatchObject({ status: 400, body: { error: { code: 'unknown_ticket' } } });
  });

  test('a second, different receipt for the same ticket is 409 receipt_conflict; one for another request is receipt_ticket_mismatch', async () => {
    const { line } = await paidRequest({ max_cost_micro_usd: '100000' });
    expect((await call(base, 'POST', '/v1/receipts', { receipt: line })).status).toBe(200);
    const collected = (await call(base, 'GET', '/v1/totals')).body.receipts as number;
    const payload = JSON.parse(Buffer.from(JSON.parse(line).payload, 'base64').toString('utf8'));
    const resign = (p: object) => serializeEnvelope(signEnvelope(RECEIPT_PAYLOAD_TYPE, utf8(canonicalize(p)), { keyid: node.id, seed: node.seed }));
    expect(await call(base, 'POST', '/v1/receipts', { receipt: resign({ ...payload, finished_at: payload.finished_at + 1 }) })).toMatchObject({ status: 409, body: { error: { code: 'receipt_conflict' } } });
    expect(await call(base, 'POST', '/v1/receipts', { receipt: resign({ ...payload, request_id: 'req-other' }) })).toMatchObject({ status: 400, body: { error: { code: 'receipt_ticket_mismatch' } } });
    // A receipt for another body than the one the ticket admitted.
    expect(await call(base, 'POST', '/v1/receipts', { receipt: resign({ ...payload, request_sha256: 'f'.repeat(64) }) })).toMatchObject({
      status: 400,
      body: { error: { code: 'receipt_ticket_mismatch', message: expect.stringContaining(`request_sha256 is ${'f'.repeat(64)}, the ticket's body hash is ${payload.request_sha256}`) } },
    });
    const totals = (await call(base, 'GET', '/v1/totals')).body;
    expect(totals.receipts).toBe(collected); // neither counted
  });

  test('a receipt for the ticket that names another hold (billing above the ticket\'s), endpoint or model is receipt_ticket_mismatch; nothing counted', async () => {
    const { expectedCost } = await import('../attestation/receipt.ts');
    const resign = (p: object) => serializeEnvelope(signEnvelope(RECEIPT_PAYLOAD_TYPE, utf8(canonicalize(p)), { keyid: node.id, seed: node.seed }));
    for (const change of [
      (p: Record<string, any>) => { const q = { ...p, hold_micro_usd: '1000000', usage: { ...p.usage, output_tokens: p.usage.output_tokens + 1000 } }; return { ...q, cost_micro_usd: expectedCost(q as never).toString() }; },
      (p: Record<string, any>) => ({ ...p, endpoint: 'completions' }),
      (p: Record<string, any>) => ({ ...p, model: 'tiny/other' }),
      (p: Record<string, any>) => ({ ...p, price: { ...p.price, version: 'p-another-version' } }),
    ]) {
      const { line } = await paidRequest({ max_cost_micro_usd: '500' });
      const payload = JSON.parse(Buffer.from(JSON.parse(line).payload, 'base64').toString('utf8'));
      const before = (await call(base, 'GET', '/v1/totals')).body;
      const r = await call(base, 'POST', '/v1/receipts', { receipt: resign(change(payload)) });
      expect(r, String(change)).toMatchObject({ status: 400, body: { error: { code: 'receipt_ticket_mismatch' } } });
      expect((await call(base, 'GET', '/v1/totals')).body).toEqual(before);
    }
  });

  test('a price list with per-unit rates: the ticket states them, a receipt at the signed rates settles, one that leaves them out is refused (s29 review: the market dropped them)', async () => {
    const model = 'units/model';
    const priced = provider({ models: [{ ...TINY, id: model }], prices: [{ ...TINY_PRICE, model, per_unit: { images: '5' } } as never] });
    expect((await call(base, 'POST', '/v1/providers/register', registration(priced))).status).toBe(200);
    const body = sha('{}');
    const t = await call(base, 'POST', '/v1/tickets', { endpoint: 'chat/completions', model, body_sha256: body });
    expect(t.status).toBe(200);
    expect(t.body.rates).toEqual({ input_per_mtok: TINY_PRICE.input_per_mtok, output_per_mtok: TINY_PRICE.output_per_mtok, per_unit: { images: '5' } });
    const tp = JSON.parse(Buffer.from(t.body.ticket.payload, 'base64').toString('utf8'));
    const usage = { input_tokens: 10, output_tokens: 5 };
    const receipt = (rates: Record<string, unknown>) => {
      const cost = computeCost(usage, { input_per_mtok: BigInt(TINY_PRICE.input_per_mtok), output_per_mtok: BigInt(TINY_PRICE.output_per_mtok) }).toString();
      const payload = receiptPayload(priced.key, 0, { ticket_id: tp.ticket_id, request_id: tp.request_id, model, endpoint: 'chat/completions', request_sha256: body, price: { version: tp.price_version, rates }, usage, usage_runtime: {}, cost_micro_usd: cost, hold_micro_usd: tp.max_cost_micro_usd, status: 'completed' } as never);
      return serializeEnvelope(signReceipt(priced.key, payload));
    };
    const without = await call(base, 'POST', '/v1/receipts', { receipt: receipt({ input_per_mtok: TINY_PRICE.input_per_mtok, output_per_mtok: TINY_PRICE.output_per_mtok }) });
    expect(without).toMatchObject({ status: 400, body: { error: { code: 'receipt_ticket_mismatch' } } });
    const honest = await call(base, 'POST', '/v1/receipts', { receipt: receipt({ input_per_mtok: TINY_PRICE.input_per_mtok, output_per_mtok: TINY_PRICE.output_per_mtok, per_unit: { images: '5' } }) });
    expect(honest).toMatchObject({ status: 200, body: { ok: true, request_id: tp.request_id } });
  });

  test('a receipt under the ticket\'s price version but at made-up rates is refused, and nothing is counted', async () => {
    const { line } = await paidRequest({ max_cost_micro_usd: '100000' });
    const payload = JSON.parse(Buffer.from(JSON.parse(line).payload, 'base64').toString('utf8'));
    // Output billed at 100× the registered rate, with the cost recomputed so the arithmetic holds.
    const rates = { ...payload.price.rates, output_per_mtok: String(BigInt(payload.price.rates.output_per_mtok) * 100n) };
    const cost = computeCost(payload.usage, { input_per_mtok: BigInt(rates.input_per_mtok), output_per_mtok: BigInt(rates.output_per_mtok) });
    expect(cost <= BigInt(payload.hold_micro_usd)).toBe(true);
    const inflated = serializeEnvelope(signEnvelope(RECEIPT_PAYLOAD_TYPE, utf8(canonicalize({ ...payload, price: { ...payload.price, rates }, cost_micro_usd: cost.toString() })), { keyid: node.id, seed: node.seed }));
    const before = (await call(base, 'GET', '/v1/totals')).body;
    const r = await call(base, 'POST', '/v1/receipts', { receipt: inflated });
    expect(r).toMatchObject({ status: 400, body: { error: { code: 'receipt_ticket_mismatch', message: expect.stringMatching(/rates .* are not those of price version/) } } });
    expect((await call(base, 'GET', '/v1/totals')).body).toEqual(before);
    expect((await call(base, 'POST', '/v1/receipts', { receipt: line })).status).toBe(200); // the honest one still settles
  });
});

test('a refused receipt is a warning in the market\'s log, with its code (money disputed); a bad request elsewhere is not', async () => {
  const { default: pino } = await import('pino');
  const lines: { level: number; msg: string; code?: string }[] = [];
  const logger = pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  const m = createMarket({ seed: testKey().seed, logger });
  try {
    const { url } = await m.listen();
    expect((await call(url, 'POST', '/v1/receipts', { receipt: 'not json' })).body.error.code).toBe('envelope_not_json');
    expect((await call(url, 'POST', '/v1/tickets', { endpoint: 'chat/completions', model: 'none', body_sha256: '00'.repeat(32) })).status).toBe(404);
    expect(lines.filter((l) => l.msg === 'receipt refused')).toEqual([expect.objectContaining({ level: 40, code: 'envelope_not_json' })]);
  } finally {
    await m.close();
  }
});
