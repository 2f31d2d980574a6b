/**
 * A small GGUF v3 writer (little-endian), enough to produce models that
 * llama.cpp loads: typed metadata key/values, F32 tensors, aligned data.
 *
 * File layout (see ggml's gguf.h):
 *   magic "GGUF" | u32 version (3) | u64 tensor count | u64 kv count
 *   kv*:     string key | u32 value type | value
 *   tensor*: string name | u32 n_dims | u64 dims[n_dims] | u32 ggml type | u64 offset
 *   padding to `alignment`
 *   tensor data, each tensor starting at an `alignment`-aligned offset
 *   relative to the start of the data section (and padded to it).
 *
 * Strings are a u64 byte length followed by UTF-8 bytes (no terminator).
 * Arrays are u32 element type, u64 element count, then the elements.
 * dims[0] is the fastest-varying (contiguous) dimension, as in ggml's `ne`.
 */

import { writeFileSync } from 'node:fs';

/** GGUF metadata value type codes (gguf_type). */
export const GGUF_TYPE = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

/** ggml tensor type codes used here. */
const GGML_TYPE = {
  F32: 0,
} as const;

const GGUF_MAGIC = 'GGUF';
const GGUF_VERSION = 3;
const GGUF_DEFAULT_ALIGNMENT = 32;

export type GgufValue =
  | { readonly type: 'uint32'; readonly value: number }
  | { readonly type: 'int32'; readonly value: number }
  | { readonly type: 'float32'; readonly value: number }
  | { readonly type: 'bool'; readonly value: boolean }
  | { readonly type: 'string'; readonly value: string }
  | { readonly type: 'uint64'; readonly value: bigint | number }
  | { readonly type: 'string[]'; readonly value: readonly string[] }
  | { readonly type: 'float32[]'; readonly value: ArrayLike<number> }
  | { readonly type: 'int32[]'; readonly value: ArrayLike<number> };

export interface GgufKv {
  readonly key: string;
  readonly value: GgufValue;
}

export interface GgufF32Tensor {
  readonly name: string;
  /** ggml order: dims[0] is the contiguous (fastest-varying) dimension. */
  readonly dims: readonly number[];
  /** Row-major data with dims[0] fastest; length must equal the product of dims. */
  readonly data: Float32Array;
}

export interface GgufWriteInput {
  readonly metadata: readonly GgufKv[];
  readonly tensors: readonly GgufF32Tensor[];
  /**
   * Data alignment in bytes (power of two). Defaults to 32. Written as the
   * `general.alignment` uint32 KV unless the metadata already has it (which
   * must then be a uint32 of the same value).
   */
  readonly alignment?: number;
}

// Value constructors, so call sites read `kv('llama.block_count', u32(2))`.
export const u32 = (value: number): GgufValue => ({ type: 'uint32', value });
export const i32 = (value: number): GgufValue => ({ type: 'int32', value });
export const f32 = (value: number): GgufValue => ({ type: 'float32', value });
export const bool = (value: boolean): GgufValue => ({ type: 'bool', value });
export const str = (value: string): GgufValue => ({ type: 'string', value });
export const u64 = (value: bigint | number): GgufValue => ({ type: 'uint64', value });
export const strArr = (value: readonly string[]): GgufValue => ({ type: 'string[]', value });
export const f32Arr = (value: ArrayLike<number>): GgufValue => ({ type: 'float32[]', value });
export const i32Arr = (value: ArrayLike<number>): GgufValue => ({ type: 'int32[]', value });
export const kv = (key: string, value: GgufValue): GgufKv => ({ key, value });

const utf8 = new TextEncoder();

/** Growable little-endian byte buffer. */
class ByteWriter {
  #buf: Uint8Array;
  #view: DataView;
  #len = 0;

  constructor(initialCapacity = 1 << 16) {
    this.#buf = new Uint8Array(initialCapacity);
    this.#view = new DataView(this.#buf.buffer);
  }

  get length(): number {
    return this.#len;
  }

  #reserve(n: number): number {
    const need = this.#len + n;
    if (need > this.#buf.length) {
      let cap = this.#buf.length * 2;
      while (cap < need) cap *= 2;
      const next = new Uint8Array(cap);
      next.set(this.#buf.subarray(0, this.#len));
      this.#buf = next;
      this.#view = new DataView(next.buffer);
    }
    const at = this.#len;
    this.#len = need;
    return at;
  }

  u32(v: number): void {
    if (!Number.isInteger(v) || v < 0 || v > 0xffff_ffff) throw new RangeError(`not a uint32: ${v}`);
    const at = this.#reserve(4); // (first: it may replace the view)
    this.#view.setUint32(at, v, true);
  }

  i32(v: number): void {
    if (!Number.isInteger(v) || v < -0x8000_0000 || v > 0x7fff_ffff) throw new RangeError(`not an int32: ${v}`);
    const at = this.#reserve(4); // (first: it may replace the view)
    this.#view.setInt32(at, v, true);
  }

  u64(v: bigint | number): void {
    const b = typeof v === 'bigint' ? v : BigInt(checkSafeUint(v));
    if (b < 0n || b > 0xffff_ffff_ffff_ffffn) throw new RangeError(`not a uint64: ${v}`);
    const at = this.#reserve(8); // (first: it may replace the view)
    this.#view.setBigUint64(at, b, true);
  }

  f32(v: number): void {
    const at = this.#reserve(4); // (first: it may replace the view)
    this.#view.setFloat32(at, v, true);
  }

  u8(v: number): void {
    const at = this.#reserve(1); // (first: it may replace the view)
    this.#view.setUint8(at, v);
  }

  bytes(b: Uint8Array): void {
    const at = this.#reserve(b.length);
    this.#buf.set(b, at);
  }

  string(s: string): void {
    const b = utf8.encode(s);
    this.u64(b.length);
    this.bytes(b);
  }

  f32s(data: ArrayLike<number>): void {
    const at = this.#reserve(data.length * 4);
    for (let i = 0; i < data.length; i++) this.#view.setFloat32(at + i * 4, data[i] as number, true);
  }

  padTo(alignment: number): void {
    const rem = this.#len % alignment;
    if (rem !== 0) this.#reserve(alignment - rem); // new bytes are already zero
  }

  finish(): Uint8Array {
    return this.#buf.slice(0, this.#len);
  }
}

function checkSafeUint(v: number): number {
  if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`not a non-negative safe integer: ${v}`);
  return v;
}

function alignUp(n: number, alignment: number): number {
  return Math.ceil(n / alignment) * alignment;
}

function writeValue(w: ByteWriter, v: GgufValue): void {
  switch (v.type) {
    case 'uint32':
      w.u32(GGUF_TYPE.UINT32);
      w.u32(v.value);
      return;
    case 'int32':
      w.u32(GGUF_TYPE.INT32);
      w.i32(v.value);
      return;
    case 'float32':
      w.u32(GGUF_TYPE.FLOAT32);
      w.f32(v.value);
      return;
    case 'bool':
      w.u32(GGUF_TYPE.BOOL);
      w.u8(v.value ? 1 : 0);
      return;
    case 'string':
      w.u32(GGUF_TYPE.STRING);
      w.string(v.value);
      return;
    case 'uint64':
      w.u32(GGUF_TYPE.UINT64);
      w.u64(v.value);
      return;
    case 'string[]':
      w.u32(GGUF_TYPE.ARRAY);
      w.u32(GGUF_TYPE.STRING);
      w.u64(v.value.length);
      for (const s of v.value) w.string(s);
      return;
    case 'float32[]':
      w.u32(GGUF_TYPE.ARRAY);
      w.u32(GGUF_TYPE.FLOAT32);
      w.u64(v.value.length);
      w.f32s(v.value);
      return;
    case 'int32[]':
      w.u32(GGUF_TYPE.ARRAY);
      w.u32(GGUF_TYPE.INT32);
      w.u64(v.value.length);
      for (let i = 0; i < v.value.length; i++) w.i32(v.value[i] as number);
      return;
  }
}

/** Serialise a GGUF v3 file into memory. */
export function writeGguf(input: GgufWriteInput): Uint8Array {
  const alignment = input.alignment ?? GGUF_DEFAULT_ALIGNMENT;
  if (!Number.isInteger(alignment) || alignment <= 0 || (alignment & (alignment - 1)) !== 0) {
    throw new RangeError(`alignment must be a power of two, got ${alignment}`);
  }

  const metadata: GgufKv[] = [];
  const seenKeys = new Set<string>();
  let hasAlignmentKv = false;
  for (const entry of input.metadata) {
    if (seenKeys.has(entry.key)) throw new Error(`duplicate metadata key: ${entry.key}`);
    seenKeys.add(entry.key);
    if (entry.key === 'general.alignment') {
      if (entry.value.type !== 'uint32' || entry.value.value !== alignment) {
        throw new Error(`general.alignment must be uint32 ${alignment}`);
      }
      hasAlignmentKv = true;
    }
    metadata.push(entry);
  }
  if (!hasAlignmentKv) {
    // Put it right after general.architecture (or first) like the reference writers.
    const archIdx = metadata.findIndex((e) => e.key === 'general.architecture');
    metadata.splice(archIdx + 1, 0, kv('general.alignment', u32(alignment)));
  }

  const seenTensors = new Set<string>();
  const offsets: number[] = [];
  let dataSize = 0;
  for (const t of input.tensors) {
    if (seenTensors.has(t.name)) throw new Error(`duplicate tensor name: ${t.name}`);
    seenTensors.add(t.name);
    if (t.dims.length < 1 || t.dims.length > 4) throw new RangeError(`${t.name}: 1..4 dims required`);
    let n = 1;
    for (const d of t.dims) n *= checkSafeUint(d);
    if (n !== t.data.length) {
      throw new RangeError(`${t.name}: dims [${t.dims.join(', ')}] need ${n} values, got ${t.data.length}`);
    }
    offsets.push(dataSize);
    dataSize = alignUp(dataSize + n * 4, alignment);
  }

  const w = new ByteWriter(dataSize + (1 << 16));
  w.bytes(utf8.encode(GGUF_MAGIC));
  w.u32(GGUF_VERSION);
  w.u64(input.tensors.length);
  w.u64(metadata.length);

  for (const entry of metadata) {
    w.string(entry.key);
    writeValue(w, entry.value);
  }

  input.tensors.forEach((t, i) => {
    w.string(t.name);
    w.u32(t.dims.length);
    for (const d of t.dims) w.u64(d);
    w.u32(GGML_TYPE.F32);
    w.u64(offsets[i] as number);
  });

  w.padTo(alignment);
  const dataStart = w.length;
  input.tensors.forEach((t, i) => {
    const expected = dataStart + (offsets[i] as number);
    if (w.length !== expected) throw new Error(`internal: ${t.name} at ${w.length}, expected ${expected}`);
    w.f32s(t.data);
    w.padTo(alignment);
  });

  return w.finish();
}

/** Serialise a GGUF v3 file and write it to `file`. Returns the byte count. */
export function writeGgufFile(file: string, input: GgufWriteInput): number {
  const bytes = writeGguf(input);
  writeFileSync(file, bytes);
  return bytes.length;
}
