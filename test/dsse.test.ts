import { p256 } from '@noble/curves/nist.js';
import { describe, expect, test } from 'vitest';
import crypto from 'node:crypto';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { LENIENT_BASE64, base64Candidates } from './helpers/base64-cases.ts';
import { pae, paeOfBase64, transientPae, parseEnvelope, serializeEnvelope, signEnvelope, verifyEnvelope, type DsseEnvelope, type DsseKey } from '../attestation/dsse.ts';
import { ed25519PublicKey } from '../attestation/ed25519.ts';
import { readVectorJson } from './helpers/vectors.ts';

interface DsseVector {
  payloadType: string;
  serializedBody_utf8: string;
  pae_hex: string;
  key: { x_dec: string; y_dec: string };
  envelope: { payload: string; payloadType: string; signatures: { sig: string }[] };
}
const v = readVectorJson<DsseVector>('dsse', 'dsse_protocol_vector.json');

// Uncompressed SEC1 point from the spec's decimal coordinates.
const coord = (d: string) => BigInt(d).toString(16).padStart(64, '0');
const p256Key = Buffer.from('04' + coord(v.key.x_dec) + coord(v.key.y_dec), 'hex');
const p256Verify = (sig: Uint8Array, msg: Uint8Array, pub: Uint8Array) => {
  try {
    return p256.verify(sig, msg, pub, { prehash: true, lowS: false });
  } catch {
    return false;
  }
};
const specKey: DsseKey = { keyid: 'spec', publicKey: p256Key, verify: p256Verify };

describe('DSSE protocol vector (ECDSA P-256)', () => {
  test('PAE matches the spec byte for byte', () => {
    expect(toHex(pae(v.payloadType, utf8(v.serializedBody_utf8)))).toBe(v.pae_hex);
  });
  test('pae() returns the caller\'s own array (not a slice of a shared pool), transientPae the same bytes', () => {
    const m = pae(v.payloadType, utf8(v.serializedBody_utf8));
    expect([m.byteOffset, m.buffer.byteLength]).toEqual([0, m.length]);
    expect(toHex(transientPae(v.payloadType, utf8(v.serializedBody_utf8)))).toBe(toHex(m));
  });

  test('the spec envelope verifies and yields the body', () => {
    const r = verifyEnvelope(v.envelope, { payloadType: v.payloadType, keys: [specKey] });
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(new TextDecoder().decode(r.value.payload)).toBe('hello world');
    // The caller's own bytes, not a view into the PAE message (a shared pool slab on Node).
    expect([r.value.payload.byteOffset, r.value.payload.buffer.byteLength]).toEqual([0, 11]);
  });
  test('a changed body, type or signature fails', () => {
    const body = { ...v.envelope, payload: Buffer.from('hello world!').toString('base64') };
    expect(verifyEnvelope(body, { payloadType: v.payloadType, keys: [specKey] })).toMatchObject({ ok: false, error: { code: 'signature_invalid' } });
    const sig = Buffer.from(v.envelope.signatures[0]!.sig, 'base64');
    sig[5]! ^= 1;
    const badSig = { ...v.envelope, signatures: [{ sig: sig.toString('base64') }] };
    expect(verifyEnvelope(badSig, { payloadType: v.payloadType, keys: [specKey] })).toMatchObject({ ok: false, error: { code: 'signature_invalid' } });
    expect(verifyEnvelope(v.envelope, { payloadType: 'http://example.com/Other', keys: [specKey] })).toMatchObject({ ok: false, error: { code: 'payload_type_mismatch' } });
  });
});

describe('Ed25519 envelopes', () => {
  const seed = new Uint8Array(32).fill(7);
  const key = { keyid: 'k1', publicKey: ed25519PublicKey(seed) };
  const env = signEnvelope('application/x-test', utf8('{"a":1}'), { keyid: 'k1', seed });

  test('sign then verify; the serialised form is canonical JSON', () => {
    expect(verifyEnvelope(env, { payloadType: 'application/x-test', keys: [key] })).toMatchObject({ ok: true, value: { keyid: 'k1' } });
    // The verifying signature is named, whatever else the envelope carries.
    const padded = { ...env, signatures: [{ keyid: 'stranger', sig: env.signatures[0]!.sig }, ...env.signatures] };
    expect(verifyEnvelope(padded, { payloadType: 'application/x-test', keys: [key] })).toMatchObject({ ok: true, value: { keyid: 'k1', signature: env.signatures[0] } });
    expect(serializeEnvelope(env)).toBe(`{"payload":"${env.payload}","payloadType":"application/x-test","signatures":[{"keyid":"k1","sig":"${env.signatures[0]!.sig}"}]}`);
  });
  test('signatures by unknown keys are ignored; none by a trusted key is unknown_key', () => {
    const other = { keyid: 'k2', publicKey: ed25519PublicKey(new Uint8Array(32).fill(9)) };
    expect(verifyEnvelope(env, { payloadType: 'application/x-test', keys: [other] })).toMatchObject({ ok: false, error: { code: 'unknown_key' } });
    const extra = { ...env, signatures: [{ keyid: 'zz', sig: 'AAAA' }, ...env.signatures] };
    expect(verifyEnvelope(extra, { payloadType: 'application/x-test', keys: [key] }).ok).toBe(true);
  });
  test('a trusted keyid whose signature fails is signature_invalid, even next to a good one', () => {
    const bad = { ...env, signatures: [...env.signatures, { keyid: 'k1', sig: env.signatures[0]!.sig.replace(/^./, (c) => (c === 'A' ? 'B' : 'A')) }] };
    expect(verifyEnvelope(bad, { payloadType: 'application/x-test', keys: [key] })).toMatchObject({ ok: false, error: { code: 'signature_invalid' } });
  });
  test('non-canonical base64 is refused, not silently decoded', () => {
    expect(verifyEnvelope({ ...env, payload: env.payload + '\n' }, { payloadType: 'application/x-test', keys: [key] })).toMatchObject({ ok: false, error: { code: 'payload_not_base64' } });
    expect(verifyEnvelope({ ...env, signatures: [{ keyid: 'k1', sig: env.signatures[0]!.sig.slice(0, -4) }] }, { payloadType: 'application/x-test', keys: [key] })).toMatchObject({ ok: false, error: { code: 'signature_invalid' } });
    expect(verifyEnvelope({ ...env, signatures: [{ keyid: 'k1', sig: '!!!!' }] }, { payloadType: 'application/x-test', keys: [key] })).toMatchObject({ ok: false, error: { code: 'signature_malformed' } });
  });
  test('an envelope with more than MAX_SIGNATURES signatures is malformed, before any is verified', async () => {
    const { MAX_SIGNATURES } = await import('../attestation/dsse.ts');
    let verifications = 0;
    const { ed25519Verify } = await import('../attestation/ed25519.ts');
    const counting: DsseKey = { ...key, verify: (sig, msg, pk) => (verifications++, ed25519Verify(sig, msg, pk)) };
    const keyless = (n: number) => ({ ...env, signatures: Array.from({ length: n }, () => ({ sig: env.signatures[0]!.sig.replace(/^./, (c) => (c === 'A' ? 'B' : 'A')) })) });
    expect(verifyEnvelope(keyless(MAX_SIGNATURES + 1), { payloadType: 'application/x-test', keys: [counting] })).toMatchObject({ ok: false, error: { code: 'envelope_malformed', message: `envelope has ${MAX_SIGNATURES + 1} signatures, more than ${MAX_SIGNATURES}` } });
    expect(verifications).toBe(0);
    expect(parseEnvelope(JSON.stringify(keyless(10_000)))).toMatchObject({ ok: false, error: { code: 'envelope_malformed' } });
    // Up to the bound, every keyless signature is tried (and a good one among them still verifies).
    expect(verifyEnvelope(keyless(MAX_SIGNATURES), { payloadType: 'application/x-test', keys: [counting] })).toMatchObject({ ok: false, error: { code: 'signature_invalid' } });
    expect(verifications).toBe(MAX_SIGNATURES);
    expect(verifyEnvelope({ ...env, signatures: [...keyless(MAX_SIGNATURES - 1).signatures, { sig: env.signatures[0]!.sig }] }, { payloadType: 'application/x-test', keys: [key] }).ok).toBe(true);
  });
  test('parseEnvelope names truncated JSON and wrong shapes', () => {
    const text = serializeEnvelope(env);
    expect(parseEnvelope(text.slice(0, -3))).toMatchObject({ ok: false, error: { code: 'envelope_not_json' } });
    for (const bad of ['null', '[]', '"x"', '{}', '{"payloadType":"t","payload":"","signatures":[]}', '{"payloadType":1,"payload":"","signatures":[{"sig":""}]}', '{"payloadType":"t","payload":"","signatures":[{"sig":"","keyid":5}]}']) {
      expect(parseEnvelope(bad)).toMatchObject({ ok: false, error: { code: 'envelope_malformed' } });
    }
  });
  test('a key repeated in one object of the envelope is envelope_malformed (no reading is taken), whatever the reader', async () => {
    const { duplicateKey } = await import('../attestation/dsse.ts');
    const cheap = signEnvelope('application/x-test', utf8('{"cost":"1"}'), { keyid: 'k1', seed });
    const text = `{"payload":"${cheap.payload}","payload":"${env.payload}","payloadType":"application/x-test","signatures":${JSON.stringify(env.signatures)}}`;
    expect(verifyEnvelope(JSON.parse(text) as DsseEnvelope, { payloadType: 'application/x-test', keys: [key] }).ok).toBe(true); // (JSON.parse keeps the last)
    expect(parseEnvelope(text)).toMatchObject({ ok: false, error: { code: 'envelope_malformed', message: 'envelope has the key "payload" twice in one object' } });
    // Also escaped spellings, and inside a signature; the same key in sibling objects is fine.
    expect(duplicateKey('{"a":1,"\u0061":2}')).toBe('a');
    expect(duplicateKey('{"s":[{"k":1,"k":2}]}')).toBe('k');
    expect(duplicateKey('{"s":[{"k":1},{"k":2}],"t":{"k":"\"k\""},"u":["k","k"]}')).toBeUndefined();
    expect(duplicateKey('{"a":{"b":1},"b":2}')).toBeUndefined();
    expect(duplicateKey('{"a":{"b":1},"a":2}')).toBe('a');
  });
  test('DSSE interop: unknown fields are ignored, base64 may be URL-safe or unpadded, an empty keyid is no keyid, and a keyid is only a hint', () => {
    const opts = { payloadType: 'application/x-test', keys: [key] };
    const sig = env.signatures[0]!.sig;
    // Unknown fields (DSSE: "Consumers MUST ignore unrecognized fields"), in the envelope and a signature.
    const extra = parseEnvelope(JSON.stringify({ ...env, x_note: 'hi', signatures: [{ ...env.signatures[0], x: 1 }] }));
    expect(extra.ok && verifyEnvelope(extra.value, opts)).toMatchObject({ ok: true, value: { keyid: 'k1', standardBase64: true } });
    // URL-safe and unpadded base64 ("Either standard or URL-safe encoding is allowed").
    const url = (b64: string, pad: boolean) => (pad ? b64 : b64.replace(/=+$/, '')).replaceAll('+', '-').replaceAll('/', '_');
    const bytes = utf8('{"a":"~~~>>>???"}'); // base64 with "+" and "/" in it
    const e2 = signEnvelope('application/x-test', bytes, { keyid: 'k1', seed });
    expect(e2.payload).toMatch(/[+/]/);
    for (const pad of [true, false]) {
      const v = verifyEnvelope({ ...e2, payload: url(e2.payload, pad), signatures: [{ keyid: 'k1', sig: url(e2.signatures[0]!.sig, pad) }] }, opts);
      expect(v).toMatchObject({ ok: true, value: { standardBase64: false } });
      expect(v.ok && [...v.value.payload]).toEqual([...bytes]);
    }
    // Mixed alphabets, a lone extra character, or bad padding stay refused.
    const mixed = e2.payload.replace(/[+/]/, (c) => (c === '+' ? '-' : '_'));
    expect(mixed).toMatch(/[+/]/);
    for (const bad of [mixed, 'QQ==Q', 'Q===', 'QQ=', 'Q', 'QQ==\n', 'QR']) {
      expect(verifyEnvelope({ ...e2, payload: bad }, opts), bad).toMatchObject({ ok: false, error: { code: 'payload_not_base64' } });
    }
    // An empty keyid is treated as none ("An unset field MUST be treated the same as set-but-empty").
    expect(verifyEnvelope({ ...env, signatures: [{ keyid: '', sig }] }, opts)).toMatchObject({ ok: true, value: { keyid: 'k1' } });
    // A keyid naming no trusted key: the signature is still tried (the keyid is a hint), and a
    // good one verifies; one by an untrusted key is ignored (unknown_key, not signature_invalid).
    expect(verifyEnvelope({ ...env, signatures: [{ keyid: 'market-key-2026', sig }] }, opts)).toMatchObject({ ok: true, value: { keyid: 'k1', signature: { keyid: 'market-key-2026' } } });
    const stranger = signEnvelope('application/x-test', utf8('{"a":1}'), { keyid: 'someone', seed: new Uint8Array(32).fill(8) });
    expect(verifyEnvelope(stranger, opts)).toMatchObject({ ok: false, error: { code: 'unknown_key' } });
  });
});

describe('envelopeLine', () => {
  test('is exactly serializeEnvelope for one signature', async () => {
    const { envelopeLine } = await import('../attestation/dsse.ts');
    const seed = new Uint8Array(32).fill(3);
    for (const type of ['application/vnd.service.receipt.v1+json', 'x/"quoted"\\', 'ünï']) {
      const env = signEnvelope(type, utf8('{"a":"b"}'), { keyid: 'ab'.repeat(32), seed });
      expect(envelopeLine(env.payload, type, env.signatures[0]!.keyid!, env.signatures[0]!.sig)).toBe(serializeEnvelope(env));
    }
  });
});

describe('PAE decoded straight from base64', () => {
  test('equals pae over the decoded bytes, and the payload view is those bytes', () => {
    for (let n = 0; n < 70; n++) {
      const b = new Uint8Array(crypto.randomBytes(n));
      const got = paeOfBase64('application/x-test', Buffer.from(b).toString('base64'))!;
      expect(toHex(got.message)).toBe(toHex(pae('application/x-test', b)));
      expect(toHex(got.payload)).toBe(toHex(b));
    }
  });
  test('refuses every lenient form the byte decoder refuses', () => {
    for (const bad of LENIENT_BASE64) expect(paeOfBase64('t', bad), bad).toBeUndefined();
  });
  test('accepts exactly the canonical encodings, as Buffer round-trips define them (fuzz)', () => {
    let refused = 0;
    let accepted = 0;
    for (const { s, canonical, bytes } of base64Candidates(5000)) {
      const got = paeOfBase64('t', s);
      expect(got !== undefined, JSON.stringify(s)).toBe(canonical);
      if (canonical) {
        accepted++;
        expect(toHex(got!.message)).toBe(toHex(pae('t', bytes)));
      } else refused++;
    }
    expect(refused).toBeGreaterThan(0);
    expect(accepted).toBeGreaterThan(0);
  });
});
