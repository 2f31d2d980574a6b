// RFC 8785 JSON Canonicalization Scheme (JCS).
//
// ECMAScript already defines the pieces JCS is built from: Number.prototype.toString is the number
// serialisation JCS requires, JSON.stringify's string escaping is the one JCS requires, and the
// default sort compares UTF-16 code units as JCS requires. What remains is to sort object keys at
// every level and to refuse what JSON cannot carry exactly.
import { utf8 } from './bytes.ts';

export class CanonicalJsonError extends Error {
  override name = 'CanonicalJsonError';
}

// A lone surrogate cannot be represented in UTF-8: RFC 8785 §3.2.2.2 refuses it. The cheap class
// test rules out almost every string before the precise one runs.
const ANY_SURROGATE = /[\uD800-\uDFFF]/;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Whether `s` holds a lone surrogate (no UTF-8 form: it would encode as U+FFFD, meeting other strings). */
export function hasLoneSurrogate(s: string): boolean {
  return ANY_SURROGATE.test(s) && LONE_SURROGATE.test(s);
}

function str(s: string): string {
  if (hasLoneSurrogate(s)) throw new CanonicalJsonError('string holds a lone surrogate');
  return JSON.stringify(s);
}

function serialise(value: unknown, depth: number): string {
  if (depth > 128) throw new CanonicalJsonError('nesting deeper than 128 levels');
  switch (typeof value) {
    case 'string':
      return str(value);
    case 'number':
      if (!Number.isFinite(value)) throw new CanonicalJsonError(`number ${value} has no JSON form`);
      return JSON.stringify(value); // -0 serialises as 0, as JCS requires
    case 'boolean':
      return value ? 'true' : 'false';
    case 'object': {
      if (value === null) return 'null';
      if (Array.isArray(value)) {
        let out = '[';
        for (let i = 0; i < value.length; i++) {
          if (i) out += ',';
          out += serialise(value[i], depth + 1);
        }
        return out + ']';
      }
      const proto = Object.getPrototypeOf(value);
      if (proto !== Object.prototype && proto !== null) {
        throw new CanonicalJsonError(`cannot canonicalise a ${proto?.constructor?.name ?? 'non-plain'} object`);
      }
      const obj = value as Record<string, unknown>;
      const keys = Object.keys(obj).sort();
      let out = '{';
      let first = true;
      for (const k of keys) {
        const v = obj[k];
        if (v === undefined) continue; // as JSON.stringify: absent
        if (!first) out += ',';
        first = false;
        out += str(k) + ':' + serialise(v, depth + 1);
      }
      return out + '}';
    }
    default:
      throw new CanonicalJsonError(`cannot canonicalise a ${typeof value}`);
  }
}

/**
 * True when JSON.stringify already writes the canonical form: every object's own keys come in
 * sorted order (JSON.stringify keeps insertion order; integer-like keys always enumerate first, so
 * such objects usually fail this and take the slow path). Throws on anything JCS refuses, exactly
 * where serialise would.
 */
function alreadySorted(value: unknown, depth: number): boolean {
  if (depth > 128) throw new CanonicalJsonError('nesting deeper than 128 levels');
  switch (typeof value) {
    case 'string':
      if (hasLoneSurrogate(value)) throw new CanonicalJsonError('string holds a lone surrogate');
      return true;
    case 'number':
      if (!Number.isFinite(value)) throw new CanonicalJsonError(`number ${value} has no JSON form`);
      return true;
    case 'boolean':
      return true;
    case 'object': {
      if (value === null) return true;
      if (Array.isArray(value)) {
        let sorted = true;
        for (let i = 0; i < value.length; i++) {
          if (value[i] === undefined) throw new CanonicalJsonError('cannot canonicalise undefined');
          if (!alreadySorted(value[i], depth + 1)) sorted = false;
        }
        return sorted;
      }
      const proto = Object.getPrototypeOf(value);
      if (proto !== Object.prototype && proto !== null) {
        throw new CanonicalJsonError(`cannot canonicalise a ${proto?.constructor?.name ?? 'non-plain'} object`);
      }
      const obj = value as Record<string, unknown>;
      const keys = Object.keys(obj);
      let sorted = true;
      for (let i = 0; i < keys.length; i++) {
        const k = keys[i]!;
        if (i > 0 && !(keys[i - 1]! < k)) sorted = false;
        if (hasLoneSurrogate(k)) throw new CanonicalJsonError('key holds a lone surrogate');
        const v = obj[k];
        if (v !== undefined && !alreadySorted(v, depth + 1)) sorted = false;
      }
      return sorted;
    }
    default:
      throw new CanonicalJsonError(`cannot canonicalise a ${typeof value}`);
  }
}

const SURROGATE_ESCAPE = /\\u[dD][89a-fA-F]/;

/** Whether every object of a parsed JSON value enumerates its keys in sorted order. */
function keysSorted(value: unknown, depth: number): boolean {
  if (value === null || typeof value !== 'object') return true;
  if (depth > 128) throw new CanonicalJsonError('nesting deeper than 128 levels');
  if (Array.isArray(value)) {
    for (const v of value) if (!keysSorted(v, depth + 1)) return false;
    return true;
  }
  const obj = value as Record<string, unknown>;
  let prev: string | undefined;
  for (const k in obj) {
    if (prev !== undefined && !(prev < k)) return false;
    prev = k;
    if (!keysSorted(obj[k], depth + 1)) return false;
  }
  return true;
}

/**
 * Whether JSON.stringify(value) is already its canonical form (every object's keys enumerate in
 * sorted order). Throws CanonicalJsonError on anything JCS refuses, as canonicalize would.
 */
export function isSortedJson(value: unknown): boolean {
  return alreadySorted(value, 0);
}

/** The RFC 8785 canonical form of a JSON value, as a string. Throws CanonicalJsonError. */
export function canonicalize(value: unknown): string {
  // Build objects with sorted keys (see sortKeys) and this is one walk plus native JSON.stringify.
  return alreadySorted(value, 0) ? JSON.stringify(value) : serialise(value, 0);
}

/**
 * A copy of a JSON value whose objects insert their keys in sorted order, so that canonicalize
 * takes its fast path. Values are shared, not cloned, where nothing needs reordering.
 */
export function sortKeys<T>(value: T): T {
  if (value === null || typeof value !== 'object') return value;
  if (Array.isArray(value)) return value.map((v) => sortKeys(v)) as T;
  const obj = value as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const k of sortedKeys(obj)) out[k] = sortKeys(obj[k]);
  return out as T;
}

/**
 * An object's keys in JCS order (UTF-16 code units, as Array.prototype.sort compares strings). The
 * few keys of a receipt's objects are put in order in place, without sort()'s scratch arrays (a
 * receipt's usage_runtime was a measurable part of the receipt log's garbage).
 */
function sortedKeys(obj: Record<string, unknown>): string[] {
  const keys = Object.keys(obj);
  if (keys.length > 16) return keys.sort();
  for (let i = 1; i < keys.length; i++) {
    const k = keys[i]!;
    let j = i - 1;
    for (; j >= 0 && keys[j]! > k; j--) keys[j + 1] = keys[j]!;
    keys[j + 1] = k;
  }
  return keys;
}

/** The RFC 8785 canonical form as UTF-8 bytes. */
export function canonicalBytes(value: unknown): Uint8Array {
  return utf8(canonicalize(value));
}

/**
 * Parses JSON text and tells whether the text was already canonical. A verifier checks the exact
 * bytes it was given and never re-serialises for the signature; this check only tells a payload
 * that was produced by something other than JCS (duplicate keys, unsorted keys, whitespace, ...).
 */
export function parseCanonical(text: string): { value: unknown; canonical: boolean; why?: string } | undefined {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  let canonical: boolean;
  try {
    // JSON.parse yields only JSON types, and a lone surrogate can only come from a \uD8xx..\uDFxx
    // escape in the text (valid UTF-8 holds none), so without such an escape the only question is
    // key order: when every object's keys enumerate sorted, JSON.stringify writes the JCS form.
    canonical = !(text.includes('\\u') && SURROGATE_ESCAPE.test(text)) && keysSorted(value, 0) ? JSON.stringify(value) === text : serialise(value, 0) === text;
  } catch (e) {
    // (JSON nested deeper than JCS here walks, or a lone surrogate: not taken; the reason says which)
    return { value, canonical: false, ...(e instanceof CanonicalJsonError ? { why: e.message } : {}) };
  }
  return { value, canonical };
}
