// The common middle of every signed-object check: the signed bytes must be UTF-8, RFC 8785
// canonical JSON, and a valid payload of the expected kind (the validator names the bad field).
import { fromBase64, fromHex, fromUtf8, isHex } from './bytes.ts';
import { checkEnvelopeShape, parseEnvelope, verifyEnvelope, type DsseEnvelope } from './dsse.ts';
import { parseCanonical } from './canonical-json.ts';
import { FieldError } from './fields.ts';
import { fail, guarded, isOptions, ok, unknownOption, type VerifyResult } from './result.ts';

export function readPayload<T>(bytes: Uint8Array, validate: (value: unknown) => T, what: string): VerifyResult<T> {
  const text = fromUtf8(bytes);
  const parsed = text === undefined ? undefined : parseCanonical(text);
  if (!parsed) return fail('payload_not_json', `${what} payload is not UTF-8 JSON`);
  if (!parsed.canonical) return fail('payload_not_canonical', `${what} payload is not RFC 8785 canonical JSON${parsed.why ? ` (${parsed.why})` : ''}`);
  try {
    return ok(validate(parsed.value));
  } catch (e) {
    if (e instanceof FieldError) return fail('payload_invalid', `${what} ${e.message}`, { field: e.field });
    throw e;
  }
}

/**
 * The payload of an envelope as a JSON object, UNVERIFIED: only to find the key or ticket to verify
 * with, or to name a seq in a report. Undefined when it is not base64 UTF-8 JSON of an object.
 */
export function peekPayload(env: Pick<DsseEnvelope, 'payload'>): Record<string, unknown> | undefined {
  try {
    return peekPayloadBytes(payloadBytes(env));
  } catch {
    return undefined; // (not an envelope at all: undefined, or a getter that throws)
  }
}

/** An envelope's payload bytes (base64 decoded), or undefined (none, or not base64). */
export function payloadBytes(env: Pick<DsseEnvelope, 'payload'> | undefined): Uint8Array | undefined {
  const payload: unknown = env?.payload;
  return typeof payload === 'string' ? fromBase64(payload) : undefined;
}

/** Payload bytes as a JSON object, UNVERIFIED (as peekPayload); undefined when not UTF-8 JSON of an object. */
export function peekPayloadBytes(bytes: Uint8Array | undefined): Record<string, unknown> | undefined {
  try {
    const text = bytes && fromUtf8(bytes);
    const v: unknown = text === undefined ? undefined : JSON.parse(text);
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

/** The payload of an envelope given as its JSON text (a log line), best effort: undefined when it cannot be read. Never throws. */
export function peekLine(line: string): Record<string, unknown> | undefined {
  try {
    return peekPayload(JSON.parse(line) as DsseEnvelope);
  } catch {
    return undefined;
  }
}

/**
 * Verifies an object a provider signs about itself (a price list, a request contract): the
 * envelope (or its JSON text), a signature by the provider's key (keyid = provider id), the
 * payload canonical and valid, and naming that provider. Never throws.
 */
export function verifyProviderSigned<T extends { provider: string }>(envelope: DsseEnvelope | string, opts: { provider: string }, payloadType: string, validate: (value: unknown) => T, what: string): VerifyResult<T> {
  return guarded('envelope_malformed', what, () => {
    if (!isOptions(opts) || unknownOption(opts, ['provider']) !== undefined || typeof opts.provider !== 'string') return fail('options_invalid', 'options must be an object { provider } (the provider id)');
    if (!isHex(opts.provider, 32)) return fail('unknown_key', 'provider must be 64 lowercase hex characters');
    const shaped = typeof envelope === 'string' ? parseEnvelope(envelope) : checkEnvelopeShape(envelope);
    if (!shaped.ok) return shaped;
    const v = verifyEnvelope(shaped.value, { payloadType, keys: [{ keyid: opts.provider, publicKey: fromHex(opts.provider) }] });
    if (!v.ok) return v;
    const read = readPayload(v.value.payload, validate, what);
    if (!read.ok) return read;
    if (read.value.provider !== opts.provider) return fail('provider_mismatch', `${what} names provider ${read.value.provider}`);
    return ok(read.value);
  });
}
