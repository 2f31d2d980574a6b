// Opening a SQLite file this process writes (receipts.db, state.db, node.lock). SQLite opens a file
// it may not write read-only and fails later ("attempt to write a readonly database"), and says
// only "unable to open database file" when it cannot open one, naming neither file nor cause: so
// the file and its folder (where the -wal and -shm files go) are checked first, and any failure
// names the file.
import path from 'node:path';
import fs from 'node:fs';
import Database from 'better-sqlite3';
import { accessProblem } from './fs-problem.ts';

/** Opens `file` (created if missing) for writing; an Error naming the file and why, when this user cannot. */
export function openWritableSqlite(file: string): Database.Database {
  const abs = path.resolve(file);
  const problem = writeProblem(abs);
  if (problem) throw new Error(`${abs}: ${problem}`);
  try {
    return new Database(file);
  } catch (e) {
    throw new Error(`${abs}: ${(e as Error).message}`, { cause: e });
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
