/**
 * A check of a GGUF file's fixed header before llama.cpp is given the file:
 *   magic "GGUF" | u32 version | u64 tensor count | u64 metadata (kv) count
 *
 * node-llama-cpp reads the metadata in JavaScript first, and on a file whose header claims more
 * entries than the file holds it can read past the end for ever (a 15-byte file starting "GGUF"
 * hangs it: the reads past the end come back empty and each entry parses as a zero-length one).
 * Every tensor entry takes at least 24 bytes (name length, n_dims, type, offset) and every
 * metadata entry at least 13 (key length, type, a one-byte value), so counts that cannot fit are
 * refused here, with a message an operator can act on. Truncated real models have plausible
 * counts and are refused by llama.cpp itself, at once.
 */
import fs from 'node:fs';

export class GgufHeaderError extends Error {
  override name = 'GgufHeaderError';
}

export interface GgufHeader {
  version: number;
  tensors: bigint;
  kvs: bigint;
}

const HEADER_BYTES = 24;
const MIN_TENSOR_INFO = 24n;
const MIN_KV = 13n;

/** Reads and checks the header of `file`; throws GgufHeaderError naming the file and the problem. */
export function checkGgufHeader(file: string): GgufHeader {
  const fd = fs.openSync(file, 'r');
  try {
    const size = fs.fstatSync(fd).size;
    const h = Buffer.alloc(HEADER_BYTES);
    const got = fs.readSync(fd, h, 0, HEADER_BYTES, 0);
    if (got < 4 || h.toString('latin1', 0, 4) !== 'GGUF') {
      const start = JSON.stringify(h.toString('latin1', 0, Math.min(got, 4)));
      throw new GgufHeaderError(`${file} is not a GGUF model file (it starts with ${start}, not "GGUF")`);
    }
    if (got < HEADER_BYTES) throw new GgufHeaderError(`${file} is a truncated GGUF file (${size} bytes, shorter than its ${HEADER_BYTES}-byte header)`);
    const version = h.readUInt32LE(4);
    if (version !== 2 && version !== 3) throw new GgufHeaderError(`${file}: GGUF version ${version} is not supported (2 or 3)`);
    const tensors = h.readBigUInt64LE(8);
    const kvs = h.readBigUInt64LE(16);
    if (tensors * MIN_TENSOR_INFO + kvs * MIN_KV > BigInt(size - HEADER_BYTES)) {
      throw new GgufHeaderError(`${file}: its GGUF header claims ${tensors} tensors and ${kvs} metadata entries, more than its ${size} bytes can hold (a truncated or corrupt file)`);
    }
    return { version, tensors, kvs };
  } finally {
    fs.closeSync(fd);
  }
}
