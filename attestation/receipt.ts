// Receipt payloads (design.md §Receipts): what ran, what it cost, and the hash chain linking it to
// the node's previous receipt. Validated identically by the signer and by every verifier.
import * as f from './fields.ts';
import { computeCost, type Rates, type Usage } from './money.ts';
import { canonicalize, isSortedJson, sortKeys } from './canonical-json.ts';

export const RECEIPT_PAYLOAD_TYPE = 'application/vnd.service.receipt.v1+json';
export const RECEIPT_VERSION = 1;
/** `prev` of the first receipt (seq 0). */
export const GENESIS_PREV = '0'.repeat(64);

export type ReceiptStatus = 'completed' | 'cancelled' | 'failed';
export const RECEIPT_STATUSES: readonly ReceiptStatus[] = ['completed', 'cancelled', 'failed'];
export type AttestationTier = 'T1' | 'T2' | 'T3' | 'T4';
export const ATTESTATION_TIERS: readonly AttestationTier[] = ['T1', 'T2', 'T3', 'T4'];

/** Rates on the wire: decimal strings of micro-USD. */
export interface WireRates {
  input_per_mtok: string;
  output_per_mtok: string;
  per_unit?: Record<string, string>;
}

export interface ReceiptPayload {
  v: 1;
  provider: string;
  seq: string;
  prev: string;
  request_id: string;
  ticket_id: string;
  endpoint: string;
  model: string;
  model_sha256: string;
  runtime: { adapter: string; version: string };
  quantization: string;
  status: ReceiptStatus;
  started_at: number;
  first_token_at: number | null;
  finished_at: number;
  usage: Usage;
  usage_runtime: Record<string, unknown>;
  price: { version: string; rates: WireRates };
  cost_micro_usd: string;
  hold_micro_usd: string;
  request_sha256: string;
  response_sha256: string;
  attestation: { tier: AttestationTier; evidence_sha256: string | null };
}

/** What a request contributes; the log adds provider, seq and prev. */
export type ReceiptBody = Omit<ReceiptPayload, 'v' | 'provider' | 'seq' | 'prev'>;

const ID_RE = /^[A-Za-z0-9._:-]+$/;
const ENDPOINT_RE = /^[a-z][a-z0-9_-]*(?:\/[a-z0-9_{}-]+)*$/;
const TOP_FIELDS = [
  'v', 'provider', 'seq', 'prev', 'request_id', 'ticket_id', 'endpoint', 'model', 'model_sha256', 'runtime',
  'quantization', 'status', 'started_at', 'first_token_at', 'finished_at', 'usage', 'usage_runtime', 'price',
  'cost_micro_usd', 'hold_micro_usd', 'request_sha256', 'response_sha256', 'attestation',
] as const;

/** Rates as receipts, price lists and the market write them: decimal strings. */
export function ratesToWire(r: Rates): WireRates {
  const w: WireRates = { input_per_mtok: r.input_per_mtok.toString(), output_per_mtok: r.output_per_mtok.toString() };
  if (r.per_unit) w.per_unit = Object.fromEntries(Object.entries(r.per_unit).map(([k, v]) => [k, v.toString()]));
  return w;
}

/** Whether wire rates (a receipt's price.rates) are exactly these rates, per-unit rates included. */
export function ratesMatch(w: WireRates, r: Rates): boolean {
  return canonicalize(w) === canonicalize(ratesToWire(r));
}

export function ratesFromWire(w: WireRates): Rates {
  const r: Rates = { input_per_mtok: BigInt(w.input_per_mtok), output_per_mtok: BigInt(w.output_per_mtok) };
  if (w.per_unit) r.per_unit = Object.fromEntries(Object.entries(w.per_unit).map(([k, v]) => [k, BigInt(v)]));
  return r;
}

/**
 * Checks every field of a receipt payload; throws FieldError naming the first bad one. Checks the
 * shape and internal order of times, not the arithmetic (see checkReceiptCost).
 */
export function validateReceiptPayload(value: unknown): ReceiptPayload {
  const p = f.object(value, '');
  f.keys(p, '', TOP_FIELDS);
  if (p.v !== RECEIPT_VERSION) throw new f.FieldError('v', `expected ${RECEIPT_VERSION}`);
  f.hex32(p.provider, 'provider');
  f.micro(p.seq, 'seq');
  f.hex32(p.prev, 'prev');
  f.string(p.request_id, 'request_id', 128, ID_RE);
  f.string(p.ticket_id, 'ticket_id', 128, ID_RE);
  f.string(p.endpoint, 'endpoint', 64, ENDPOINT_RE);
  f.string(p.model, 'model', 256);
  f.hex32(p.model_sha256, 'model_sha256');
  const rt = f.object(p.runtime, 'runtime');
  f.keys(rt, 'runtime', ['adapter', 'version']);
  f.string(rt.adapter, 'runtime.adapter', 64);
  f.string(rt.version, 'runtime.version', 128);
  f.string(p.quantization, 'quantization', 32, /^[a-z0-9][a-z0-9._-]*$/);
  f.oneOf(p.status, 'status', RECEIPT_STATUSES);
  const started = f.uint(p.started_at, 'started_at');
  const finished = f.uint(p.finished_at, 'finished_at');
  if (finished < started) throw new f.FieldError('finished_at', 'earlier than started_at');
  if (p.first_token_at !== null) {
    const first = f.uint(p.first_token_at, 'first_token_at');
    if (first < started || first > finished) throw new f.FieldError('first_token_at', 'outside started_at..finished_at');
  }
  const usage = f.object(p.usage, 'usage');
  f.keys(usage, 'usage', ['input_tokens', 'output_tokens'], ['units']);
  f.uint(usage.input_tokens, 'usage.input_tokens');
  f.uint(usage.output_tokens, 'usage.output_tokens');
  if (usage.units !== undefined) f.record(usage.units, 'usage.units', f.uint);
  f.object(p.usage_runtime, 'usage_runtime');
  const price = f.object(p.price, 'price');
  f.keys(price, 'price', ['version', 'rates']);
  f.string(price.version, 'price.version', 64, ID_RE);
  const rates = f.object(price.rates, 'price.rates');
  f.keys(rates, 'price.rates', ['input_per_mtok', 'output_per_mtok'], ['per_unit']);
  f.micro(rates.input_per_mtok, 'price.rates.input_per_mtok');
  f.micro(rates.output_per_mtok, 'price.rates.output_per_mtok');
  const perUnit = rates.per_unit === undefined ? {} : f.record(rates.per_unit, 'price.rates.per_unit', f.micro);
  for (const unit of Object.keys((usage.units as Record<string, number> | undefined) ?? {})) {
    if (!Object.hasOwn(perUnit, unit)) throw new f.FieldError(`usage.units.${unit}`, 'no rate for this unit in price.rates.per_unit');
  }
  f.micro(p.cost_micro_usd, 'cost_micro_usd');
  f.micro(p.hold_micro_usd, 'hold_micro_usd');
  f.hex32(p.request_sha256, 'request_sha256');
  f.hex32(p.response_sha256, 'response_sha256');
  const att = f.object(p.attestation, 'attestation');
  f.keys(att, 'attestation', ['tier', 'evidence_sha256']);
  f.oneOf(att.tier, 'attestation.tier', ATTESTATION_TIERS);
  if (att.evidence_sha256 !== null) f.hex32(att.evidence_sha256, 'attestation.evidence_sha256');
  return p as unknown as ReceiptPayload;
}

/**
 * The canonical JSON of a payload from buildReceiptPayload that passed validateReceiptPayload.
 * Its keys are inserted in sorted order and validation has checked the type of every field, so
 * only usage_runtime (free-form) needs canonicalize's walk; the rest is native JSON.stringify.
 * A test holds this equal to canonicalize(payload).
 */
export function receiptPayloadJson(p: ReceiptPayload): string {
  // Throws on anything JCS refuses. Integer-like keys ("10", "9") always enumerate first in JS,
  // whatever the insertion order, so such a usage_runtime takes the general path.
  return isSortedJson(p.usage_runtime) ? JSON.stringify(p) : canonicalize(p);
}

/** The cost this receipt should state, from its own usage and rates. */
export function expectedCost(p: ReceiptPayload): bigint {
  return computeCost(p.usage, ratesFromWire(p.price.rates));
}

/**
 * The payload for a body at a position of the chain, with every object's keys inserted in sorted
 * order, so that its canonical form is plain JSON.stringify (see canonicalize's fast path).
 * Nested objects are copied, never shared with the caller. Does not validate.
 */
export function buildReceiptPayload(provider: string, seq: string, prev: string, b: ReceiptBody): ReceiptPayload {
  // Anything that is not an object passes through as it is, for validation to name.
  const o = (x: unknown): x is Record<string, unknown> => x !== null && typeof x === 'object' && !Array.isArray(x);
  const { usage, price, runtime, attestation } = b;
  const rates = o(price) ? price.rates : undefined;
  return {
    attestation: o(attestation) ? { evidence_sha256: attestation.evidence_sha256, tier: attestation.tier } : attestation,
    cost_micro_usd: b.cost_micro_usd,
    endpoint: b.endpoint,
    finished_at: b.finished_at,
    first_token_at: b.first_token_at,
    hold_micro_usd: b.hold_micro_usd,
    model: b.model,
    model_sha256: b.model_sha256,
    prev,
    price: o(price)
      ? {
          rates: o(rates)
            ? rates.per_unit === undefined
              ? { input_per_mtok: rates.input_per_mtok, output_per_mtok: rates.output_per_mtok }
              : { input_per_mtok: rates.input_per_mtok, output_per_mtok: rates.output_per_mtok, per_unit: sortKeys(rates.per_unit) }
            : rates,
          version: price.version,
        }
      : price,
    provider,
    quantization: b.quantization,
    request_id: b.request_id,
    request_sha256: b.request_sha256,
    response_sha256: b.response_sha256,
    runtime: o(runtime) ? { adapter: runtime.adapter, version: runtime.version } : runtime,
    seq,
    started_at: b.started_at,
    status: b.status,
    ticket_id: b.ticket_id,
    usage: o(usage)
      ? usage.units === undefined
        ? { input_tokens: usage.input_tokens, output_tokens: usage.output_tokens }
        : { input_tokens: usage.input_tokens, output_tokens: usage.output_tokens, units: sortKeys(usage.units) }
      : usage,
    usage_runtime: sortKeys(b.usage_runtime),
    v: RECEIPT_VERSION,
  } as ReceiptPayload;
}
