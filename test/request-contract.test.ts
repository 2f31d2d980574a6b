// The signed request contract: what the node signs for buyers is what src/serve/contract.ts
// applies (every field, bound, value list and type), and the envelope verifies strictly.
import crypto from 'node:crypto';
import { describe, expect, test } from 'vitest';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { canonicalize } from '../attestation/canonical-json.ts';
import { signEnvelope } from '../attestation/dsse.ts';
import { ed25519PublicKey as publicKeyFromSeed } from '../attestation/ed25519.ts';
import { CONTRACT_ENDPOINTS, contractVersion, REQUEST_CONTRACT_PAYLOAD_TYPE, signRequestContract, validateRequestContract, type AttributeSpec, type ContractEndpoint } from '../attestation/request-contract.ts';
import { verifyRequestContract } from '../attestation/verifier.ts';
import { ContractError, ENDPOINT_FIELDS, parseRequest } from '../src/serve/contract.ts';
import { TEXT_REQUEST_CONTRACT } from '../src/serve/request-contract.ts';

const BASE: Record<ContractEndpoint, Record<string, unknown>> = {
  'chat/completions': { model: 'm', messages: [{ role: 'user', content: 'hi' }] },
  completions: { model: 'm', prompt: 'hi' },
  responses: { model: 'm', input: 'hi' },
  embeddings: { model: 'm', input: 'hi' },
};

/** parseRequest's answer to the endpoint's minimal body with `attr` set to `value`: undefined when taken, else the field refused. */
function refusedField(endpoint: ContractEndpoint, attr: string, value: unknown): string | undefined {
  const body = { ...BASE[endpoint], ...(attr === 'stream_options' ? { stream: true } : {}), [attr]: value };
  try {
    parseRequest(endpoint, utf8(JSON.stringify(body)));
    return undefined;
  } catch (e) {
    if (!(e instanceof ContractError)) throw e;
    return e.field;
  }
}

const typeOf = (v: unknown): string => (Array.isArray(v) ? 'array' : v === null ? 'null' : Number.isInteger(v) ? 'integer' : typeof v);
const types = (s: AttributeSpec): string[] => (Array.isArray(s.type) ? s.type : [s.type]);
const fits = (v: unknown, s: AttributeSpec): boolean => types(s).includes(typeOf(v)) || (typeOf(v) === 'integer' && types(s).includes('number'));
/** A value of another type than the attribute's. */
const wrongType = (s: AttributeSpec): unknown => [true, 'x', 12.5, { z: 1 }, [1]].find((v) => !fits(v, s));
/** Values of the attribute's type that its enum does not hold: for an object, one with another key, and each enum object with a key more. */
function outsideEnum(s: AttributeSpec): unknown[] {
  const inEnum = (v: unknown): boolean => s.enum!.some((e) => canonicalize(e) === canonicalize(v));
  const objects = s.enum!.flatMap((e) => (e !== null && typeof e === 'object' && !Array.isArray(e) ? [{ ...e, z: 1 }] : []));
  const candidates: Record<string, unknown[]> = { string: ['zz-other'], integer: [7], number: [0.5], boolean: [true, false], object: [{ z: 1 }, ...objects], array: [['zz']] };
  const out = candidates[types(s)[0]!]!.filter((v) => !inEnum(v));
  return types(s)[0] === 'boolean' ? out.slice(0, 1) : out;
}

describe('the request contract the node signs is the one it applies', () => {
  for (const endpoint of CONTRACT_ENDPOINTS) {
    const contract = TEXT_REQUEST_CONTRACT[endpoint];
    test(`${endpoint}: its common fields and attributes are exactly the fields the node takes`, () => {
      expect(new Set([...contract.common, ...Object.keys(contract.attributes)])).toEqual(new Set(ENDPOINT_FIELDS[endpoint]));
      expect(refusedField(endpoint, 'not_in_contract', 1)).toBe('not_in_contract');
    });

    test(`${endpoint}: each attribute's type, values and bounds are what the node takes and refuses`, () => {
      let checked = 0;
      for (const [attr, spec] of Object.entries(contract.attributes)) {
        const at = `${endpoint} ${attr}`;
        expect(refusedField(endpoint, attr, wrongType(spec)), `${at}: another type`).toMatch(new RegExp(`^${attr}(\\.|$)`));
        if (spec.enum) {
          for (const v of spec.enum) expect(refusedField(endpoint, attr, v), `${at} = ${JSON.stringify(v)}`).toBeUndefined();
          for (const v of outsideEnum(spec)) expect(refusedField(endpoint, attr, v), `${at} = ${JSON.stringify(v)}: outside its values`).toMatch(new RegExp(`^${attr}(\\.|$)`));
        }
        const step = types(spec).includes('integer') ? 1 : 0.001;
        if (spec.minimum !== undefined) {
          expect(refusedField(endpoint, attr, spec.minimum), `${at} at its minimum`).toBeUndefined();
          expect(refusedField(endpoint, attr, spec.minimum - step), `${at} below its minimum`).toBe(attr);
        }
        if (spec.maximum !== undefined) {
          expect(refusedField(endpoint, attr, spec.maximum), `${at} at its maximum`).toBeUndefined();
          expect(refusedField(endpoint, attr, spec.maximum + step), `${at} above its maximum`).toBe(attr);
        }
        if (spec.exclusive_minimum !== undefined) {
          expect(refusedField(endpoint, attr, spec.exclusive_minimum), `${at} at its exclusive minimum`).toBe(attr);
          expect(refusedField(endpoint, attr, spec.exclusive_minimum + 0.5), `${at} above its exclusive minimum`).toBeUndefined();
        }
        if (spec.max_items !== undefined) {
          const items = (n: number): string[] => Array.from({ length: n }, (_, i) => `s${i}`);
          expect(refusedField(endpoint, attr, items(spec.max_items)), `${at} with ${spec.max_items} items`).toBeUndefined();
          expect(refusedField(endpoint, attr, items(spec.max_items + 1)), `${at} with one item more`).toBe(attr);
        }
        if (spec.default !== undefined) expect(refusedField(endpoint, attr, spec.default), `${at} at its default`).toBeUndefined();
        // Null is "not given", whatever the attribute.
        expect(refusedField(endpoint, attr, null), `${at} = null`).toBeUndefined();
        checked++;
      }
      expect(checked).toBe(Object.keys(contract.attributes).length);
    });
  }
});

describe('signed request contracts', () => {
  const seed = crypto.randomBytes(32);
  const provider = toHex(publicKeyFromSeed(seed));
  const signed = signRequestContract(seed, provider, ['b/model', 'a/model'], TEXT_REQUEST_CONTRACT);

  test('sign and verify: the models sorted, the version derived from the contents', () => {
    const v = verifyRequestContract(signed.envelope, { provider });
    expect(v.ok).toBe(true);
    if (!v.ok) return;
    expect(v.value.models).toEqual(['a/model', 'b/model']);
    expect(v.value.version).toBe(contractVersion(['b/model', 'a/model'], TEXT_REQUEST_CONTRACT));
    expect(v.value.version).toMatch(/^c-[0-9a-f]{16}$/);
    expect(v.value.endpoints).toEqual(TEXT_REQUEST_CONTRACT);
    // (Deterministic: the same contract signs to the same bytes.)
    expect(signRequestContract(seed, provider, ['a/model', 'b/model'], TEXT_REQUEST_CONTRACT).envelope).toEqual(signed.envelope);
    expect(verifyRequestContract(JSON.stringify(signed.envelope), { provider }).ok).toBe(true);
  });

  test('another key, a flipped bit, another payload type, bad options: refused with a named error, never a throw', () => {
    const other = toHex(publicKeyFromSeed(crypto.randomBytes(32)));
    expect(verifyRequestContract(signed.envelope, { provider: other })).toMatchObject({ ok: false, error: { code: 'unknown_key' } });
    const sig = Buffer.from(signed.envelope.signatures[0]!.sig, 'base64');
    sig[5]! ^= 1;
    const flipped = { ...signed.envelope, signatures: [{ ...signed.envelope.signatures[0]!, sig: sig.toString('base64') }] };
    expect(verifyRequestContract(flipped, { provider })).toMatchObject({ ok: false, error: { code: 'signature_invalid' } });
    const retyped = signEnvelope('application/vnd.service.pricelist.v1+json', utf8(canonicalize(signed.payload)), { keyid: provider, seed });
    expect(verifyRequestContract(retyped, { provider })).toMatchObject({ ok: false, error: { code: 'payload_type_mismatch' } });
    expect(verifyRequestContract(signed.envelope, null as never)).toMatchObject({ ok: false, error: { code: 'options_invalid' } });
    expect(verifyRequestContract('{"payload":', { provider })).toMatchObject({ ok: false });
    expect(verifyRequestContract(42 as never, { provider })).toMatchObject({ ok: false });
  });

  test("a payload that names another provider, or whose version is not its contents', is refused naming the field", () => {
    const other = toHex(publicKeyFromSeed(crypto.randomBytes(32)));
    const sign = (p: unknown) => signEnvelope(REQUEST_CONTRACT_PAYLOAD_TYPE, utf8(canonicalize(p)), { keyid: provider, seed });
    expect(verifyRequestContract(sign({ ...signed.payload, provider: other }), { provider })).toMatchObject({ ok: false, error: { code: 'provider_mismatch' } });
    expect(verifyRequestContract(sign({ ...signed.payload, version: 'c-0000000000000000' }), { provider })).toMatchObject({ ok: false, error: { code: 'payload_invalid', message: expect.stringMatching(/^request contract version/) } });
  });

  test('validateRequestContract names the bad field', () => {
    const p = signed.payload;
    const bad = (change: (q: Record<string, any>) => void): string => {
      const q = JSON.parse(JSON.stringify(p)) as Record<string, any>; // (the endpoints share attribute objects)
      change(q);
      try {
        validateRequestContract(q);
        return 'accepted';
      } catch (e) {
        return (e as { field: string }).field;
      }
    };
    expect(bad(() => undefined)).toBe('accepted');
    expect(bad((q) => (q.v = 2))).toBe('v');
    expect(bad((q) => (q.models = []))).toBe('models');
    expect(bad((q) => (q.models = ['a', 'a']))).toBe('models[1]');
    expect(bad((q) => (q.endpoints = {}))).toBe('endpoints');
    expect(bad((q) => (q.endpoints['images/generations'] = q.endpoints.completions))).toBe('endpoints.images/generations');
    expect(bad((q) => (q.endpoints.completions.attributes.seed.type = 'float'))).toBe('endpoints.completions.attributes.seed.type');
    expect(bad((q) => (q.endpoints.completions.attributes.seed.use = 'maybe'))).toBe('endpoints.completions.attributes.seed.use');
    expect(bad((q) => (q.endpoints.completions.attributes.seed.minimum = 'zero'))).toBe('endpoints.completions.attributes.seed.minimum');
    expect(bad((q) => (q.endpoints.completions.attributes.seed.extra = 1))).toBe('endpoints.completions.attributes.seed.extra');
    expect(bad((q) => (q.endpoints.completions.attributes.n.enum = []))).toBe('endpoints.completions.attributes.n.enum');
    expect(bad((q) => (q.endpoints.completions.attributes.prompt = { type: 'string', use: 'applied' }))).toBe('endpoints.completions.attributes.prompt');
    expect(bad((q) => (q.endpoints.completions.attributes['Bad-Name'] = { type: 'string', use: 'applied' }))).toBe('endpoints.completions.attributes.Bad-Name');
    expect(bad((q) => (q.endpoints.completions.common = ['model', 'model']))).toBe('endpoints.completions.common[1]');
    expect(bad((q) => (q.extra = 1))).toBe('extra');
    // Specs that contradict themselves, or carry values of any size.
    const seed = 'endpoints.completions.attributes.seed';
    expect(bad((q) => (q.endpoints.completions.attributes.seed.minimum = 5e9))).toBe(`${seed}.minimum`);
    expect(bad((q) => (q.endpoints.completions.attributes.repetition_penalty.exclusive_minimum = 100))).toBe('endpoints.completions.attributes.repetition_penalty.exclusive_minimum');
    expect(bad((q) => (q.endpoints.completions.attributes.seed.max_items = 2))).toBe(`${seed}.max_items`);
    expect(bad((q) => (q.endpoints.completions.attributes.n.enum = ['one']))).toBe('endpoints.completions.attributes.n.enum[0]');
    expect(bad((q) => (q.endpoints.completions.attributes.n.default = 2))).toBe('endpoints.completions.attributes.n.default');
    expect(bad((q) => (q.endpoints.completions.attributes.suffix.enum = ['x'.repeat(300)]))).toBe('endpoints.completions.attributes.suffix.enum[0]');
    expect(bad((q) => (q.endpoints.completions.attributes.seed.default = { a: { b: { c: { d: { e: { f: { g: { h: { i: 1 } } } } } } } } }))).toBe(`${seed}.default`);
    expect(bad((q) => (q.endpoints.completions.attributes.user.type = ['string', 'string']))).toBe('endpoints.completions.attributes.user.type[1]');
    expect(bad((q) => (q.endpoints.completions.attributes.seed.default = 'zero'))).toBe(`${seed}.default`);
    expect(bad((q) => (q.endpoints.completions.attributes.seed.default = -1))).toBe(`${seed}.default`);
    expect(bad((q) => (q.endpoints.completions.attributes.temperature.default = 3))).toBe('endpoints.completions.attributes.temperature.default');
    expect(bad((q) => (q.endpoints.completions.attributes.n.minimum = 2))).toBe('endpoints.completions.attributes.n.enum[0]');
    expect(bad((q) => (q.endpoints.completions.attributes.user.minimum = 1))).toBe('endpoints.completions.attributes.user.minimum');
    expect(bad((q) => (q.endpoints.completions.attributes.stop.default = ['a', 'b', 'c', 'd', 'e']))).toBe('endpoints.completions.attributes.stop.default');
  });
});
