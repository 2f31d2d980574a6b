// Writing a file so that a reader sees the old version or the whole new one, never a part of it: a
// temporary file beside it is filled, fsynced, then renamed over it.
import fs from 'node:fs';
import path from 'node:path';

/**
 * Writes `file` atomically: `write(fd)` fills a temporary file beside it (removed if anything
 * fails), which is fsynced and renamed into place. With `mode`, the file gets exactly that mode
 * whatever the umask. The caller fsyncs the folder when the rename itself must be durable; with
 * `fsync: false` the file is not fsynced either (a file that may be older after a power cut, never
 * a part of one; see checkpoint-head.ts). A file
 * system error names `file` as its `path` (not the temporary file, nor nothing, as a write on a
 * descriptor would).
 */
export function writeFileAtomic(file: string, write: (fd: number) => void, mode?: number, opts: { fsync?: boolean } = {}): void {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${process.pid}.tmp`);
  let fd: number;
  try {
    fd = fs.openSync(tmp, 'w', mode ?? 0o666);
  } catch (e) {
    throw naming(e, file);
  }
  try {
    write(fd);
    if (mode !== undefined) fs.fchmodSync(fd, mode);
    if (opts.fsync !== false) fs.fsyncSync(fd);
  } catch (e) {
    fs.closeSync(fd);
    fs.rmSync(tmp, { force: true });
    throw naming(e, file);
  }
  fs.closeSync(fd);
  try {
    fs.renameSync(tmp, file);
  } catch (e) {
    // (the target is a folder, the file system refuses, ...): the filled temporary file goes too
    fs.rmSync(tmp, { force: true });
    throw naming(e, file);
  }
}

/**
 * Writes all of `data` at the descriptor's position: fs.writeSync may write only part of it (a
 * file size limit or a quota reached mid-write), and the rest is then written, or its error thrown.
 */
export function writeAllSync(fd: number, data: string | Uint8Array): void {
  let bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
  while (bytes.length > 0) {
    const n = fs.writeSync(fd, bytes);
    if (n <= 0) throw Object.assign(new Error(`short write: ${bytes.length} bytes not written`), { code: 'EIO' });
    bytes = bytes.subarray(n);
  }
}

/** `e` with `path` = `file` when it is a file system error about the temporary file or no file. */
function naming(e: unknown, file: string): unknown {
  if (e !== null && typeof e === 'object' && typeof (e as { code?: unknown }).code === 'string') {
    const err = e as { path?: string; dest?: string };
    err.path = file;
    delete err.dest;
  }
  return e;
}
