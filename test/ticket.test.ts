import { describe, expect, test } from 'vitest';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { sha256 } from '../attestation/hash.ts';
import { verifyTicket } from '../attestation/ticket-verify.ts';
import { signReceipt, signTicket, testKey, ticketPayload } from './helpers/receipts.ts';

const market = testKey();
const provider = testKey();
const body = utf8('{"model":"tiny/llama"}');
const keys = [{ publicKey: market.id }];

const codeOf = (env: unknown, extra: Record<string, unknown> = {}) => {
  const r = verifyTicket(env as never, { marketplaceKeys: keys, provider: provider.id, body, ...extra });
  return r.ok ? 'ok' : r.error.code;
};

describe('verifyTicket', () => {
  test('a fresh ticket for this provider and body verifies', () => {
    const p = ticketPayload(provider.id);
    const r = verifyTicket(signTicket(market, p), { marketplaceKeys: keys, provider: provider.id, body });
    expect(r).toMatchObject({ ok: true, value: { payload: p, keyid: market.id } });
    // The body may be given as its SHA-256 too.
    expect(codeOf(signTicket(market, p), { body: toHex(sha256(body)) })).toBe('ok');
  });
  test('forged: signed by someone else', () => expect(codeOf(signTicket(testKey(), ticketPayload(provider.id)))).toBe('unknown_key'));
  test('forged: keyid of the marketplace, signature of someone else', () => {
    const env = signTicket(testKey(), ticketPayload(provider.id));
    env.signatures[0]!.keyid = market.id;
    expect(codeOf(env)).toBe('signature_invalid');
  });
  test('expired, with skew', () => {
    const now = Date.now();
    const p = ticketPayload(provider.id, { issued_at: now - 120_000, expires_at: now - 31_000 });
    expect(codeOf(signTicket(market, p))).toBe('ticket_expired');
    expect(codeOf(signTicket(market, { ...p, expires_at: now - 29_000 }))).toBe('ok');
    expect(codeOf(signTicket(market, { ...p, expires_at: now - 1000 }), { skewMs: 0 })).toBe('ticket_expired');
  });
  test('options that throw when read are options_invalid, not the ticket\'s fault (as verifyReceipt has it: s23 h3)', () => {
    const fresh = signTicket(market, ticketPayload(provider.id));
    const hostile = new Proxy({}, { ownKeys() { throw new Error('boom'); } });
    expect(verifyTicket(fresh, hostile as never)).toMatchObject({ ok: false, error: { code: 'options_invalid', message: expect.stringContaining('boom') } });
  });
  test('options that would make every window pass (a NaN or infinite clock or skew, a string skew) are options_invalid, never ok', () => {
    const now = Date.now();
    const expired = signTicket(market, ticketPayload(provider.id, { issued_at: now - 120_000, expires_at: now - 60_000 }));
    const early = signTicket(market, ticketPayload(provider.id, { issued_at: now + 600_000, expires_at: now + 660_000 }));
    for (const extra of [{ skewMs: NaN }, { skewMs: Infinity }, { skewMs: -1 }, { now: NaN }, { now: Infinity }, { skewMs: '900000' }, { now: String(now) }]) {
      expect(codeOf(expired, extra), JSON.stringify(extra)).toBe('options_invalid');
      expect(codeOf(early, extra), JSON.stringify(extra)).toBe('options_invalid');
    }
    const fresh = signTicket(market, ticketPayload(provider.id));
    const other = testKey(); // a ticket for another provider must not pass for want of a pin
    const forOther = signTicket(market, ticketPayload(other.id));
    for (const opts of [{ marketplaceKeys: keys, provider: undefined }, { marketplaceKeys: keys, providerId: provider.id }, { marketplaceKeys: keys, provder: provider.id }, { marketplaceKeys: keys, provider: provider.id, body: undefined }, { marketplaceKeys: keys, provider: provider.id, bdy: body }]) {
      const r = verifyTicket(forOther, opts as never);
      expect(r.ok ? 'ok' : r.error.code, Object.keys(opts).join()).toBe('options_invalid');
    }
    for (const opts of [undefined, null, 'keys', { marketplaceKeys: 'k' }, { marketplaceKeys: [null] }, { marketplaceKeys: keys, provider: 5 }, { marketplaceKeys: keys, body: null }]) {
      const r = verifyTicket(fresh, opts as never);
      expect(r.ok ? 'ok' : r.error.code, JSON.stringify(opts)).toBe('options_invalid');
    }
    expect(codeOf(fresh, { skewMs: 0, now })).toBe('ok');
  });
  test('not yet valid', () => {
    const now = Date.now();
    expect(codeOf(signTicket(market, ticketPayload(provider.id, { issued_at: now + 60_000, expires_at: now + 120_000 })))).toBe('ticket_not_yet_valid');
  });
  test('wrong provider', () => expect(codeOf(signTicket(market, ticketPayload(testKey().id)))).toBe('ticket_wrong_provider'));
  test('wrong body', () => expect(codeOf(signTicket(market, ticketPayload(provider.id)), { body: utf8('{"model":"other"}') })).toBe('ticket_body_mismatch'));
  test('a receipt is not a ticket', () => expect(codeOf(signReceipt(market, { any: 1 }))).toBe('payload_type_mismatch'));
  test('bad fields are named', () => {
    const r = verifyTicket(signTicket(market, { ...ticketPayload(provider.id), routing: { max_wait_ms: 60001 } }), { marketplaceKeys: keys });
    expect(r).toMatchObject({ ok: false, error: { code: 'payload_invalid', field: 'routing.max_wait_ms' } });
    const r2 = verifyTicket(signTicket(market, { ...ticketPayload(provider.id), max_cost_micro_usd: 5 }), { marketplaceKeys: keys });
    expect(r2).toMatchObject({ ok: false, error: { code: 'payload_invalid', field: 'max_cost_micro_usd' } });
    const r3 = verifyTicket(signTicket(market, { ...ticketPayload(provider.id), routing: { min_tokens_per_second: 0 } }), { marketplaceKeys: keys });
    expect(r3).toMatchObject({ ok: false, error: { code: 'payload_invalid', field: 'routing.min_tokens_per_second' } });
    const r4 = verifyTicket(signTicket(market, { ...ticketPayload(provider.id), routing: { quantization: 'q4 k m' } }), { marketplaceKeys: keys });
    expect(r4).toMatchObject({ ok: false, error: { code: 'payload_invalid', field: 'routing.quantization' } });
  });
  test('a quantization as the buyer wrote it (not yet bucketed) is taken: the node compares buckets', () => {
    for (const q of ['Q4_K_M', 'q4-k-m', 'F16']) {
      expect(verifyTicket(signTicket(market, { ...ticketPayload(provider.id), routing: { quantization: q } }), { marketplaceKeys: keys }).ok, q).toBe(true);
    }
  });
  test('garbage never throws', () => {
    for (const g of ['', 'null', '{"payloadType":"x"}', '[1,2]']) expect(codeOf(g)).toMatch(/envelope_/);
    expect(verifyTicket('x', { marketplaceKeys: [{ publicKey: 'nothex' }] })).toMatchObject({ ok: false });
  });
});

const windowMarket = testKey();
const windowProvider = testKey();
const windowCode = (env: unknown, opts: object) => {
  const r = verifyTicket(env as never, { marketplaceKeys: [{ publicKey: windowMarket.id }], provider: windowProvider.id, ...opts });
  return r.ok ? 'ok' : r.error.code;
};

describe('the ticket window: 30 s skew each way (docs/decisions.md)', () => {
  test('issued 10 s in the node\'s future (its clock lags the market\'s) is still valid; 31 s is not', () => {
    const now = 1_700_000_000_000;
    expect(windowCode(signTicket(windowMarket, ticketPayload(windowProvider.id, { issued_at: now + 10_000, expires_at: now + 70_000 })), { now })).toBe('ok');
    expect(windowCode(signTicket(windowMarket, ticketPayload(windowProvider.id, { issued_at: now + 31_000, expires_at: now + 91_000 })), { now })).toBe('ticket_not_yet_valid');
  });
  test('expiry boundary: exactly expires_at + skew is expired, 1 ms before is not', () => {
    const now = 1_700_000_000_000;
    const t = (exp: number) => signTicket(windowMarket, ticketPayload(windowProvider.id, { issued_at: exp - 60_000, expires_at: exp }));
    expect(windowCode(t(now - 30_000), { now })).toBe('ticket_expired');
    expect(windowCode(t(now - 29_999), { now })).toBe('ok');
  });
});
