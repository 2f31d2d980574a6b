// Money is integer micro-USD (1 USD = 1,000,000), BigInt in code and decimal strings on the wire.
// USD decimals convert exactly at the edges; nothing here ever touches a floating-point number.

export const MICRO_PER_USD = 1_000_000n;
const TOKENS_PER_RATE_UNIT = 1_000_000n; // token rates are micro-USD per million tokens

const USD_RE = /^(0|[1-9][0-9]{0,17})(?:\.([0-9]{1,6}))?$/;
const MICRO_RE = /^(0|[1-9][0-9]{0,29})$/;
/** The largest micro-USD amount a signed object carries (30 digits: MICRO_RE). */
export const MAX_MICRO = 10n ** 30n - 1n;

/** "1.25" → 1250000n. At most 6 decimal places; no sign, exponent or whitespace. Undefined if invalid. */
export function parseUsd(s: string): bigint | undefined {
  const m = typeof s === 'string' ? USD_RE.exec(s) : null;
  if (!m) return undefined;
  const frac = (m[2] ?? '').padEnd(6, '0');
  return BigInt(m[1]!) * MICRO_PER_USD + BigInt(frac);
}

/** 1250000n → "1.250000": always six decimals, so the string is exact and unambiguous. */
export function formatUsd(micro: bigint): string {
  const neg = micro < 0n;
  const abs = neg ? -micro : micro;
  const whole = abs / MICRO_PER_USD;
  const frac = (abs % MICRO_PER_USD).toString().padStart(6, '0');
  return `${neg ? '-' : ''}${whole}.${frac}`;
}

/** True for a canonical non-negative decimal integer string (no sign, no leading zeros). */
export function isMicroString(s: unknown): s is string {
  return typeof s === 'string' && MICRO_RE.test(s);
}

/** Decimal string → bigint, or undefined when not a canonical non-negative integer. */
export function parseMicro(s: unknown): bigint | undefined {
  return isMicroString(s) ? BigInt(s) : undefined;
}

/** Rates fixed by a price version. Token rates in micro-USD per million tokens; unit rates per unit. */
export interface Rates {
  input_per_mtok: bigint;
  output_per_mtok: bigint;
  per_unit?: Record<string, bigint>;
}

export interface Usage {
  input_tokens: number;
  output_tokens: number;
  units?: Record<string, number>;
}

function ceilDiv(a: bigint, b: bigint): bigint {
  return (a + b - 1n) / b;
}

/**
 * cost = ceil((in × in_rate + out × out_rate) / 10^6) + Σ units × unit_rate, in micro-USD.
 * Throws when a unit is used that has no rate: a price list must name every unit it bills.
 */
export function computeCost(usage: Usage, rates: Rates): bigint {
  const tokens = BigInt(usage.input_tokens) * rates.input_per_mtok + BigInt(usage.output_tokens) * rates.output_per_mtok;
  let cost = ceilDiv(tokens, TOKENS_PER_RATE_UNIT);
  for (const [unit, count] of Object.entries(usage.units ?? {})) {
    const rate = rates.per_unit && Object.hasOwn(rates.per_unit, unit) ? rates.per_unit[unit] : undefined;
    if (rate === undefined) throw new RangeError(`no rate for unit "${unit}"`);
    cost += BigInt(count) * rate;
  }
  return cost;
}

/**
 * The most output tokens a request may generate so that its worst-case cost stays within the hold,
 * given the input tokens already known. Returns -1 when even the input alone exceeds the hold.
 */
export function maxOutputTokensWithin(hold: bigint, inputTokens: number, rates: Rates): number {
  const budget = hold * TOKENS_PER_RATE_UNIT - BigInt(inputTokens) * rates.input_per_mtok;
  if (budget < 0n) return -1;
  if (rates.output_per_mtok === 0n) return Number.MAX_SAFE_INTEGER;
  // ceil(x / 10^6) ≤ hold  ⇔  x ≤ hold × 10^6, so floor(budget / out_rate) tokens fit exactly.
  const n = budget / rates.output_per_mtok;
  return n > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(n);
}
