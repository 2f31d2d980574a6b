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

/** Refused field of a whole body (the endpoint's minimal body with `over` laid on it), or undefined when taken. */
function refusedBody(endpoint: ContractEndpoint, over: Record<string, unknown>): string | undefined {
  try {
    parseRequest(endpoint, utf8(JSON.stringify({ ...BASE[endpoint], ...over })));
    return undefined;
  } catch (e) {
    if (!(e instanceof ContractError)) throw e;
    return e.field;
  }
}

const user = (content: unknown, more: Record<string, unknown> = {}) => ({ role: 'user', content, ...more });
const call = { id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } };
/**
 * For each common field whose note narrows it: bodies the note rules out (each refused, naming the
 * field or one inside it) and bodies it says are taken. The context bound of max_tokens needs a
 * model: test/infer-service.test.ts refuses it (context_length_exceeded).
 */
const NARROWED: Record<ContractEndpoint, Record<string, { refused: Record<string, unknown>[]; taken: Record<string, unknown>[]; field?: RegExp }>> = {
  'chat/completions': {
    messages: {
      refused: [
        { messages: [{ role: 'critic', content: 'hi' }] },
        { messages: [user([{ type: 'image_url', image_url: { url: 'https://x/y.png' } }])] },
        { messages: [user([{ type: 'input_audio', input_audio: { data: '', format: 'wav' } }])] },
        { messages: [user({ text: 'hi' })] },
        { messages: [user(7)] },
        { messages: [user('hi', { tool_calls: [call] })] },
        { messages: [{ role: 'assistant', content: 'hi', refusal: 'no' }] },
        { messages: [{ role: 'assistant', content: 'hi', annotations: [{ type: 'url_citation' }] }] },
        { messages: [user([{ type: 'text', text: 'hi', cache_control: { type: 'ephemeral' } }])] },
        { messages: [user([{ type: 'output_text', text: 'hi', annotations: [{ type: 'url_citation' }] }])] },
        { messages: [user('hi', { name: 'n'.repeat(257) })] },
        { messages: [{ role: 'tool', content: '{}', tool_call_id: '' }] },
        { messages: [{ role: 'assistant', content: null, tool_calls: Array.from({ length: 129 }, () => call) }] },
      ],
      taken: [
        { messages: [{ role: 'developer', content: 'be brief' }, { role: 'system', content: 's' }, user('hi')] },
        { messages: [user([{ type: 'text', text: 'a' }, { type: 'input_text', text: 'b' }, { type: 'output_text', text: 'c' }])] },
        { messages: [user('hi'), { role: 'assistant', content: null, tool_calls: [call] }, { role: 'tool', content: '{}', tool_call_id: 'c1' }, user('and?', { name: 'ann' })] },
        { messages: [user('hi'), { role: 'assistant', content: 'hello', refusal: null, annotations: [] }, user('more')] },
        { messages: [user([{ type: 'output_text', text: 'hi', annotations: [], logprobs: [], parsed: null }], { name: 'n'.repeat(256) })] },
        { messages: [{ role: 'assistant', content: null, tool_calls: Array.from({ length: 128 }, () => call) }, { role: 'tool', content: '{}', tool_call_id: 'c1' }] },
      ],
    },
    max_tokens: { refused: [{ max_tokens: 5, max_completion_tokens: 5 }, { max_tokens: 0 }, { max_tokens: (1 << 24) + 1 }], taken: [{ max_tokens: 5 }, { max_completion_tokens: 5 }, { max_tokens: 1 }], field: /^max_(completion_)?tokens$/ },
    stream_options: {
      refused: [{ stream_options: { include_usage: true } }, { stream: true, stream_options: { include_obfuscation: true } }, { stream: true, stream_options: { continuous_usage_stats: true } }],
      taken: [{ stream: true, stream_options: { include_usage: true, include_obfuscation: false } }],
    },
  },
  completions: {
    prompt: { refused: [{ prompt: ['a', 'b'] }, { prompt: [1, 2, 3] }, { prompt: [[1, 2]] }, { prompt: null }], taken: [{ prompt: '' }, { prompt: 'a b' }] },
    max_tokens: { refused: [{ max_tokens: 0 }, { max_tokens: -1 }, { max_tokens: (1 << 24) + 1 }, { max_tokens: 2.5 }], taken: [{ max_tokens: 1 }, { max_tokens: 1 << 24 }] },
    stream_options: {
      refused: [{ stream_options: { include_usage: true } }, { stream: true, stream_options: { include_obfuscation: true } }, { stream: true, stream_options: { x: 1 } }],
      taken: [{ stream: true, stream_options: { include_usage: false } }],
    },
  },
  responses: {
    input: {
      refused: [
        { input: [{ type: 'function_call', call_id: 'c', name: 'f', arguments: '{}' }] },
        { input: [{ type: 'message', role: 'user', content: [{ type: 'input_image', image_url: 'https://x/y.png' }] }] },
        { input: [user('hi', { name: 'ann' })] },
        { input: [{ role: 'critic', content: 'hi' }] },
        { input: [] },
        { input: [{ type: 'message', role: 'user', content: 'hi', id: 'm1', status: 'completed', refusal: null }] },
      ],
      taken: [{ input: [{ type: 'message', role: 'developer', content: [{ type: 'input_text', text: 'hi' }] }, { role: 'user', content: 'hi' }, { type: 'message', id: 'msg_1', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'x', annotations: [] }] }] }],
    },
  },
  embeddings: {
    input: {
      refused: [{ input: Array.from({ length: 2049 }, () => 'a') }, { input: [1, 2, 3] }, { input: [[1, 2]] }, { input: [] }, { input: '' }, { input: ['a', ''] }],
      taken: [{ input: Array.from({ length: 2048 }, () => 'a') }, { input: 'a' }],
    },
  },
};

describe("each common field's note says where the node takes less than the API allows, and the node holds to it", () => {
  for (const endpoint of CONTRACT_ENDPOINTS) {
    test(`${endpoint}: every note has its cases, every narrowed field a note`, () => {
      const notes = TEXT_REQUEST_CONTRACT[endpoint].common_notes ?? {};
      expect(Object.keys(notes).sort()).toEqual(Object.keys(NARROWED[endpoint]).sort());
      for (const [field, { refused, taken, field: named }] of Object.entries(NARROWED[endpoint])) {
        for (const body of refused) expect(refusedBody(endpoint, body), `${endpoint} ${JSON.stringify(body).slice(0, 120)}`).toMatch(named ?? new RegExp(`^${field}(\\.|\\[|$)`));
        for (const body of taken) expect(refusedBody(endpoint, body), `${endpoint} ${JSON.stringify(body).slice(0, 120)}`).toBeUndefined();
      }
    });
  }

  test('a note is only for a common field the endpoint lists, and is bounded', () => {
    const endpoints = { completions: { ...TEXT_REQUEST_CONTRACT.completions, common_notes: { suffix: 'x' } } };
    expect(() => signRequestContract(crypto.randomBytes(32), '00'.repeat(32), ['m'], endpoints)).toThrow(/endpoints\.completions\.common_notes\.suffix: is not one of the common fields listed/);
    const long = { completions: { ...TEXT_REQUEST_CONTRACT.completions, common_notes: { prompt: 'x'.repeat(601) } } };
    expect(() => signRequestContract(crypto.randomBytes(32), '00'.repeat(32), ['m'], long)).toThrow(/common_notes\.prompt: expected 1 to 600 characters/);
  });
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
    // Nested past what the canonical check walks: refused, and the message says why.
    const deep = '[1,'.repeat(200) + '1' + ']'.repeat(200);
    const text = canonicalize(signed.payload).replace(/\}$/, `,"z":${deep}}`);
    const nested = signEnvelope(REQUEST_CONTRACT_PAYLOAD_TYPE, utf8(text), { keyid: provider, seed });
    expect(verifyRequestContract(nested, { provider })).toMatchObject({ ok: false, error: { code: 'payload_not_canonical', message: expect.stringMatching(/is not RFC 8785 canonical JSON \(nesting deeper than 128 levels\)/) } });
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
