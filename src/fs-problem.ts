// File system failures in words an operator can act on. The usual one is a data dir made by
// another user (`sudo seller-node init`, then the service runs as itself): Node's own messages
// ("EACCES: permission denied, open …") are terse, existsSync() answers false as if the file were
// missing, and SQLite says only "unable to open database file", naming neither file nor cause.
import fs from 'node:fs';
import path from 'node:path';

/** Why a file system call failed: a few words from its code, else its message. */
export function fsProblem(e: unknown): string {
  const code = (e as { code?: unknown } | null)?.code;
  switch (code) {
    case 'ENOENT':
      return 'not found';
    case 'EACCES':
    case 'EPERM':
      return `permission denied to this user (uid ${process.getuid?.() ?? '?'}): run seller-node as the user who owns it, or change its permissions`;
    case 'ENOTDIR':
      return 'a folder on its path is a file';
    case 'EISDIR':
      return 'it is a folder';
    case 'EROFS':
      return 'the file system is read-only';
    case 'ENOSPC':
      return 'no space left on the device';
    default:
      return (e as Error | null)?.message ?? String(e);
  }
}

/**
 * undefined when this user may use `file` so (`mode`: fs.constants.R_OK…; by default, that it
 * exists); 'missing' when it does not exist; else why not.
 */
export function accessProblem(file: string, mode: number = fs.constants.F_OK): 'missing' | string | undefined {
  try {
    fs.accessSync(file, mode);
    return undefined;
  } catch (e) {
    return (e as { code?: unknown }).code === 'ENOENT' ? 'missing' : fsProblem(e);
  }
}

/**
 * Why SQLite could not open `file` (its error says neither): the file itself when it exists,
 * else the folder it would be created in. Falls back to SQLite's own message.
 */
export function sqliteOpenProblem(file: string, e: unknown): string {
  const own = (e as Error | null)?.message ?? String(e);
  if ((e as { code?: unknown } | null)?.code !== 'SQLITE_CANTOPEN') return own;
  const probe = (p: string, mode: number): string | undefined => {
    try {
      fs.accessSync(p, mode);
      return undefined;
    } catch (err) {
      return fsProblem(err);
    }
  };
  const { R_OK, W_OK, X_OK } = fs.constants;
  const there = accessProblem(file);
  if (there === undefined) return probe(file, R_OK | W_OK) ?? own;
  if (there !== 'missing') return there;
  const dir = path.dirname(path.resolve(file));
  const inDir = probe(dir, W_OK | X_OK);
  return inDir ? `cannot be created in ${dir}: ${inDir}` : own;
}

/**
 * Why this user could not write the SQLite file `file` in WAL mode, or undefined: the file when it
 * exists, and its folder, where SQLite keeps the -wal and -shm files beside it. (SQLite opens a
 * file it may not write read-only, and fails later: "attempt to write a readonly database".)
 */
export function sqliteWriteProblem(file: string): string | undefined {
  if (file === ':memory:' || file === '') return undefined;
  const { W_OK, X_OK } = fs.constants;
  const there = accessProblem(file, W_OK);
  if (there !== undefined && there !== 'missing') return there;
  const dir = path.dirname(path.resolve(file));
  const inDir = accessProblem(dir, W_OK | X_OK);
  return inDir === undefined ? undefined : `its folder ${dir}: ${inDir === 'missing' ? 'not found' : inDir}`;
}

/** Wraps an error from opening a SQLite file so that its message names the file and why. */
export function sqliteOpenError(file: string, e: unknown): Error {
  return new Error(`${path.resolve(file)}: ${sqliteOpenProblem(file, e)}`, { cause: e });
}
