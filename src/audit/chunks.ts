// Reads a JSON-lines file in large chunks of whole lines, in bounded memory. Each chunk carries the
// number of its first line. A line longer than maxLine stops the reading with its line number.
import fs from 'node:fs';

export type Chunk = { bytes: Uint8Array; firstLine: number; lines: number } | { tooLong: number };

/** Bytes of whole lines a chunk holds at most (one worker task). */
export const DEFAULT_CHUNK_BYTES = 1 << 20;

export async function* readChunks(file: string, chunkSize = DEFAULT_CHUNK_BYTES, maxLine = 1 << 20): AsyncGenerator<Chunk> {
  const fh = await fs.promises.open(file, 'r');
  try {
    let carry = new Uint8Array(0);
    let line = 1;
    for (;;) {
      const buf = new Uint8Array(carry.length + chunkSize);
      buf.set(carry);
      const { bytesRead } = await fh.read(buf, carry.length, chunkSize, null);
      const filled = carry.length + bytesRead;
      const eof = bytesRead === 0;
      // Whole lines end at the last newline (or at the end of the file).
      const cut = eof ? filled : buf.lastIndexOf(10, filled - 1) + 1;
      let lines = 0;
      let from = 0;
      for (let nl = buf.indexOf(10, 0); nl !== -1 && nl < cut; nl = buf.indexOf(10, nl + 1)) {
        if (nl - from > maxLine) return yield { tooLong: line + lines };
        lines++;
        from = nl + 1;
      }
      if (eof && from < filled) {
        if (filled - from > maxLine) return yield { tooLong: line + lines };
        lines++;
      }
      if (cut > 0) yield { bytes: buf.subarray(0, cut), firstLine: line, lines };
      line += lines;
      carry = buf.slice(cut, filled);
      if (eof) return;
      if (carry.length > maxLine) return yield { tooLong: line };
    }
  } finally {
    await fh.close();
  }
}
