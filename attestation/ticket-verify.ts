// Verifying a ticket: signed by a configured marketplace key, well-formed, for this provider, in
// its validity window, and (when the body is known) for exactly these body bytes. Whether its id
// was used before is the node's business (it keeps the set), not the verifier's.
import { fromHex, isHex, toHex } from './bytes.ts';
import { checkEnvelopeShape, parseEnvelope, verifyEnvelope, type DsseEnvelope } from './dsse.ts';
import { readPayload } from './signed-payload.ts';
import { sha256Hex } from './hash.ts';
import { guarded, fail, isOptions, ok, unknownOption, type VerifyResult } from './result.ts';
import { TICKET_PAYLOAD_TYPE, validateTicketPayload, type TicketPayload } from './ticket.ts';

export interface MarketplaceKey {
  /** The key id the marketplace puts in its envelopes (lowercase hex of the public key by default). */
  keyid?: string;
  publicKey: Uint8Array | string;
  /**
   * The signature check for this key (default ed25519Verify). A node that verifies tickets from
   * strangers passes one that bounds the costly re-check (ed25519VerifyFast); a check that is not
   * ed25519Verify's rule must answer no more often than it, never more yes.
   */
  verify?: (signature: Uint8Array, message: Uint8Array, publicKey: Uint8Array) => boolean;
}

export interface TicketVerifyOptions {
  marketplaceKeys: readonly MarketplaceKey[];
  /** This node's provider id: a ticket for anyone else is refused. */
  provider?: string;
  /** Now, in ms since the epoch (default Date.now()). */
  now?: number;
  /** Clock skew tolerated on both ends of the validity window (default 30 s). */
  skewMs?: number;
  /** The exact request body bytes, or their SHA-256 hex, to bind the ticket to. */
  body?: Uint8Array | string;
}

export interface VerifiedTicket {
  payload: TicketPayload;
  keyid: string;
}

/**
 * Marketplace keys as the DSSE verifier takes them: 32 bytes each, the keyid defaulting to the
 * key's hex. Undefined when one is not a key. Callers that verify many tickets decode once.
 */
export function decodeMarketplaceKeys(keys: readonly MarketplaceKey[]): DecodedMarketplaceKey[] | undefined {
  const out: DecodedMarketplaceKey[] = [];
  for (const k of keys) {
    const publicKey = typeof k.publicKey === 'string' ? (isHex(k.publicKey, 32) ? fromHex(k.publicKey) : undefined) : k.publicKey;
    if (!publicKey || publicKey.length !== 32) return undefined;
    if (k.verify !== undefined && typeof k.verify !== 'function') return undefined;
    out.push({ keyid: k.keyid ?? toHex(publicKey), publicKey, ...(k.verify ? { verify: k.verify } : {}) });
  }
  return out;
}

export interface DecodedMarketplaceKey {
  keyid: string;
  publicKey: Uint8Array;
  verify?: MarketplaceKey['verify'];
}

export function verifyTicket(envelope: DsseEnvelope | string, opts: TicketVerifyOptions): VerifyResult<VerifiedTicket> {
  // The options are read first, under their own name: a getter that throws is the options' fault,
  // not the ticket's (as verifyReceipt has it).
  const read = guarded('options_invalid', 'options', () => {
    const problem = ticketOptionsProblem(opts);
    return problem ? fail('options_invalid', problem) : ok(undefined);
  });
  if (!read.ok) return read;
  return guarded('envelope_malformed', 'ticket', () => verifyTicketUnsafe(envelope, opts));
}

const TICKET_OPTIONS = ['marketplaceKeys', 'provider', 'now', 'skewMs', 'body'];

/** Why the options cannot be used, or undefined: a NaN or infinite clock would make every window pass. */
function ticketOptionsProblem(opts: unknown): string | undefined {
  if (!isOptions(opts)) return 'options must be an object { marketplaceKeys, provider?, now?, skewMs?, body? }';
  // A pin under a misspelt name, or given as undefined (an unset variable), must not quietly check nothing.
  const unknown = unknownOption(opts, TICKET_OPTIONS);
  if (unknown !== undefined) return `unknown option ${JSON.stringify(unknown.slice(0, 40))} (options: ${TICKET_OPTIONS.join(', ')})`;
  for (const pin of ['provider', 'body'] as const) if (pin in opts && opts[pin] === undefined) return `${pin} is undefined: leave it out to check no ${pin}`;
  if (!Array.isArray(opts.marketplaceKeys) || opts.marketplaceKeys.some((k) => !isOptions(k))) return 'marketplaceKeys must be an array of { publicKey, keyid? }';
  if (opts.provider !== undefined && typeof opts.provider !== 'string') return 'provider must be a string';
  if (opts.now !== undefined && !Number.isFinite(opts.now)) return 'now must be a finite number of ms since the epoch';
  if (opts.skewMs !== undefined && !(Number.isFinite(opts.skewMs) && (opts.skewMs as number) >= 0)) return 'skewMs must be a finite number ≥ 0';
  if (opts.body !== undefined && typeof opts.body !== 'string' && !(opts.body instanceof Uint8Array)) return 'body must be the body bytes or their SHA-256 hex';
  return undefined;
}

function verifyTicketUnsafe(envelope: DsseEnvelope | string, opts: TicketVerifyOptions): VerifyResult<VerifiedTicket> {
  const shaped = typeof envelope === 'string' ? parseEnvelope(envelope) : checkEnvelopeShape(envelope);
  if (!shaped.ok) return shaped;
  const keys = decodeMarketplaceKeys(opts.marketplaceKeys);
  if (!keys) return fail('unknown_key', 'a marketplace key is not 32 bytes (64 hex characters), or its verify is not a function');
  const v = verifyEnvelope(shaped.value, { payloadType: TICKET_PAYLOAD_TYPE, keys });
  if (!v.ok) return v;
  const read = readPayload(v.value.payload, validateTicketPayload, 'ticket');
  if (!read.ok) return read;
  const payload = read.value;
  if (opts.provider !== undefined && payload.provider !== opts.provider) {
    return fail('ticket_wrong_provider', `ticket is for provider ${payload.provider}`);
  }
  const now = opts.now ?? Date.now();
  const skew = opts.skewMs ?? 30_000;
  if (now + skew < payload.issued_at) return fail('ticket_not_yet_valid', `ticket is issued at ${payload.issued_at}, now is ${now}`);
  if (now - skew >= payload.expires_at) return fail('ticket_expired', `ticket expired at ${payload.expires_at}, now is ${now}`);
  if (opts.body !== undefined) {
    const digest = typeof opts.body === 'string' ? opts.body : sha256Hex(opts.body);
    if (digest !== payload.body_sha256) return fail('ticket_body_mismatch', 'the request body is not the one the ticket was issued for');
  }
  return ok({ payload, keyid: v.value.keyid });
}
