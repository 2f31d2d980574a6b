// Opening a SQLite file this process writes (receipts.db, state.db, node.lock). SQLite opens a file
// it may not write read-only and fails later ("attempt to write a readonly database"), and says
// only "unable to open database file" when it cannot open one, naming neither file nor cause: so
// the file and its folder (where the -wal and -shm files go) are checked first, and any failure
// names the file.
import path from 'node:path';
import fs from 'node:fs';
import Database from 'better-sqlite3';
import { accessProblem } from './fs-problem.ts';

/**
 * Opens `file` (created if missing, readable by this user only: SQLite gives its -wal and -shm
 * files the database's mode) for writing; an Error naming the file and why, when this user cannot.
 */
export function openWritableSqlite(file: string, options?: Database.Options): Database.Database {
  const abs = path.resolve(file);
  const problem = writeProblem(abs);
  if (problem) throw new Error(`${abs}: ${problem}`);
  try {
    createPrivate(abs);
    return new Database(file, options);
  } catch (e) {
    throw new Error(`${abs}: ${(e as Error).message}`, { cause: e });
  }
}

/** Creates `file` empty with mode 0600 when it does not exist (SQLite would make it 0644 under the usual umask). */
export function createPrivate(file: string): void {
  try {
    fs.closeSync(fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL, 0o600));
  } catch (e) {
    if ((e as { code?: unknown }).code !== 'EEXIST') throw e;
  }
}

/** Why this user could not write `file` in WAL mode, or undefined: the file when it exists, and its folder. */
function writeProblem(file: string): string | undefined {
  const { W_OK, X_OK } = fs.constants;
  const there = accessProblem(file, W_OK);
  if (there !== undefined && there !== 'missing') return there;
  const dir = path.dirname(file);
  const inDir = accessProblem(dir, W_OK | X_OK);
  return inDir === undefined ? undefined : `its folder ${dir}: ${inDir === 'missing' ? 'not found' : inDir}`;
}
