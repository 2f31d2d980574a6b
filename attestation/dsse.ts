// DSSE envelopes (secure-systems-lab/dsse v1): the signature covers PAE(payloadType, payload), never
// a re-serialisation, so the verifier checks exactly the bytes it was given.
import { base64DecodedLength, decodeBase64Into, fromBase64, newBytes, toBase64, utf8 } from './bytes.ts';
import { ed25519Sign, ed25519Verify } from './ed25519.ts';
import { fail, ok, type VerifyResult } from './result.ts';
import { canonicalize } from './canonical-json.ts';

export interface DsseSignature {
  keyid?: string;
  sig: string;
}

export interface DsseEnvelope {
  payloadType: string;
  payload: string;
  signatures: DsseSignature[];
}

/** A key that may have signed an envelope. `verify` defaults to strict Ed25519. */
export interface DsseKey {
  keyid: string;
  publicKey: Uint8Array;
  verify?: (signature: Uint8Array, message: Uint8Array, publicKey: Uint8Array) => boolean;
}

const PAE_PREFIX = 'DSSEv1 ';

/** "DSSEv1 LEN(type) type " as bytes, per payload type (a handful are ever used). */
const typePrefixes = new Map<string, Uint8Array>();

function typePrefix(payloadType: string): Uint8Array {
  let prefix = typePrefixes.get(payloadType);
  if (prefix === undefined) {
    prefix = utf8(`${PAE_PREFIX}${utf8(payloadType).length} ${payloadType} `);
    if (typePrefixes.size < 64) typePrefixes.set(payloadType, prefix);
  }
  return prefix;
}

/**
 * A PAE array for a body of `length` bytes, filled up to the body, and where the body starts.
 * `transient`: the array is used and dropped at once (signing, verifying), so it may be a slice of
 * Node's shared pool (newBytes); anything handed to a caller to keep is its own array.
 */
function paeHead(payloadType: string, length: number, transient: boolean): { out: Uint8Array; bodyAt: number } {
  const size = paeSize(payloadType, length);
  const out = transient ? newBytes(size) : new Uint8Array(size);
  return { out, bodyAt: writePaeHead(out, payloadType, length) };
}

/** The bytes of PAE for a body of `length` bytes. */
function paeSize(payloadType: string, length: number): number {
  return typePrefix(payloadType).length + String(length).length + 1 + length;
}

/** Writes PAE up to the body into `out`; returns where the body starts. */
function writePaeHead(out: Uint8Array, payloadType: string, length: number): number {
  const prefix = typePrefix(payloadType);
  const len = String(length);
  out.set(prefix);
  let o = prefix.length;
  for (let i = 0; i < len.length; i++) out[o++] = len.charCodeAt(i);
  out[o++] = 0x20;
  return o;
}

/** Pre-Authentication Encoding: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body. The caller's own array. */
export function pae(payloadType: string, payload: Uint8Array): Uint8Array {
  return paeInto(payloadType, payload, false);
}

/**
 * PAE written into `scratch` when it is large enough, else into a new transient array: a view of
 * the message, for a signer that signs one after another and drops each at once.
 */
export function paeInScratch(scratch: Uint8Array, payloadType: string, payload: Uint8Array): Uint8Array {
  const size = paeSize(payloadType, payload.length);
  if (size > scratch.length) return transientPae(payloadType, payload);
  scratch.set(payload, writePaeHead(scratch, payloadType, payload.length));
  return scratch.subarray(0, size);
}

/** PAE for a message signed at once and dropped (see paeHead). */
export function transientPae(payloadType: string, payload: Uint8Array): Uint8Array {
  return paeInto(payloadType, payload, true);
}

function paeInto(payloadType: string, payload: Uint8Array, transient: boolean): Uint8Array {
  const { out, bodyAt } = paeHead(payloadType, payload.length, transient);
  out.set(payload, bodyAt);
  return out;
}

/**
 * PAE over a base64 payload, decoded straight into place (one array, one copy), with the payload
 * bytes as a view into it. Undefined when the payload is not strict standard base64.
 */
export function paeOfBase64(payloadType: string, payloadB64: string): { message: Uint8Array; payload: Uint8Array } | undefined {
  const n = base64DecodedLength(payloadB64);
  if (n === undefined) return undefined;
  const { out, bodyAt } = paeHead(payloadType, n, true);
  return decodeBase64Into(payloadB64, out, bodyAt) ? { message: out, payload: out.subarray(bodyAt) } : undefined;
}

/** Signs payload bytes with an Ed25519 seed. */
export function signEnvelope(payloadType: string, payload: Uint8Array, signer: { keyid: string; seed: Uint8Array }): DsseEnvelope {
  const sig = ed25519Sign(signer.seed, transientPae(payloadType, payload));
  // Keys in canonical order, so serializeEnvelope takes canonicalize's fast path.
  return { payload: toBase64(payload), payloadType, signatures: [{ keyid: signer.keyid, sig: toBase64(sig) }] };
}

/**
 * The most signatures an envelope may carry. DSSE sets no bound, but every signature without a
 * known keyid is tried against every trusted key: a peer could otherwise make one 1 MiB ticket
 * cost ten thousand verifications before it is refused. Real envelopes carry one or two.
 */
export const MAX_SIGNATURES = 16;

const tooManySignatures = (n: number) => fail('envelope_malformed', `envelope has ${n} signatures, more than ${MAX_SIGNATURES}`);

/**
 * Checks the envelope's shape (from parsed JSON). Unknown fields, in the envelope or a signature,
 * are ignored, as DSSE requires of consumers; they are not signed. (A receipt log line must still
 * be its envelope's canonical serialisation, which has none: receipt-verify.ts.)
 */
export function checkEnvelopeShape(value: unknown): VerifyResult<DsseEnvelope> {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return fail('envelope_malformed', 'envelope is not a JSON object');
  }
  const env = value as Record<string, unknown>;
  if (typeof env.payloadType !== 'string') return fail('envelope_malformed', 'envelope.payloadType must be a string');
  if (typeof env.payload !== 'string') return fail('envelope_malformed', 'envelope.payload must be a string');
  if (!Array.isArray(env.signatures) || env.signatures.length === 0) {
    return fail('envelope_malformed', 'envelope.signatures must be a non-empty array');
  }
  if (env.signatures.length > MAX_SIGNATURES) return tooManySignatures(env.signatures.length);
  for (const [i, s] of env.signatures.entries()) {
    if (s === null || typeof s !== 'object' || typeof (s as DsseSignature).sig !== 'string') {
      return fail('envelope_malformed', `envelope.signatures[${i}].sig must be a string`);
    }
    const keyid = (s as DsseSignature).keyid;
    if (keyid !== undefined && typeof keyid !== 'string') {
      return fail('envelope_malformed', `envelope.signatures[${i}].keyid must be a string`);
    }
  }
  return ok(env as unknown as DsseEnvelope);
}

// The canonical one-signature envelope line (envelopeLine), piece by piece.
const LINE_HEAD = '{"payload":"';
const LINE_TYPE = '","payloadType":"';
const LINE_KEYID = '","signatures":[{"keyid":"';
const LINE_SIG = '","sig":"';
const LINE_TAIL = '"}]}';
/** Printable ASCII but `"` and `\`: JSON and JCS write such a string exactly as it is. */
const PLAIN_STRING = /^[\x20\x21\x23-\x5b\x5d-\x7e]+$/;

/**
 * Reads a line in exactly envelopeLine's shape (one signature with a keyid) without JSON.parse:
 * string slices between fixed pieces, payloadType and keyid plain ASCII, no backslash anywhere.
 * Such a line's strings hold no escapes, so the result is what JSON.parse would give, and the line
 * is that envelope's canonical serialisation. One difference is left to the caller: a raw control
 * character inside payload or sig (JSON.parse refuses it) passes here; strict base64 decoding then
 * refuses it, and the caller asks parseEnvelope for the right error (envelope_not_json). Undefined
 * for anything else: the caller falls back to parseEnvelope.
 */
export function parseEnvelopeLine(text: string): DsseEnvelope | undefined {
  if (!text.startsWith(LINE_HEAD)) return undefined;
  const payloadAt = LINE_HEAD.length;
  const payloadEnd = text.indexOf('"', payloadAt);
  if (payloadEnd < 0 || !text.startsWith(LINE_TYPE, payloadEnd)) return undefined;
  const typeAt = payloadEnd + LINE_TYPE.length;
  const typeEnd = text.indexOf('"', typeAt);
  if (typeEnd < 0 || !text.startsWith(LINE_KEYID, typeEnd)) return undefined;
  const keyidAt = typeEnd + LINE_KEYID.length;
  const keyidEnd = text.indexOf('"', keyidAt);
  if (keyidEnd < 0 || !text.startsWith(LINE_SIG, keyidEnd)) return undefined;
  const sigAt = keyidEnd + LINE_SIG.length;
  const sigEnd = text.indexOf('"', sigAt);
  if (sigEnd < 0 || sigEnd + LINE_TAIL.length !== text.length || !text.endsWith(LINE_TAIL)) return undefined;
  const payloadType = text.slice(typeAt, typeEnd);
  const keyid = text.slice(keyidAt, keyidEnd);
  if (!PLAIN_STRING.test(payloadType) || !PLAIN_STRING.test(keyid)) return undefined;
  const payload = text.slice(payloadAt, payloadEnd);
  const sig = text.slice(sigAt, sigEnd);
  if (payload.includes('\\') || sig.includes('\\')) return undefined;
  return { payload, payloadType, signatures: [{ keyid, sig }] };
}

/**
 * Parses envelope JSON text. Truncated or non-JSON text gets envelope_not_json; a key repeated in
 * one object is envelope_malformed: JSON.parse keeps the last `payload`, a reader that keeps the
 * first would show another receipt, so neither reading is taken.
 */
export function parseEnvelope(text: string): VerifyResult<DsseEnvelope> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return fail('envelope_not_json', 'envelope is not valid JSON (truncated or corrupted?)');
  }
  const twice = duplicateKey(text);
  if (twice !== undefined) return fail('envelope_malformed', `envelope has the key ${JSON.stringify(twice.slice(0, 40))} twice in one object`);
  return checkEnvelopeShape(value);
}

/** The first key that appears twice in one object of `text`, which must be well-formed JSON. */
export function duplicateKey(text: string): string | undefined {
  const objects: (Set<string> | null)[] = []; // one entry per open object (its keys) or array (null)
  let keyNext = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      let j = i + 1;
      while (text.charCodeAt(j) !== 0x22) j += text.charCodeAt(j) === 0x5c ? 2 : 1;
      const keys = objects[objects.length - 1];
      if (keyNext && keys) {
        const key = JSON.parse(text.slice(i, j + 1)) as string;
        if (keys.has(key)) return key;
        keys.add(key);
        keyNext = false;
      }
      i = j;
    } else if (c === 0x7b) {
      objects.push(new Set());
      keyNext = true;
    } else if (c === 0x5b) {
      objects.push(null);
      keyNext = false;
    } else if (c === 0x7d || c === 0x5d) {
      objects.pop();
      keyNext = false;
    } else if (c === 0x2c) {
      keyNext = objects[objects.length - 1] != null;
    }
  }
  return undefined;
}

export interface VerifiedEnvelope {
  payload: Uint8Array;
  keyid: string;
  /** The first signature that verified under a trusted key (others may be by unknown keys). */
  signature: DsseSignature;
  /** Whether the payload and that signature are strict standard base64 (what this project writes). */
  standardBase64: boolean;
}

const URL_SAFE_B64 = /^[A-Za-z0-9_-]*={0,2}$/;

/**
 * DSSE lets a producer write base64 "standard or URL-safe", padded or not: the standard padded
 * text of such a string (the decoders stay strict, so each form still has one reading), or
 * undefined when it is neither. A string may not mix the two alphabets.
 */
function dsseBase64ToStandard(s: string): string | undefined {
  if (typeof s !== 'string' || !URL_SAFE_B64.test(s.replaceAll('+', '-').replaceAll('/', '_'))) return undefined;
  if ((s.includes('+') || s.includes('/')) && (s.includes('-') || s.includes('_'))) return undefined;
  const bare = s.replace(/=+$/, '');
  if (bare.length % 4 === 1 || (s.length !== bare.length && s.length % 4 !== 0)) return undefined;
  return bare.replaceAll('-', '+').replaceAll('_', '/') + '='.repeat((4 - (bare.length % 4)) % 4);
}

/** Strict standard base64, or (DSSE) its URL-safe or unpadded forms; undefined for anything else. */
function dsseFromBase64(s: string): { bytes: Uint8Array; standard: boolean } | undefined {
  const strict = fromBase64(s);
  if (strict) return { bytes: strict, standard: true };
  const std = dsseBase64ToStandard(s);
  const bytes = std === undefined ? undefined : fromBase64(std);
  return bytes ? { bytes, standard: false } : undefined;
}

/** The trusted key a signature's keyid names, if any (an empty keyid names none). */
function namedKey(keys: readonly DsseKey[], s: DsseSignature): DsseKey | undefined {
  if (!s.keyid) return undefined;
  for (const k of keys) if (k.keyid === s.keyid) return k;
  return undefined;
}

const verifiesUnder = (k: DsseKey, sig: Uint8Array, message: Uint8Array): boolean => (k.verify ?? ed25519Verify)(sig, message, k.publicKey);

/**
 * Verifies an envelope against trusted keys. A signature whose keyid names a trusted key must
 * verify under it, or the envelope fails (signature_invalid), even next to a good one. The keyid is
 * only a hint (DSSE): when no named signature verified, signatures without one (or with an empty
 * one) and those naming a key not trusted here are tried against every trusted key. A keyless one
 * that verifies under none fails the envelope (signature_invalid); one naming an unknown key is
 * someone else's and is ignored. No signature by a trusted key: unknown_key.
 */
export function verifyEnvelope(env: DsseEnvelope, opts: { payloadType: string; keys: readonly DsseKey[] }): VerifyResult<VerifiedEnvelope> {
  // Checked here too (for envelopes that did not come through checkEnvelopeShape): each signature
  // costs verifications, and a hostile envelope must not buy unbounded work.
  if (env.signatures.length > MAX_SIGNATURES) return tooManySignatures(env.signatures.length);
  if (env.payloadType !== opts.payloadType) {
    return fail('payload_type_mismatch', `payloadType is "${String(env.payloadType).slice(0, 100)}", expected "${opts.payloadType}"`);
  }
  let decoded = paeOfBase64(env.payloadType, env.payload);
  const payloadStandard = decoded !== undefined;
  if (!decoded) {
    const std = dsseBase64ToStandard(env.payload);
    if (std !== undefined) decoded = paeOfBase64(env.payloadType, std);
  }
  if (!decoded) return fail('payload_not_base64', 'envelope.payload is not base64 (standard or URL-safe)');
  const { message, payload } = decoded;
  const keys = opts.keys;
  // Signatures that name a trusted key first: each must verify under it.
  let first: { key: DsseKey; signature: DsseSignature; standard: boolean } | undefined;
  for (const s of env.signatures) {
    const key = namedKey(keys, s);
    if (!key) continue;
    const sig = dsseFromBase64(s.sig);
    if (!sig) return fail('signature_malformed', 'a signature is not base64 (standard or URL-safe)');
    if (!verifiesUnder(key, sig.bytes, message)) return fail('signature_invalid', `signature by ${s.keyid!.slice(0, 80)} does not verify`);
    first ??= { key, signature: s, standard: sig.standard };
  }
  // The caller's own copy of the payload: `message` may be a slice of Node's shared pool (see newBytes).
  if (first) return ok({ payload: payload.slice(), keyid: first.key.keyid, signature: first.signature, standardBase64: payloadStandard && first.standard });
  // Then the rest, against every trusted key.
  let failedKeyless = false;
  for (const s of env.signatures) {
    if (namedKey(keys, s)) continue;
    const keyless = !s.keyid;
    const sig = dsseFromBase64(s.sig);
    if (!sig) {
      if (keyless) return fail('signature_malformed', 'a signature is not base64 (standard or URL-safe)');
      continue;
    }
    const key = keys.find((k) => verifiesUnder(k, sig.bytes, message));
    if (key) return ok({ payload: payload.slice(), keyid: key.keyid, signature: s, standardBase64: payloadStandard && sig.standard });
    if (keyless) failedKeyless = true;
  }
  if (failedKeyless) return fail('signature_invalid', 'no signature verifies under a trusted key');
  return fail('unknown_key', 'no signature by a trusted key');
}

/**
 * serializeEnvelope for the common case of one signature, built directly: base64 and lowercase hex
 * need no escaping, so this is byte for byte what canonicalize gives (a test holds it to that).
 */
export function envelopeLine(payloadB64: string, payloadType: string, keyid: string, sigB64: string): string {
  return `{"payload":"${payloadB64}${envelopeLineMiddle(payloadType, keyid)}${sigB64}"}]}`;
}

/** What an envelope line holds between its payload's base64 and its signature's (see envelopeLine). */
export function envelopeLineMiddle(payloadType: string, keyid: string): string {
  return `","payloadType":${JSON.stringify(payloadType)},"signatures":[{"keyid":${JSON.stringify(keyid)},"sig":"`;
}

/**
 * The one serialisation of an envelope that this project writes: RFC 8785 canonical JSON. It is a
 * line of receipts.jsonl and the leaf data of the transparency log.
 */
export function serializeEnvelope(env: DsseEnvelope): string {
  return canonicalize(env);
}
