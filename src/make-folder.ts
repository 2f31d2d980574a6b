// Makes a folder and the folders above it that are missing, as fs.mkdirSync(dir, { recursive: true })
// does, except that a refusal is an error: Node's recursive mkdir loops for ever (at 100 % CPU, deaf
// to signals, printing nothing) when mkdir says ENOENT under a parent that exists, as it does
// anywhere under /proc and on a mount gone stale. Each missing folder is made in turn from the
// nearest one that exists.
import fs from 'node:fs';
import path from 'node:path';

const code = (e: unknown): unknown => (e as { code?: unknown } | null)?.code;

/** Throws fs's own error (its `code` set) when a folder cannot be made, or `dir` is not a folder. */
export function makeFolder(dir: string, mode?: number): void {
  const target = path.resolve(dir);
  const missing: string[] = [];
  for (let at = target; ; at = path.dirname(at)) {
    try {
      fs.statSync(at);
      break;
    } catch (e) {
      if (code(e) !== 'ENOENT') throw e; // (ENOTDIR: a file on the path; EACCES)
    }
    missing.unshift(at);
    if (path.dirname(at) === at) break;
  }
  for (const folder of missing) {
    try {
      fs.mkdirSync(folder, mode === undefined ? {} : { mode });
    } catch (e) {
      // Made meanwhile by someone else: fine when it is a folder. (A dangling symbolic link says
      // EEXIST: its stat says what is wrong, ENOENT.)
      if (code(e) !== 'EEXIST' || !fs.statSync(folder).isDirectory()) throw e;
    }
  }
  if (!fs.statSync(target).isDirectory()) throw Object.assign(new Error(`EEXIST: file already exists, mkdir '${target}'`), { code: 'EEXIST', path: target });
}
