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

// A lone surrogate cannot be represented in UTF-8: RFC 8785 §3.2.2.2 refuses it.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function str(s: string): string {
  if (LONE_SURROGATE.test(s)) throw new CanonicalJsonError('string holds a lone surrogate');
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

/** The RFC 8785 canonical form of a JSON value, as a string. Throws CanonicalJsonError. */
export function canonicalize(value: unknown): string {
  return serialise(value, 0);
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
export function parseCanonical(text: string): { value: unknown; canonical: boolean } | undefined {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  let canonical: boolean;
  try {
    canonical = serialise(value, 0) === text;
  } catch {
    canonical = false;
  }
  return { value, canonical };
}
