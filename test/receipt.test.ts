import { describe, expect, test } from 'vitest';
import { utf8 } from '../attestation/bytes.ts';
import { serializeEnvelope, signEnvelope } from '../attestation/dsse.ts';
import { ratesFromWire, ratesToWire, validateReceiptPayload } from '../attestation/receipt.ts';
import { FieldError } from '../attestation/fields.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { canonicalize } from '../attestation/canonical-json.ts';
import { receiptPayload, signReceipt, testKey } from './helpers/receipts.ts';

const key = testKey();

function fieldOf(p: unknown): string | undefined {
  try {
    validateReceiptPayload(p);
    return undefined;
  } catch (e) {
    expect(e).toBeInstanceOf(FieldError);
    return (e as FieldError).field;
  }
}

describe('receipt payload validation names the bad field', () => {
  test('a synthetic payload is valid', () => expect(fieldOf(receiptPayload(key))).toBeUndefined());
  const cases: [string, (p: Record<string, any>) => void][] = [
    ['v', (p) => (p.v = 2)],
    ['provider', (p) => (p.provider = 'ABC')],
    ['seq', (p) => (p.seq = 1)],
    ['seq', (p) => (p.seq = '01')],
    ['prev', (p) => (p.prev = 'x')],
    ['request_id', (p) => (p.request_id = '')],
    ['request_id', (p) => (p.request_id = 'has space')],
    ['endpoint', (p) => (p.endpoint = '/v1/../x')],
    ['model_sha256', (p) => delete p.model_sha256],
    ['runtime.version', (p) => (p.runtime = { adapter: 'x' })],
    ['runtime.extra', (p) => (p.runtime = { adapter: 'x', version: '1', extra: 1 })],
    ['status', (p) => (p.status = 'done')],
    ['finished_at', (p) => (p.finished_at = p.started_at - 1)],
    ['first_token_at', (p) => (p.first_token_at = p.finished_at + 1)],
    ['usage.output_tokens', (p) => (p.usage = { input_tokens: 1, output_tokens: -1 })],
    ['usage.input_tokens', (p) => (p.usage = { input_tokens: 1.5, output_tokens: 1 })],
    ['usage.units.images', (p) => (p.usage = { input_tokens: 1, output_tokens: 1, units: { images: 1 } })],
    // A unit named like an inherited property has no rate either (an `in` test would find one).
    ['usage.units.constructor', (p) => (p.usage = { input_tokens: 1, output_tokens: 1, units: { constructor: 1 } })],
    ['usage_runtime', (p) => (p.usage_runtime = [])],
    ['price.rates.output_per_mtok', (p) => (p.price = { version: 'v', rates: { input_per_mtok: '1', output_per_mtok: 1.5 } })],
    ['cost_micro_usd', (p) => (p.cost_micro_usd = 12)],
    ['hold_micro_usd', (p) => (p.hold_micro_usd = '-1')],
    ['attestation.tier', (p) => (p.attestation = { tier: 'T9', evidence_sha256: null })],
    ['surprise', (p) => (p.surprise = true)],
    ['', () => undefined],
  ];
  test.each(cases.slice(0, -1))('%s', (field, mutate) => {
    const p = receiptPayload(key) as unknown as Record<string, any>;
    mutate(p);
    expect(fieldOf(p)).toBe(field);
  });
  test('non-objects', () => {
    for (const v of [null, [], 'x', 1]) expect(fieldOf(v)).toBe('');
  });
});

describe('verifyReceipt', () => {
  const p = receiptPayload(key, 0);
  const env = signReceipt(key, p);
  test('valid, as object and as JSON text, by id or key bytes', () => {
    expect(verifyReceipt(env, { provider: key.id })).toMatchObject({ ok: true, value: { payload: p } });
    expect(verifyReceipt(serializeEnvelope(env), { provider: key.publicKey }).ok).toBe(true);
  });
  test('chain option adds the payload hash and leaf hash', () => {
    const r = verifyReceipt(env, { provider: key.id, chain: true });
    expect(r.ok && r.value.payloadSha256?.length === 64 && r.value.leafHash?.length === 32).toBe(true);
  });
  const codeOf = (e: unknown, provider: string | Uint8Array = key.id) => {
    const r = verifyReceipt(e as never, { provider });
    return r.ok ? 'ok' : r.error.code;
  };
  test('each fault has its own code', () => {
    const other = testKey();
    expect(codeOf(env, other.id)).toBe('unknown_key');
    expect(codeOf({ ...env, signatures: [{ keyid: key.id, sig: signReceipt(other, p).signatures[0]!.sig }] })).toBe('signature_invalid');
    expect(codeOf(signReceipt(key, p, JSON.stringify(p, null, 1)))).toBe('payload_not_canonical');
    expect(codeOf(signReceipt(key, p, '{"v":1'))).toBe('payload_not_json');
    // A byte-order mark before canonical JSON is not silently dropped.
    expect(codeOf(signReceipt(key, p, '\uFEFF' + canonicalize(p)))).toBe('payload_not_json');
    expect(codeOf(signEnvelope('application/vnd.service.receipt.v1+json', new Uint8Array([0xff, 0xfe]), { keyid: key.id, seed: key.seed }))).toBe('payload_not_json');
    expect(codeOf(signReceipt(key, { ...p, status: 'won' }))).toBe('payload_invalid');
    expect(codeOf(signReceipt(key, { ...p, cost_micro_usd: String(BigInt(p.cost_micro_usd) + 1n) }))).toBe('cost_mismatch');
    expect(codeOf(signReceipt(key, { ...p, hold_micro_usd: String(BigInt(p.cost_micro_usd) - 1n) }))).toBe('cost_exceeds_hold');
    expect(codeOf(signReceipt(key, { ...p, provider: other.id }))).toBe('provider_mismatch');
    expect(codeOf(signEnvelope('application/vnd.service.ticket.v1+json', utf8('{}'), { keyid: key.id, seed: key.seed }))).toBe('payload_type_mismatch');
    expect(codeOf('{"payload":')).toBe('envelope_not_json');
    expect(codeOf({ payload: 1 })).toBe('envelope_malformed');
    expect(codeOf(env, 'not-hex')).toBe('unknown_key');
  });
  test('payload_invalid reports the field', () => {
    const r = verifyReceipt(signReceipt(key, { ...p, usage: { input_tokens: 1, output_tokens: 'many' } }), { provider: key.id });
    expect(r).toMatchObject({ ok: false, error: { code: 'payload_invalid', field: 'usage.output_tokens' } });
  });
  test('hostile objects do not crash it', () => {
    const evil = { get payloadType(): string { throw new Error('boom'); }, payload: '', signatures: [{ sig: '' }] };
    expect(codeOf(evil)).toBe('envelope_malformed');
  });
});

describe('buildReceiptPayload + receiptPayloadJson', () => {
  test('give exactly the RFC 8785 form, whatever the body key order', async () => {
    const { buildReceiptPayload, receiptPayloadJson } = await import('../attestation/receipt.ts');
    const { syntheticReceiptBody } = await import('../src/store/synthetic.ts');
    const bodies = [
      syntheticReceiptBody(1),
      { ...syntheticReceiptBody(2), usage: { units: { zeta: 1, alpha: 2 }, output_tokens: 3, input_tokens: 4 }, price: { version: 'v', rates: { per_unit: { zeta: '5', alpha: '6' }, output_per_mtok: '1', input_per_mtok: '2' } } },
      // Integer-like keys enumerate first in JS: the fast path must notice and step aside.
      { ...syntheticReceiptBody(3), usage_runtime: { '10': 1, '9': 2, b: { '2': 0, '11': 1 }, a: [3, { y: 1, x: 2 }] } },
      { ...syntheticReceiptBody(4), usage_runtime: { 'é': 1, e: 2, '\u{1F600}': 3, '\uE000': 4 } },
    ];
    for (const b of bodies) {
      const p = buildReceiptPayload(key.id, '7', '0'.repeat(64), b as never);
      expect(receiptPayloadJson(p)).toBe(canonicalize(p));
    }
  });
  test('a lone surrogate in a free-text field is refused with the field named', () => {
    const p = { ...receiptPayload(key), model: 'bad\uD800model' };
    expect(fieldOf(p)).toBe('model');
  });
});

describe('rates on the wire', () => {
  test('decimal strings both ways, per-unit rates included, exactly', () => {
    const rates = { input_per_mtok: 150_000n, output_per_mtok: 12_345_678_901_234_567_890n, per_unit: { image: 40_000n } };
    expect(ratesToWire(rates)).toEqual({ input_per_mtok: '150000', output_per_mtok: '12345678901234567890', per_unit: { image: '40000' } });
    expect(ratesFromWire(ratesToWire(rates))).toEqual(rates);
    expect(ratesToWire({ input_per_mtok: 1n, output_per_mtok: 2n })).toEqual({ input_per_mtok: '1', output_per_mtok: '2' });
  });
});
