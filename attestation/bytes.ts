// Byte helpers shared by the verifier and the node. No `node:` imports: this runs in browsers too.
// Where Node's Buffer exists (found as a global, never imported) it is used for speed.

interface BufferInstance extends Uint8Array {
  toString(encoding?: string, start?: number, end?: number): string;
  write(s: string, offset: number, length: number, encoding: string): number;
}
interface BufferLike {
  from(data: string, encoding: string): BufferInstance;
  from(data: ArrayBufferLike, offset: number, length: number): BufferInstance;
  allocUnsafe(n: number): BufferInstance;
  byteLength(s: string, encoding: string): number;
}
const NodeBuffer: BufferLike | undefined = (globalThis as { Buffer?: BufferLike }).Buffer;

const HEX = '0123456789abcdef';
const HEX_PAIRS: string[] = Array.from({ length: 256 }, (_, i) => HEX[i >> 4]! + HEX[i & 15]!);

/** Lowercase hex of the bytes. */
export function toHex(bytes: Uint8Array): string {
  if (NodeBuffer) return asBuffer(bytes).toString('hex');
  let out = '';
  for (let i = 0; i < bytes.length; i++) out += HEX_PAIRS[bytes[i]!];
  return out;
}

// 1 for the characters of lowercase hex, by char code below 128.
const LOWER_HEX = new Uint8Array(128);
for (const c of '0123456789abcdef') LOWER_HEX[c.charCodeAt(0)] = 1;

/** Even length, only 0-9 and a-f (a table loop: about twice as quick as a regex on hashes). */
function isLowerHex(s: string): boolean {
  if (s.length % 2 !== 0) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c > 127 || LOWER_HEX[c] === 0) return false;
  }
  return true;
}

/** Strict lowercase hex to bytes; throws on odd length, upper case or any other character. */
export function fromHex(hex: string): Uint8Array {
  if (typeof hex !== 'string' || !isLowerHex(hex)) throw new TypeError('expected lowercase hex');
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** True when `s` is lowercase hex of exactly `bytes` bytes. */
export function isHex(s: unknown, bytes?: number): s is string {
  return typeof s === 'string' && (bytes === undefined || s.length === 2 * bytes) && isLowerHex(s);
}

const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
const B64_INDEX = new Int16Array(128).fill(-1);
for (let i = 0; i < B64.length; i++) B64_INDEX[B64.charCodeAt(i)] = i;
const B64_RE = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/**
 * Base64 of ranges of one array (start, end), as toBase64 of each subarray: on Node one Buffer
 * view serves every range, not one a call.
 */
export function base64Slicer(bytes: Uint8Array): (start: number, end: number) => string {
  if (!NodeBuffer) return (start, end) => toBase64(bytes.subarray(start, end));
  const b = asBuffer(bytes);
  return (start, end) => b.toString('base64', start, end);
}

/** Standard base64 with padding (RFC 4648 §4). */
export function toBase64(bytes: Uint8Array): string {
  if (NodeBuffer) return asBuffer(bytes).toString('base64');
  let out = '';
  let i = 0;
  for (; i + 2 < bytes.length; i += 3) {
    const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8) | bytes[i + 2]!;
    out += B64[n >> 18]! + B64[(n >> 12) & 63]! + B64[(n >> 6) & 63]! + B64[n & 63]!;
  }
  const rest = bytes.length - i;
  if (rest === 1) {
    const n = bytes[i]! << 16;
    out += B64[n >> 18]! + B64[(n >> 12) & 63]! + '==';
  } else if (rest === 2) {
    const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8);
    out += B64[n >> 18]! + B64[(n >> 12) & 63]! + B64[(n >> 6) & 63]! + '=';
  }
  return out;
}

/**
 * The length of the bytes a strict standard base64 string decodes to, or undefined when its length
 * or padding cannot be canonical (the characters themselves are checked by decoding).
 */
export function base64DecodedLength(s: string): number | undefined {
  if (typeof s !== 'string' || s.length % 4 !== 0) return undefined;
  const pad = s.endsWith('==') ? 2 : s.endsWith('=') ? 1 : 0;
  return (s.length / 4) * 3 - pad;
}

/**
 * Strict standard base64 to bytes: padding required, no whitespace, and the unused bits of the
 * last character must be zero, so every byte string has exactly one accepted encoding.
 * Returns undefined on any deviation.
 */
export function fromBase64(s: string): Uint8Array | undefined {
  const n = base64DecodedLength(s);
  if (n === undefined) return undefined;
  // The caller's own array: a key or hash kept from it holds no pool slab (and no one else's bytes).
  const out = new Uint8Array(n);
  return decodeBase64Into(s, out, 0) ? out : undefined;
}

/**
 * Decodes strict standard base64 into `out` at `offset`, exactly base64DecodedLength(s) bytes
 * (the caller sized `out` for them). False on any deviation; `out` may then hold partial bytes.
 */
export function decodeBase64Into(s: string, out: Uint8Array, offset: number): boolean {
  const n = base64DecodedLength(s);
  if (n === undefined || !Number.isInteger(offset) || offset < 0 || offset + n > out.length) return false;
  const pad = (s.length / 4) * 3 - n;
  if (NodeBuffer) {
    // Node's decoder reads only the low byte of each UTF-16 unit ("\u0141" as "A"): anything
    // beyond ASCII (its UTF-8 is longer than the string) is refused before it gets there.
    if (NodeBuffer.byteLength(s, 'utf8') !== s.length) return false;
    // Buffer decoding is lenient: it skips characters outside the alphabet, stops at a misplaced
    // "=", accepts the URL alphabet and ignores the unused bits of the last character. Each of
    // those shows as fewer bytes written than the padding implies, a "-" or "_", or nonzero spare
    // bits; with none of them the input is the one canonical encoding of its bytes.
    if (s.includes('-') || s.includes('_')) return false;
    if (asBuffer(out).write(s, offset, n, 'base64') !== n) return false;
    if (pad === 2 && (B64_INDEX[s.charCodeAt(s.length - 3)]! & 15) !== 0) return false;
    if (pad === 1 && (B64_INDEX[s.charCodeAt(s.length - 2)]! & 3) !== 0) return false;
    return true;
  }
  if (!B64_RE.test(s)) return false;
  let o = offset;
  const end = offset + n;
  for (let i = 0; i < s.length; i += 4) {
    const a = B64_INDEX[s.charCodeAt(i)]!;
    const b = B64_INDEX[s.charCodeAt(i + 1)]!;
    const c = s[i + 2] === '=' ? 0 : B64_INDEX[s.charCodeAt(i + 2)]!;
    const d = s[i + 3] === '=' ? 0 : B64_INDEX[s.charCodeAt(i + 3)]!;
    const v = (a << 18) | (b << 12) | (c << 6) | d;
    if (o < end) out[o++] = v >> 16;
    if (o < end) out[o++] = (v >> 8) & 255;
    if (o < end) out[o++] = v & 255;
    if (i + 4 === s.length && (pad === 2 ? (b & 15) !== 0 : pad === 1 ? (c & 3) !== 0 : false)) return false;
  }
  return true;
}

/**
 * A new byte array whose contents the caller overwrites in full, for transient messages (PAE):
 * Node hands out slices of a shared pool (no zero-fill, no allocation per call for small sizes),
 * so nothing handed to a caller to keep is made with it; elsewhere a plain array.
 */
export function newBytes(n: number): Uint8Array {
  if (NodeBuffer) {
    const b = NodeBuffer.allocUnsafe(n);
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  }
  return new Uint8Array(n);
}

const encoder = new TextEncoder();
// ignoreBOM keeps a leading U+FEFF in the text: signed bytes are never silently altered.
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

export function utf8(s: string): Uint8Array {
  if (NodeBuffer) {
    const b = NodeBuffer.from(s, 'utf8');
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  }
  return encoder.encode(s);
}

/** Strict UTF-8 decoding; returns undefined on malformed input. */
export function fromUtf8(bytes: Uint8Array): string | undefined {
  try {
    return decoder.decode(bytes);
  } catch {
    return undefined;
  }
}

export function concatBytes(...parts: Uint8Array[]): Uint8Array {
  let len = 0;
  for (const p of parts) len += p.length;
  const out = new Uint8Array(len);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

/**
 * A fresh copy of the bytes in a plain Uint8Array. (`slice()` is no copy on a Node Buffer: it is a
 * view of the same memory, so a cache keyed on it would follow the caller's later writes.)
 */
export function copyBytes(bytes: Uint8Array): Uint8Array {
  return new Uint8Array(bytes);
}

export function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function asBuffer(bytes: Uint8Array) {
  return NodeBuffer!.from(bytes.buffer as ArrayBufferLike, bytes.byteOffset, bytes.byteLength);
}
