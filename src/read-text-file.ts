// Small files an operator names (the config, the node key, the API keys file, price lists, an
// envelope to verify), read whole without ever waiting on what is not a file: readFileSync on a
// FIFO blocks the thread until a writer comes (for ever, with the gateway's API keys file read
// again on a timer), and on a device such as /dev/zero it reads until memory runs out. Opened
// without blocking, checked, then read. Where a pipe is a real use (`--config <(envsubst < c.yaml)`,
// `verify <(sed -n 5p receipts.jsonl)`), `pipes` reads one to its end: waiting while its writer
// has written nothing yet, and as empty when nobody writes to it at all (never waited on).
import fs from 'node:fs';

/** The most a file read here may hold; a config or keys file is kilobytes. */
export const MAX_TEXT_FILE = 16 * 1024 * 1024;

export interface ReadFileOptions {
  /** Refused beyond this many bytes (default MAX_TEXT_FILE). */
  maxBytes?: number;
  /** Read a FIFO (a pipe) to its end instead of refusing it. */
  pipes?: boolean;
}

const PAUSE = new Int32Array(new SharedArrayBuffer(4));

/**
 * The file's bytes. Throws the file system's error (ENOENT, EACCES…: fsProblem words it), EISDIR
 * for a folder, ENOTREG for anything else that is not a regular file (or a pipe, with `pipes`),
 * ETOOLARGE beyond `maxBytes`.
 */
export function readFileBytes(file: string, opts: ReadFileOptions = {}): Buffer {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  try {
    const st = fs.fstatSync(fd);
    if (st.isDirectory()) throw errno('EISDIR', 'it is a folder');
    const pipe = st.isFIFO() && opts.pipes === true;
    if (!st.isFile() && !pipe) throw errno('ENOTREG', `it is ${st.isFIFO() ? 'a FIFO' : st.isSocket() ? 'a socket' : 'a device'}, not a regular file${opts.pipes ? ' or a pipe' : ''}`);
    return readFd(fd, opts.maxBytes ?? MAX_TEXT_FILE, st.isFile() ? st.size : undefined);
  } finally {
    fs.closeSync(fd);
  }
}

/** The file's text (UTF-8), as readFileBytes reads it. */
export function readTextFile(file: string, opts: ReadFileOptions | number = {}): string {
  return readFileBytes(file, typeof opts === 'number' ? { maxBytes: opts } : opts).toString('utf8');
}

/**
 * Everything `fd` holds to its end (a regular file of `size` bytes, or a pipe: undefined), at most
 * `maxBytes`. A pipe whose writer has written nothing yet is waited on (10 ms steps).
 */
export function readFd(fd: number, maxBytes: number, size?: number): Buffer {
  if (size !== undefined && size > maxBytes) throw errno('ETOOLARGE', `it holds ${size} bytes, more than the ${maxBytes} such a file may`);
  const buf = Buffer.alloc(size !== undefined ? size + 1 : Math.min(maxBytes + 1, 1 << 16));
  let n = 0;
  let grown = buf;
  for (;;) {
    if (n === grown.length) {
      if (grown.length > maxBytes) break;
      const next = Buffer.alloc(Math.min(maxBytes + 1, grown.length * 2));
      grown.copy(next, 0, 0, n);
      grown = next;
    }
    let r: number;
    try {
      r = fs.readSync(fd, grown, n, grown.length - n, null);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EAGAIN') throw e;
      Atomics.wait(PAUSE, 0, 0, 10); // a pipe whose writer has not written yet
      continue;
    }
    if (r === 0) break;
    n += r;
  }
  if (n > maxBytes) throw errno('ETOOLARGE', `it holds more than the ${maxBytes} bytes such a file may`);
  return grown.subarray(0, n);
}

function errno(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}
