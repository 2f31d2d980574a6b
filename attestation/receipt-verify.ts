// Verifying one receipt envelope: signature first, then the exact payload bytes (canonical JSON,
// every field), then the arithmetic (cost from usage and rates, never above the hold).
import { copyBytes, fromHex, isHex, toHex, utf8 } from './bytes.ts';
import { checkEnvelopeShape, parseEnvelope, parseEnvelopeLine, serializeEnvelope, verifyEnvelope, type DsseEnvelope, type DsseKey, type DsseSignature } from './dsse.ts';
import { peekPayload, readPayload } from './signed-payload.ts';
import { sha256Hex } from './hash.ts';
import { leafHash } from './merkle.ts';
import { expectedCost, RECEIPT_PAYLOAD_TYPE, validateReceiptPayload, type ReceiptPayload } from './receipt.ts';
import { guarded, fail, isOptions, ok, unknownOption, type VerifyError, type VerifyResult } from './result.ts';

const RECEIPT_OPTIONS = ['provider', 'chain'];

export interface VerifiedReceipt {
  payload: ReceiptPayload;
  /** The exact signed payload bytes. */
  payloadBytes: Uint8Array;
  envelope: DsseEnvelope;
  /** The provider's signature in the envelope (an envelope may carry others, by unknown keys). */
  signature: DsseSignature;
  /** SHA-256 of the payload bytes, hex: what the next receipt's `prev` must be (with `chain`). */
  payloadSha256?: string;
  /** The Merkle leaf hash of this envelope (with `chain`). */
  leafHash?: Uint8Array;
}

export interface ReceiptVerifyOptions {
  /** The provider id (hex of its Ed25519 public key) or the key itself. */
  provider: string | Uint8Array;
  /**
   * Also compute payloadSha256 and leafHash, for checking a chain or a log. A log line (JSON text)
   * must then be the envelope's canonical serialisation, because its bytes are the Merkle leaf.
   */
  chain?: boolean;
}

/** Strictly verifies one receipt envelope (an object or its JSON text). Never throws. */
export function verifyReceipt(envelope: DsseEnvelope | string, opts: ReceiptVerifyOptions): VerifyResult<VerifiedReceipt> {
  // The options are read once, first, under their own name: a getter that throws is the options' fault, not the envelope's.
  const read = guarded('options_invalid', 'options', () => readReceiptOptions(opts));
  if (!read.ok) return read;
  return guarded('envelope_malformed', 'envelope', () => verifyReceiptUnsafe(envelope, read.value));
}

function readReceiptOptions(opts: unknown): VerifyResult<ReceiptVerifyOptions> {
  if (!isOptions(opts) || unknownOption(opts, RECEIPT_OPTIONS) !== undefined) return fail('options_invalid', 'options must be an object { provider, chain? }');
  const { provider, chain } = opts;
  if (provider === undefined) return fail('options_invalid', 'options.provider is required: the provider id (64 hex characters) or its 32-byte key');
  if (chain !== undefined && typeof chain !== 'boolean') return fail('options_invalid', 'options.chain must be true or false');
  return ok({ provider: provider as string | Uint8Array, ...(chain === true ? { chain } : {}) });
}

// Receipts are usually checked many at a time against one provider: remember the last key.
interface ProviderKey {
  id: string;
  key: Uint8Array;
  keys: DsseKey[];
}
let lastKey: ProviderKey | undefined;

function providerKey(p: string | Uint8Array): ProviderKey | undefined {
  const make = (id: string, key: Uint8Array): ProviderKey => ({ id, key, keys: [{ keyid: id, publicKey: key }] });
  if (typeof p === 'string') {
    if (lastKey?.id === p) return lastKey;
    return isHex(p, 32) ? (lastKey = make(p, fromHex(p))) : undefined;
  }
  return p instanceof Uint8Array && p.length === 32 ? make(toHex(p), copyBytes(p)) : undefined;
}

function verifyReceiptUnsafe(envelope: DsseEnvelope | string, opts: ReceiptVerifyOptions): VerifyResult<VerifiedReceipt> {
  const pk = providerKey(opts.provider);
  if (!pk) return fail('unknown_key', 'provider must be 64 lowercase hex characters or a 32-byte key');
  // A log line in the canonical one-signature shape is read without JSON.parse (see parseEnvelopeLine).
  const line = typeof envelope === 'string' ? parseEnvelopeLine(envelope) : undefined;
  let env: DsseEnvelope;
  if (line) env = line;
  else {
    const shaped = typeof envelope === 'string' ? parseEnvelope(envelope) : checkEnvelopeShape(envelope);
    if (!shaped.ok) return shaped;
    env = shaped.value;
  }
  const verified = verifyEnvelope(env, { payloadType: RECEIPT_PAYLOAD_TYPE, keys: pk.keys });
  if (!verified.ok) {
    // A line read by parseEnvelopeLine may hold a raw control character (not JSON at all): the
    // general parse names that first, whatever else is wrong with the line. Failures are rare.
    if (line) {
      const shaped = parseEnvelope(envelope as string);
      if (!shaped.ok) return shaped;
    }
    return verified;
  }
  const payloadBytes = verified.value.payload;
  const read = readPayload(payloadBytes, validateReceiptPayload, 'receipt');
  if (!read.ok) return read;
  const payload = read.value;
  const seq = payload.seq;
  if (payload.provider !== pk.id) return fail('provider_mismatch', `receipt names provider ${payload.provider}`, { seq });
  const cost = expectedCost(payload);
  const stated = BigInt(payload.cost_micro_usd);
  if (stated !== cost) return fail('cost_mismatch', `cost_micro_usd is ${stated}, usage × rates gives ${cost}`, { seq });
  if (stated > BigInt(payload.hold_micro_usd)) {
    return fail('cost_exceeds_hold', `cost ${stated} exceeds hold ${payload.hold_micro_usd}`, { seq });
  }
  const out: VerifiedReceipt = { payload, payloadBytes, envelope: env, signature: verified.value.signature };
  if (opts.chain) {
    // A line that parseEnvelopeLine read (and that verified) is already its envelope's canonical JSON.
    // Only the envelope's own fields: a reader ignores unknown ones, but a line that carries any is
    // not the one serialisation of its envelope (and would give the same receipt another leaf).
    const canonical = line ? (envelope as string) : serializeEnvelope(envelopeFields(env));
    // (A line is what this project writes: base64 standard and padded, though DSSE lets a reader take others.)
    if ((typeof envelope === 'string' && envelope !== canonical) || !verified.value.standardBase64) {
      return fail('envelope_not_canonical', 'the line is not the canonical JSON of its envelope (the bytes the Merkle leaf commits to)', { seq });
    }
    // The keyid is not signed: a copy under another (or none, or with a second signature) verifies
    // as the receipt does, but it is not the provider's log line, whose leaf names its id.
    if (env.signatures.length !== 1 || env.signatures[0]!.keyid !== pk.id) {
      return fail('envelope_not_canonical', 'a log line carries exactly one signature, under keyid = the provider id (the line the provider\'s log holds)', { seq });
    }
    out.payloadSha256 = sha256Hex(payloadBytes);
    out.leafHash = leafHash(utf8(canonical));
  }
  return ok(out);
}

/** An envelope with DSSE's fields only (what this project writes). */
function envelopeFields(env: DsseEnvelope): DsseEnvelope {
  return {
    payload: env.payload,
    payloadType: env.payloadType,
    signatures: env.signatures.map((s) => (s.keyid === undefined ? { sig: s.sig } : { keyid: s.keyid, sig: s.sig })),
  };
}

/** Attaches a seq to an error that concerns one receipt. */
export function withSeq(error: VerifyError, seq: string | undefined): VerifyError {
  return seq === undefined || error.seq !== undefined ? error : { ...error, seq };
}

/**
 * Best-effort read of the seq a (possibly tampered) envelope claims, only to name it in an error
 * report. Never trusted for anything else.
 */
export function peekSeq(envelope: string | DsseEnvelope): string | undefined {
  let env: DsseEnvelope;
  try {
    env = typeof envelope === 'string' ? (JSON.parse(envelope) as DsseEnvelope) : envelope;
  } catch {
    return undefined;
  }
  const seq = env !== null && typeof env === 'object' ? peekPayload(env)?.seq : undefined;
  return typeof seq === 'string' && /^(0|[1-9][0-9]{0,29})$/.test(seq) ? seq : undefined;
}
