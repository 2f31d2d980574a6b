/**
 * A structural check of a GGUF model file before any reader of it is given the file:
 *
 *   magic "GGUF" | u32 version | u64 tensor count | u64 metadata (kv) count
 *   kv:     string key | u32 type | value      (string: u64 length + bytes; array: u32 type, u64 count, values)
 *   tensor: string name | u32 n_dims | u64 dims[n_dims] | u32 ggml type | u64 offset
 *
 * node-llama-cpp reads the metadata in JavaScript first and llama.cpp then reads it again, and
 * neither bounds what a corrupt file claims: a header claiming more entries than the file holds
 * made node-llama-cpp read past the end for ever; an array whose element type is "array", or a
 * tensor with 2^32 − 1 dimensions, made it allocate without end (2 GB and growing, the start never
 * returning); a length of 2^31 aborted the process inside `fs.read`; a block or head count of 0
 * aborted it inside llama.cpp (GGML_ASSERT). Here every count and length is checked against the
 * bytes the file has left and every type against the ones GGUF defines, so such a file is refused
 * with a message naming it and what is wrong. Only the metadata and the tensor table are read (a
 * few MB for a real model), never the weights. What llama.cpp itself would abort on (hyperparameters,
 * a vocabulary, per-layer counts, experts, alignment, tensor types) is judged in
 * llama-cpp-bounds.ts from the facts gathered here.
 */
import fs from 'node:fs';
import { GgufFileError } from './gguf-errors.ts';
import { checkLlamaCppBounds, MAX_LAYERS, type GgufFacts, type GgufVocabulary } from './llama-cpp-bounds.ts';
import { notRegularFile } from '../model-file.ts';

export { GgufFileError };

export interface GgufSummary {
  version: number;
  tensors: number;
  kvs: number;
  architecture: string | undefined;
  /** `general.file_type` (llama.cpp's llama_ftype: the quantization), when the file says it. */
  fileType: number | undefined;
}

const HEADER_BYTES = 24;
const MIN_TENSOR_INFO = 24n;
const MIN_KV = 13n;
/** Bytes of each fixed-size GGUF value type (8 = string and 9 = array have none). */
const TYPE_SIZE: Record<number, number> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
const STRING = 8;
const ARRAY = 9;
/** The string values the bounds need (the rest, a chat template of megabytes, are skipped unread). */
const STRINGS_READ = /^(tokenizer\.ggml\.model|[^.]+\.rope\.scaling\.type)$/;
/** The number arrays the bounds need: per-layer counts, and the token types (at most a vocabulary's length). */
const NUMBER_ARRAYS_READ = /^(tokenizer\.ggml\.token_type|[^.]+\.(attention\.head_count|attention\.head_count_kv|feed_forward_length|expert_used_count))$/;
/** GGUF's integer value types. */
const INTEGER_TYPES = new Set([0, 1, 2, 3, 4, 5, 10, 11]);
/** ggml's GGML_MAX_NAME: a tensor name is shorter. */
const GGML_MAX_NAME = 64;
/** The most bytes of token text a vocabulary may have (real ones: a few MB). */
const MAX_VOCABULARY_BYTES = 64 << 20;
/** ggml's GGML_MAX_DIMS. */
const MAX_DIMS = 4;
/** ggml tensor types are numbered below this (GGML_TYPE_COUNT, with room for new ones). */
const GGML_TYPES = 64;
/** Most tokens a vocabulary may have here (real ones have up to ~10^6). */
const MAX_VOCABULARY = 1 << 22;
/** The longest key or tensor name taken (llama.cpp's names are short; a length beyond is corruption). */
const MAX_NAME = 65_535;

/** A forward reader of the file's first bytes, in chunks, every read bounded by the file's size. */
class Reader {
  private buf = Buffer.alloc(0);
  private bufAt = 0; // file offset of buf[0]
  pos = HEADER_BYTES;
  private readonly fd: number;
  readonly size: number;
  private readonly where: () => string;

  constructor(fd: number, size: number, where: () => string) {
    this.fd = fd;
    this.size = size;
    this.where = where;
  }

  get left(): number {
    return this.size - this.pos;
  }

  private need(n: number, what: string): void {
    if (n > this.left) throw new GgufFileError(`${this.where()}: ${what} needs ${n} bytes at offset ${this.pos}, past the end of the file (${this.size} bytes): a truncated or corrupt file`);
    const end = this.pos + n;
    if (this.pos >= this.bufAt && end <= this.bufAt + this.buf.length) return;
    const len = Math.min(Math.max(n, 1 << 20), this.size - this.pos);
    this.buf = Buffer.alloc(len);
    fs.readSync(this.fd, this.buf, 0, len, this.pos);
    this.bufAt = this.pos;
  }

  private at(n: number, what: string): number {
    this.need(n, what);
    const o = this.pos - this.bufAt;
    this.pos += n;
    return o;
  }

  // (the offset first: at() may replace the buffer)
  u32(what: string): number {
    const o = this.at(4, what);
    return this.buf.readUInt32LE(o);
  }

  /** A u64 as a number; one beyond what the file could hold is refused (it is a count or a length). */
  u64(what: string, limit = this.size): number {
    const o = this.at(8, what);
    const v = this.buf.readBigUInt64LE(o);
    if (v > BigInt(limit)) throw new GgufFileError(`${this.where()}: ${what} is ${v}, more than the file can hold: a corrupt file`);
    return Number(v);
  }

  i64(what: string): bigint {
    const o = this.at(8, what);
    return this.buf.readBigInt64LE(o);
  }

  /** A GGUF string (u64 length, then UTF-8 bytes). */
  string(what: string, max = this.size): string {
    const len = this.u64(`the length of ${what}`);
    if (len > this.left) throw new GgufFileError(`${this.where()}: ${what} claims ${len} bytes at offset ${this.pos}, past the end of the file (${this.size} bytes): a truncated or corrupt file`);
    if (len > max) throw new GgufFileError(`${this.where()}: ${what} is ${len} bytes long (at most ${max}): a corrupt file`);
    if (len === 0) return '';
    const o = this.at(len, what);
    return this.buf.toString('utf8', o, o + len);
  }

  /** A GGUF string's bytes as they are (one character a byte): a token's text, compared as llama.cpp compares it. */
  rawString(what: string, max: number): string {
    const len = this.u64(`the length of ${what}`);
    if (len > this.left) throw new GgufFileError(`${this.where()}: ${what} claims ${len} bytes at offset ${this.pos}, past the end of the file (${this.size} bytes): a truncated or corrupt file`);
    if (len > max) throw new GgufFileError(`${this.where()}: ${what} is ${len} bytes long, more token text than a vocabulary may have (${MAX_VOCABULARY_BYTES} bytes in all): a corrupt file`);
    if (len === 0) return '';
    const o = this.at(len, what);
    return this.buf.toString('latin1', o, o + len);
  }

  /** A GGUF string whose text is not needed. */
  skipString(what: string): void {
    const len = this.u64(`the length of ${what}`);
    this.skip(len, what);
  }

  skip(n: number, what: string): void {
    if (n > this.left) throw new GgufFileError(`${this.where()}: ${what} needs ${n} bytes at offset ${this.pos}, past the end of the file (${this.size} bytes): a truncated or corrupt file`);
    this.pos += n;
  }

  /** Reads a scalar value of a fixed-size type as a number or bigint (for the hyperparameters). */
  scalar(type: number, what: string): number | bigint {
    const o = this.at(TYPE_SIZE[type]!, what);
    switch (type) {
      case 0: return this.buf.readUInt8(o);
      case 1: return this.buf.readInt8(o);
      case 2: return this.buf.readUInt16LE(o);
      case 3: return this.buf.readInt16LE(o);
      case 4: return this.buf.readUInt32LE(o);
      case 5: return this.buf.readInt32LE(o);
      case 6: return this.buf.readFloatLE(o);
      case 7: return this.buf.readUInt8(o);
      case 10: return this.buf.readBigUInt64LE(o);
      case 11: return this.buf.readBigInt64LE(o);
      default: return this.buf.readDoubleLE(o);
    }
  }
}

const BYTE_TOKEN_TEXT = /^<0x[0-9A-Fa-f]{2}>$/;

/**
 * The token list as llama.cpp builds its map of it (llama-vocab.cpp): each text a C string (up to
 * a NUL), an empty one renamed "[EMPTY_<id>]". Kept: the map (for duplicates and the bytes a
 * SentencePiece vocabulary covers) and, for each token, whether it is spelled <0xHH>.
 */
function readVocabulary(r: Reader, count: number): GgufVocabulary {
  const ids = new Map<string, number>();
  const byteText = new Uint8Array(count);
  let duplicate: GgufVocabulary['duplicate'];
  let bytes = 0;
  for (let i = 0; i < count; i++) {
    const raw = r.rawString(`its element ${i}`, MAX_VOCABULARY_BYTES - bytes);
    bytes += raw.length;
    const nul = raw.indexOf('\0');
    const text = (nul >= 0 ? raw.slice(0, nul) : raw) || `[EMPTY_${i}]`;
    if (BYTE_TOKEN_TEXT.test(raw)) byteText[i] = 1;
    const first = ids.get(text);
    if (first === undefined) ids.set(text, i);
    else duplicate ??= { first, second: i, text };
  }
  return { ids, byteText, duplicate };
}

/** Checks `file`'s structure; throws GgufFileError naming the file and the problem (a file system error as it is). */
export function checkGgufFile(file: string): GgufSummary {
  const not = notRegularFile(file);
  if (not !== undefined) throw new GgufFileError(`${file} is ${not === 'a folder' ? not : `not a regular file (${not})`}, not a model file`);
  // (without blocking all the same: a FIFO put in its place since would hold the open, and the start, for ever)
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new GgufFileError(`${file} is not a regular file, not a model file`);
    const size = st.size;
    if (size === 0) throw new GgufFileError(`${file} is empty (0 bytes), not a GGUF model file`);
    const h = Buffer.alloc(HEADER_BYTES);
    const got = fs.readSync(fd, h, 0, HEADER_BYTES, 0);
    if (got < 4 || h.toString('latin1', 0, 4) !== 'GGUF') {
      const start = JSON.stringify(h.toString('latin1', 0, Math.min(got, 4)));
      throw new GgufFileError(`${file} is not a GGUF model file (it starts with ${start}, not "GGUF")`);
    }
    if (got < HEADER_BYTES) throw new GgufFileError(`${file} is a truncated GGUF file (${size} bytes, shorter than its ${HEADER_BYTES}-byte header)`);
    const version = h.readUInt32LE(4);
    if (version !== 2 && version !== 3) throw new GgufFileError(`${file}: GGUF version ${version} is not supported (2 or 3)`);
    const tensors = h.readBigUInt64LE(8);
    const kvs = h.readBigUInt64LE(16);
    if (tensors * MIN_TENSOR_INFO + kvs * MIN_KV > BigInt(size - HEADER_BYTES)) {
      throw new GgufFileError(`${file}: its GGUF header claims ${tensors} tensors and ${kvs} metadata entries, more than its ${size} bytes can hold (a truncated or corrupt file)`);
    }
    let where = file;
    const r = new Reader(fd, size, () => where);
    const facts: GgufFacts = { file, architecture: undefined, numbers: new Map(), strings: new Map(), numberArrays: new Map(), vocabulary: undefined, tensors: [] };
    for (let i = 0; i < Number(kvs); i++) {
      where = `${file}: metadata entry ${i}`;
      const key = r.string('its key', MAX_NAME);
      where = `${file}: metadata entry ${i} (${JSON.stringify(key.slice(0, 80))})`;
      const type = r.u32('its type');
      if (type === STRING) {
        // (only the architecture is read; other strings, a chat template of megabytes, are skipped)
        if (key === 'general.architecture') facts.architecture = r.string('its string value', 256);
        else if (STRINGS_READ.test(key)) facts.strings.set(key, r.string('its string value', 256));
        else r.skipString('its string value');
      } else if (type === ARRAY) {
        const elem = r.u32('its array element type');
        if (elem === ARRAY) throw new GgufFileError(`${where}: an array of arrays, which GGUF does not have: a corrupt file`);
        if (elem !== STRING && TYPE_SIZE[elem] === undefined) throw new GgufFileError(`${where}: array element type ${elem} is not a GGUF type: a corrupt file`);
        const count = r.u64('its array length', elem === STRING ? Math.floor(r.left / 8) : Math.floor(r.left / TYPE_SIZE[elem]!));
        // (the arrays read whole are bounded first: a vocabulary's tokens and types, or one count a layer)
        const most = key.startsWith('tokenizer.ggml.') ? MAX_VOCABULARY : MAX_LAYERS;
        if (count > most && (key === 'tokenizer.ggml.tokens' || NUMBER_ARRAYS_READ.test(key))) throw new GgufFileError(`${where}: ${count} entries (at most ${most})`);
        if (elem === STRING && key === 'tokenizer.ggml.tokens') facts.vocabulary = readVocabulary(r, count);
        else if (elem === STRING) for (let j = 0; j < count; j++) r.skipString(`its element ${j}`);
        else if (key === 'tokenizer.ggml.token_type' && INTEGER_TYPES.has(elem)) facts.numberArrays.set(key, Array.from({ length: count }, () => Number(r.scalar(elem, 'its array'))));
        else if (NUMBER_ARRAYS_READ.test(key)) {
          // llama.cpp reads a per-layer count into uint32: from a UINT32 or INT32 array only (-1 is 2^32 − 1 there).
          if (elem !== 4 && elem !== 5) throw new GgufFileError(`${where}: an array of GGUF type ${elem}, where llama.cpp reads 32-bit integers`);
          facts.numberArrays.set(key, Array.from({ length: count }, () => Number(r.scalar(elem, 'its array')) >>> 0));
        } else r.skip(count * TYPE_SIZE[elem]!, 'its array');
      } else if (TYPE_SIZE[type] !== undefined) {
        facts.numbers.set(key, r.scalar(type, 'its value'));
      } else {
        throw new GgufFileError(`${where}: value type ${type} is not a GGUF type: a corrupt file`);
      }
    }
    for (let i = 0; i < Number(tensors); i++) {
      where = `${file}: tensor ${i}`;
      const name = r.string('its name', MAX_NAME);
      where = `${file}: tensor ${i} (${JSON.stringify(name.slice(0, 80))})`;
      if (Buffer.byteLength(name) >= GGML_MAX_NAME) throw new GgufFileError(`${where}: a name of ${Buffer.byteLength(name)} bytes (llama.cpp takes at most ${GGML_MAX_NAME - 1}): a corrupt file`);
      const dims = r.u32('its number of dimensions');
      if (dims < 1 || dims > MAX_DIMS) throw new GgufFileError(`${where}: ${dims} dimensions (1 to ${MAX_DIMS}): a corrupt file`);
      for (let d = 0; d < dims; d++) {
        const n = r.i64(`its dimension ${d}`);
        if (n < 1n || n > 2n ** 53n) throw new GgufFileError(`${where}: dimension ${d} is ${n}: a corrupt file`);
      }
      const type = r.u32('its type');
      if (type >= GGML_TYPES) throw new GgufFileError(`${where}: tensor type ${type} is not a ggml type: a corrupt file`);
      r.i64('its data offset');
      facts.tensors.push({ name, type, dims });
    }
    where = file;
    checkLlamaCppBounds(facts);
    const fileType = facts.numbers.get('general.file_type');
    return { version, tensors: Number(tensors), kvs: Number(kvs), architecture: facts.architecture, fileType: fileType === undefined ? undefined : Number(fileType) };
  } finally {
    fs.closeSync(fd);
  }
}
