import { describe, expect, test } from 'vitest';
import { utf8 } from '../attestation/bytes.ts';
import { canonicalize } from '../attestation/canonical-json.ts';
import { signEnvelope } from '../attestation/dsse.ts';
import { sha256Hex } from '../attestation/hash.ts';
import { PriceBook, PRICELIST_PAYLOAD_TYPE, priceVersion, signPriceList, verifyPriceList } from '../attestation/price-list.ts';
import { testKey } from './helpers/receipts.ts';

const key = testKey();
const models = [
  { model: 'tiny/llama', input_per_mtok: '150000', output_per_mtok: '600000' },
  { model: 'a/other', input_per_mtok: '1', output_per_mtok: '2', per_unit: { images: '40000' } },
];

describe('signed price lists', () => {
  test('sign and verify; the version is derived from the prices, whatever their order', () => {
    const { payload, envelope } = signPriceList(key.seed, key.id, models, 1_700_000_000_000);
    expect(payload.models.map((m) => m.model)).toEqual(['a/other', 'tiny/llama']);
    expect(payload.version).toMatch(/^p-[0-9a-f]{32}$/); // 128 bits: no two lists of one version (a 64-bit one was found in minutes: s23 h3)
    expect(payload.version).toBe(`p-${sha256Hex(canonicalize(payload.models)).slice(0, 32)}`);
    expect(payload.version).toBe(priceVersion([...models].reverse()));
    expect(priceVersion([{ ...models[0]!, output_per_mtok: '600001' }, models[1]!])).not.toBe(payload.version);
    expect(verifyPriceList(envelope, { provider: key.id })).toMatchObject({ ok: true, value: payload });
  });
  test('a list whose version is the old 64-bit form of its prices is refused', () => {
    const { payload } = signPriceList(key.seed, key.id, models);
    const short = { ...payload, version: `p-${sha256Hex(canonicalize(payload.models)).slice(0, 16)}` };
    const env = signEnvelope(PRICELIST_PAYLOAD_TYPE, utf8(canonicalize(short)), { keyid: key.id, seed: key.seed });
    expect(verifyPriceList(env, { provider: key.id })).toMatchObject({ ok: false, error: { code: 'payload_invalid', field: 'version' } });
  });
  test('a book tells another list of a version it holds, with other prices, from the same list again', () => {
    const book = new PriceBook([{ version: 'p-x', models }]);
    expect(book.conflicts({ version: 'p-x', models: [...models].reverse() })).toBe(false);
    expect(book.conflicts({ version: 'p-y', models: [models[0]!] })).toBe(false);
    expect(book.conflicts({ version: 'p-x', models: [models[0]!] })).toBe(true);
    expect(book.conflicts({ version: 'p-x', models: [{ ...models[0]!, output_per_mtok: '600001' }, models[1]!] })).toBe(true);
  });
  test('refusals are named', () => {
    const { payload, envelope } = signPriceList(key.seed, key.id, models);
    const resign = (p: unknown) => signEnvelope(PRICELIST_PAYLOAD_TYPE, utf8(canonicalize(p)), { keyid: key.id, seed: key.seed });
    expect(verifyPriceList(envelope, { provider: testKey().id })).toMatchObject({ ok: false, error: { code: 'unknown_key' } });
    expect(verifyPriceList(resign({ ...payload, version: 'p-00000000000000000000000000000000' }), { provider: key.id })).toMatchObject({ ok: false, error: { code: 'payload_invalid', field: 'version' } });
    expect(verifyPriceList(resign({ ...payload, models: [...payload.models, payload.models[0]] }), { provider: key.id })).toMatchObject({ ok: false, error: { code: 'payload_invalid', field: `models[${payload.models.length}].model` } });
    expect(verifyPriceList(resign({ ...payload, provider: 'ab'.repeat(32) }), { provider: key.id })).toMatchObject({ ok: false, error: { code: 'provider_mismatch' } });
    expect(verifyPriceList(resign({ ...payload, models: [{ ...payload.models[0]!, input_per_mtok: 1.5 }] }), { provider: key.id })).toMatchObject({ ok: false, error: { code: 'payload_invalid', field: 'models[0].input_per_mtok' } });
    expect(verifyPriceList('nope', { provider: key.id })).toMatchObject({ ok: false, error: { code: 'envelope_not_json' } });
    expect(() => signPriceList(key.seed, key.id, [])).toThrow(/models/);
  });
});

describe('PriceBook (the audit\'s price check)', () => {
  const { payload } = signPriceList(key.seed, key.id, models);
  const book = new PriceBook([payload]);
  const receipt = (model: string, rates: object, version = payload.version) => ({ model, price: { version, rates: rates as never } });

  test('a receipt at exactly its model\'s rates holds, per-unit rates in any key order', () => {
    expect(book.check(receipt('tiny/llama', { input_per_mtok: '150000', output_per_mtok: '600000' }))).toBeUndefined();
    expect(book.check(receipt('a/other', { input_per_mtok: '1', output_per_mtok: '2', per_unit: { images: '40000' } }))).toBeUndefined();
    const two = new PriceBook([{ version: 'v', models: [{ model: 'm', input_per_mtok: '1', output_per_mtok: '2', per_unit: { b: '3', a: '4' } }] }]);
    expect(two.check(receipt('m', { input_per_mtok: '1', output_per_mtok: '2', per_unit: { a: '4', b: '3' } }, 'v'))).toBeUndefined();
  });

  test('other rates, a missing or extra per-unit rate, another model, another version: each named', () => {
    expect(book.check(receipt('tiny/llama', { input_per_mtok: '150000', output_per_mtok: '600001' }))).toMatchObject({ code: 'price_mismatch', field: 'price.rates' });
    expect(book.check(receipt('tiny/llama', { input_per_mtok: '600000', output_per_mtok: '150000' }))).toMatchObject({ code: 'price_mismatch' });
    expect(book.check(receipt('tiny/llama', { input_per_mtok: '150000', output_per_mtok: '600000', per_unit: {} }))).toMatchObject({ code: 'price_mismatch' });
    expect(book.check(receipt('a/other', { input_per_mtok: '1', output_per_mtok: '2' }))).toMatchObject({ code: 'price_mismatch' });
    expect(book.check(receipt('a/other', { input_per_mtok: '1', output_per_mtok: '2', per_unit: { images: '40001' } }))).toMatchObject({ code: 'price_mismatch' });
    expect(book.check(receipt('b/unlisted', { input_per_mtok: '1', output_per_mtok: '2' }))).toMatchObject({ code: 'price_mismatch', field: 'model' });
    const missing = book.check(receipt('tiny/llama', { input_per_mtok: '150000', output_per_mtok: '600000' }, 'p-00000000000000000000000000000000'));
    expect(missing).toMatchObject({ code: 'price_list_missing', field: 'price.version' });
    expect(missing!.message).toContain('p-00000000000000000000000000000000');
  });

});
