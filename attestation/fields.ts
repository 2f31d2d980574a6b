// A small field checker for signed payloads. Each check names the field it refuses, so a bad
// payload is reported as "usage.output_tokens: expected a non-negative safe integer".
import { isHex } from './bytes.ts';
import { isMicroString } from './money.ts';

export class FieldError extends Error {
  readonly field: string;
  constructor(field: string, message: string) {
    super(`${field || 'payload'}: ${message}`);
    this.field = field;
  }
}

type Obj = Record<string, unknown>;

export function object(v: unknown, field: string): Obj {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new FieldError(field, 'expected an object');
  return v as Obj;
}

/** Requires every key of `required` and refuses keys that are neither required nor optional. */
export function keys(o: Obj, field: string, required: readonly string[], optional: readonly string[] = []): void {
  let present = 0;
  for (const k of required) {
    if (!Object.hasOwn(o, k)) throw new FieldError(join(field, k), 'missing');
    present++;
  }
  for (const k of optional) if (Object.hasOwn(o, k)) present++;
  if (Object.keys(o).length === present) return;
  for (const k of Object.keys(o)) {
    if (!required.includes(k) && !optional.includes(k)) throw new FieldError(join(field, k), 'unknown field');
  }
}

export function join(field: string, k: string): string {
  return field ? `${field}.${k}` : k;
}

const SURROGATE = /[\uD800-\uDFFF]/;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** A non-empty string of at most `max` UTF-16 units, well-formed (no lone surrogate), matching `pattern`. */
export function string(v: unknown, field: string, max = 256, pattern?: RegExp): string {
  if (typeof v !== 'string') throw new FieldError(field, 'expected a string');
  if (v.length === 0 || v.length > max) throw new FieldError(field, `expected 1 to ${max} characters`);
  if (pattern ? !pattern.test(v) : SURROGATE.test(v) && LONE_SURROGATE.test(v)) {
    throw new FieldError(field, pattern ? `does not match ${pattern}` : 'holds a lone surrogate');
  }
  return v;
}

export function hex32(v: unknown, field: string): string {
  if (!isHex(v, 32)) throw new FieldError(field, 'expected 64 lowercase hex characters');
  return v;
}

export function uint(v: unknown, field: string): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) throw new FieldError(field, 'expected a non-negative safe integer');
  return v;
}

/** A micro-USD amount on the wire: a canonical decimal integer string (checked, not converted). */
export function micro(v: unknown, field: string): string {
  if (!isMicroString(v)) throw new FieldError(field, 'expected a decimal integer string (no sign, no leading zeros)');
  return v;
}

export function oneOf<T extends string>(v: unknown, field: string, values: readonly T[]): T {
  if (typeof v !== 'string' || !values.includes(v as T)) throw new FieldError(field, `expected one of ${values.join(', ')}`);
  return v as T;
}

/** A record of unit name → value, names like "images" or "audio_seconds". */
export function record<T>(v: unknown, field: string, each: (x: unknown, f: string) => T, maxEntries = 16): Record<string, T> {
  const o = object(v, field);
  const entries = Object.keys(o);
  if (entries.length > maxEntries) throw new FieldError(field, `more than ${maxEntries} entries`);
  const out: Record<string, T> = {};
  for (const k of entries) {
    if (!/^[a-z][a-z0-9_]{0,31}$/.test(k)) throw new FieldError(join(field, k), 'unit names are lowercase identifiers');
    out[k] = each(o[k], join(field, k));
  }
  return out;
}
