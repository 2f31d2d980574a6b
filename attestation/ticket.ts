// Tickets (design.md §Tickets): the hold the marketplace signs for one request to one provider.
import { utf8 } from './bytes.ts';
import { canonicalize } from './canonical-json.ts';
import { signEnvelope, type DsseEnvelope } from './dsse.ts';
import * as f from './fields.ts';
import { ATTESTATION_TIERS, type AttestationTier } from './receipt.ts';

/** The longest a request may wait for a slot (X-Service-Max-Wait-Ms, routing.max_wait_ms, a model's max_wait_ms). */
export const MAX_WAIT_MS = 60_000;

export const TICKET_PAYLOAD_TYPE = 'application/vnd.service.ticket.v1+json';
export const TICKET_VERSION = 1;

/** The X-Service-* routing controls, as the marketplace resolved them for this request. */
export interface TicketRouting {
  min_attestation_tier?: AttestationTier;
  min_context?: number;
  quantization?: string;
  min_tokens_per_second?: number;
  max_wait_ms?: number;
  max_cost_micro_usd?: string;
  max_input_price_micro_usd_per_mtok?: string;
  max_output_price_micro_usd_per_mtok?: string;
  max_request_price_micro_usd?: string;
  hedge?: boolean;
}

export interface TicketPayload {
  v: 1;
  ticket_id: string;
  request_id: string;
  provider: string;
  account: string;
  endpoint: string;
  model: string;
  price_version: string;
  max_cost_micro_usd: string;
  body_sha256: string;
  routing: TicketRouting;
  issued_at: number;
  expires_at: number;
}

const ID_RE = /^[A-Za-z0-9._:-]+$/;
const FIELDS = [
  'v', 'ticket_id', 'request_id', 'provider', 'account', 'endpoint', 'model', 'price_version',
  'max_cost_micro_usd', 'body_sha256', 'routing', 'issued_at', 'expires_at',
] as const;
const ROUTING_FIELDS = [
  'min_attestation_tier', 'min_context', 'quantization', 'min_tokens_per_second', 'max_wait_ms', 'max_cost_micro_usd',
  'max_input_price_micro_usd_per_mtok', 'max_output_price_micro_usd_per_mtok', 'max_request_price_micro_usd', 'hedge',
] as const;

/** Checks every field of a ticket payload; throws FieldError naming the first bad one. */
export function validateTicketPayload(value: unknown): TicketPayload {
  const p = f.object(value, '');
  f.keys(p, '', FIELDS);
  if (p.v !== TICKET_VERSION) throw new f.FieldError('v', `expected ${TICKET_VERSION}`);
  f.string(p.ticket_id, 'ticket_id', 128, ID_RE);
  f.string(p.request_id, 'request_id', 128, ID_RE);
  f.hex32(p.provider, 'provider');
  f.string(p.account, 'account', 256);
  f.string(p.endpoint, 'endpoint', 64, /^[a-z][a-z0-9_-]*(?:\/[a-z0-9_{}-]+)*$/);
  f.string(p.model, 'model', 256);
  f.string(p.price_version, 'price_version', 64, ID_RE);
  f.micro(p.max_cost_micro_usd, 'max_cost_micro_usd');
  f.hex32(p.body_sha256, 'body_sha256');
  const issued = f.uint(p.issued_at, 'issued_at');
  const expires = f.uint(p.expires_at, 'expires_at');
  if (expires <= issued) throw new f.FieldError('expires_at', 'not after issued_at');
  const r = f.object(p.routing, 'routing');
  f.keys(r, 'routing', [], ROUTING_FIELDS);
  if (r.min_attestation_tier !== undefined) f.oneOf(r.min_attestation_tier, 'routing.min_attestation_tier', ATTESTATION_TIERS);
  if (r.min_context !== undefined) {
    const c = f.uint(r.min_context, 'routing.min_context');
    if (c < 1 || c > 4294967295) throw new f.FieldError('routing.min_context', 'expected 1 to 4294967295');
  }
  // As the buyer wrote it or bucketed (lowercase, "_" → "-"): the node compares buckets.
  if (r.quantization !== undefined) f.string(r.quantization, 'routing.quantization', 32, /^[A-Za-z0-9][A-Za-z0-9._-]*$/);
  if (r.min_tokens_per_second !== undefined) {
    const t = r.min_tokens_per_second;
    if (typeof t !== 'number' || !Number.isFinite(t) || t <= 0) throw new f.FieldError('routing.min_tokens_per_second', 'expected a number greater than 0');
  }
  if (r.max_wait_ms !== undefined) {
    const w = f.uint(r.max_wait_ms, 'routing.max_wait_ms');
    if (w > MAX_WAIT_MS) throw new f.FieldError('routing.max_wait_ms', `expected 0 to ${MAX_WAIT_MS}`);
  }
  for (const k of ['max_cost_micro_usd', 'max_input_price_micro_usd_per_mtok', 'max_output_price_micro_usd_per_mtok', 'max_request_price_micro_usd'] as const) {
    if (r[k] !== undefined) f.micro(r[k], `routing.${k}`);
  }
  if (r.hedge !== undefined && typeof r.hedge !== 'boolean') throw new f.FieldError('routing.hedge', 'expected a boolean');
  return p as unknown as TicketPayload;
}

/** A marketplace's signed ticket: the payload's canonical JSON in a DSSE envelope (not validated here). */
export function signTicket(payload: TicketPayload | Record<string, unknown>, signer: { keyid: string; seed: Uint8Array }): DsseEnvelope {
  return signEnvelope(TICKET_PAYLOAD_TYPE, utf8(canonicalize(payload)), signer);
}
