// The X-Service-* routing and cost headers (marketplace-api.md, "Routing and cost headers") as the
// ticket routing fields the marketplace and the node act on (attestation/ticket.ts TicketRouting).
// Every header is optional; a malformed one is refused with 400 invalid_request naming it, before
// anything is asked of the marketplace.
import { quantizationBucket } from '../dispatch/routing.ts';
import { parseUsd } from '../../attestation/money.ts';
import type { AttestationTier } from '../../attestation/receipt.ts';
import { MAX_WAIT_MS, type TicketRouting } from '../../attestation/ticket.ts';
import { invalid } from './errors.ts';

export interface RoutingControls {
  /**
   * The routing fields for the ticket request. routing.max_cost_micro_usd (X-Service-Max-Cost-Usd,
   * or an estimate's maximum) is also the hold the gateway asks the marketplace for.
   */
  routing: TicketRouting;
  /** X-Service-Prefer-Providers: an ordered strict set of provider ids (lowercase hex). */
  preferredProviders?: string[];
  /** X-Service-Estimate: an estimate id from POST /v1/estimates. */
  estimateId?: string;
}

export type HeaderBag = Record<string, string | string[] | undefined>;

/** The header names, as the spec writes them. */
export const ROUTING_HEADERS = [
  'X-Service-Min-Att-Tier',
  'X-Service-Min-Ctx',
  'X-Service-Quant',
  'X-Service-Prefer-Providers',
  'X-Service-Hedge',
  'X-Service-Min-Tok-S',
  'X-Service-Max-Wait-Ms',
  'X-Service-Max-Cost-Usd',
  'X-Service-Max-Input-Price-Per-Million-Usd',
  'X-Service-Max-Output-Price-Per-Million-Usd',
  'X-Service-Max-Representative-Request-Price-Usd',
  'X-Service-Estimate',
] as const;

const INT_RE = /^[0-9]{1,16}$/;
const NUMBER_RE = /^(?:[0-9]{1,16}(?:\.[0-9]{1,16})?|\.[0-9]{1,16})$/;
const QUANT_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$/;
const PROVIDER_RE = /^[0-9a-fA-F]{64}$/;

/** The header's value, or undefined when absent. A repeated header (several values) is refused. */
function header(headers: HeaderBag, name: string): string | undefined {
  const v = headers[name.toLowerCase()];
  if (v === undefined) return undefined;
  if (Array.isArray(v)) {
    if (v.length !== 1) throw invalid(name, 'given more than once');
    return v[0]!.trim();
  }
  return v.trim();
}

function integer(name: string, v: string, min: number, max: number): number {
  const n = INT_RE.test(v) ? Number(v) : NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max) throw invalid(name, `expected an integer from ${min} to ${max}, got "${v.slice(0, 64)}"`);
  return n;
}

function usdMicro(name: string, v: string): string {
  const micro = parseUsd(v);
  if (micro === undefined) throw invalid(name, `expected a USD amount with at most 6 decimal places (like "0.25"), got "${v.slice(0, 64)}"`);
  return micro.toString();
}

/** Every X-Service-* header a request may carry, lowercase: the routing headers and the API key's. */
const KNOWN_HEADERS: ReadonlySet<string> = new Set([...ROUTING_HEADERS.map((h) => h.toLowerCase()), 'x-service-api-key']);

/**
 * An X-Service-* header the API does not have is refused, never ignored: a misspelt control
 * (X-Service-Max-Cost for X-Service-Max-Cost-Usd) would otherwise run, and bill, without it.
 */
function refuseUnknownHeaders(headers: HeaderBag): void {
  for (const name of Object.keys(headers)) {
    if (!name.startsWith('x-service-') || KNOWN_HEADERS.has(name)) continue;
    const shown = name.slice(0, 64).replace(/(^|-)([a-z])/g, (_m, dash: string, c: string) => dash + c.toUpperCase());
    throw invalid(shown, `not a header of this API${closestHeader(name)}`);
  }
}

/** ' (X-Service-…?)': the known header sharing the longest start with `name`, when it shares more than the prefix. */
function closestHeader(name: string): string {
  let best: string | undefined;
  let bestLen = 'x-service-'.length;
  for (const h of ROUTING_HEADERS) {
    const l = h.toLowerCase();
    let n = 0;
    while (n < l.length && n < name.length && l[n] === name[n]) n++;
    if (n > bestLen) [best, bestLen] = [h, n];
  }
  return best ? ` (${best}?)` : '';
}

/** Reads every X-Service-* routing and cost header. Throws GatewayError (400) naming the first bad one. */
export function parseRoutingHeaders(headers: HeaderBag): RoutingControls {
  refuseUnknownHeaders(headers);
  const routing: TicketRouting = {};
  const out: RoutingControls = { routing };
  const get = (name: (typeof ROUTING_HEADERS)[number]): string | undefined => header(headers, name);

  let v = get('X-Service-Min-Att-Tier');
  if (v !== undefined) {
    const m = /^[Tt]?([1-4])$/.exec(v);
    if (!m) throw invalid('X-Service-Min-Att-Tier', `expected 1 to 4 or T1 to T4, got "${v.slice(0, 64)}"`);
    routing.min_attestation_tier = `T${m[1]}` as AttestationTier;
  }
  v = get('X-Service-Min-Ctx');
  if (v !== undefined) routing.min_context = integer('X-Service-Min-Ctx', v, 1, 4294967295);
  v = get('X-Service-Quant');
  if (v !== undefined) {
    if (!QUANT_RE.test(v)) throw invalid('X-Service-Quant', 'expected 1 to 32 letters, digits, "_", "-" or ".", starting with a letter or digit');
    routing.quantization = quantizationBucket(v);
  }
  v = get('X-Service-Prefer-Providers');
  if (v !== undefined) {
    const ids = v.split(',').map((s) => s.trim());
    if (ids.length < 1 || ids.length > 64) throw invalid('X-Service-Prefer-Providers', 'expected 1 to 64 provider keys');
    for (const id of ids) {
      if (!PROVIDER_RE.test(id)) throw invalid('X-Service-Prefer-Providers', `expected comma-separated 64-hex-character provider keys, got "${id.slice(0, 80)}"`);
    }
    const lower = ids.map((s) => s.toLowerCase());
    if (new Set(lower).size !== lower.length) throw invalid('X-Service-Prefer-Providers', 'a provider is listed twice');
    out.preferredProviders = lower;
  }
  v = get('X-Service-Hedge');
  if (v !== undefined) {
    if (v !== '0' && v !== '1') throw invalid('X-Service-Hedge', `expected 0 or 1, got "${v.slice(0, 64)}"`);
    if (v === '1' && out.preferredProviders) throw invalid('X-Service-Hedge', 'cannot be combined with X-Service-Prefer-Providers');
    routing.hedge = v === '1';
  }
  v = get('X-Service-Min-Tok-S');
  if (v !== undefined) {
    const n = NUMBER_RE.test(v) ? Number(v) : NaN;
    if (!Number.isFinite(n) || n <= 0) throw invalid('X-Service-Min-Tok-S', `expected a number greater than 0, got "${v.slice(0, 64)}"`);
    routing.min_tokens_per_second = n;
  }
  v = get('X-Service-Max-Wait-Ms');
  if (v !== undefined) routing.max_wait_ms = integer('X-Service-Max-Wait-Ms', v, 0, MAX_WAIT_MS);
  v = get('X-Service-Max-Cost-Usd');
  if (v !== undefined) routing.max_cost_micro_usd = usdMicro('X-Service-Max-Cost-Usd', v);
  v = get('X-Service-Max-Input-Price-Per-Million-Usd');
  if (v !== undefined) routing.max_input_price_micro_usd_per_mtok = usdMicro('X-Service-Max-Input-Price-Per-Million-Usd', v);
  v = get('X-Service-Max-Output-Price-Per-Million-Usd');
  if (v !== undefined) routing.max_output_price_micro_usd_per_mtok = usdMicro('X-Service-Max-Output-Price-Per-Million-Usd', v);
  v = get('X-Service-Max-Representative-Request-Price-Usd');
  if (v !== undefined) routing.max_request_price_micro_usd = usdMicro('X-Service-Max-Representative-Request-Price-Usd', v);
  v = get('X-Service-Estimate');
  if (v !== undefined) {
    if (v.length < 16 || v.length > 128) throw invalid('X-Service-Estimate', 'expected an estimate id of 16 to 128 characters');
    out.estimateId = v;
  }
  return out;
}
