// One writer per data directory. A node, or `seller-node log fill`, appends to receipts.db and
// marks tickets used in state.db from memory it alone keeps (the next seq, the chain head, the
// Merkle tree): a second writer on the same folder would fork the chain or stop the first.
//
// The lock is the operating system's: an exclusive SQLite transaction held on `<dir>/node.lock`
// (fcntl locks, taken within a process too). It is released when the holder closes it or its
// process ends, however it ends, so a crash or SIGKILL never leaves a stale lock behind. The file
// stays empty; nothing is ever written through it. `log export` takes no lock: it only reads, and
// the checkpoint it may add is the one the node would sign (ReceiptLog.checkpoint).
import path from 'node:path';
import { openWritableSqlite } from './sqlite-file.ts';

export const LOCK_FILE = 'node.lock';

export class DataDirInUseError extends Error {
  override name = 'DataDirInUseError';
  readonly code = 'data_dir_in_use';
}

export interface DataDirLock {
  /** Lets the next writer in. Idempotent. */
  release(): void;
}

/** Takes the data directory's writer lock, or throws DataDirInUseError at once (it never waits). */
export function lockDataDir(dir: string): DataDirLock {
  const file = path.join(path.resolve(dir), LOCK_FILE);
  const db = openWritableSqlite(file);
  try {
    db.pragma('busy_timeout = 0');
    db.pragma('locking_mode = EXCLUSIVE');
    db.exec('BEGIN EXCLUSIVE');
  } catch (e) {
    db.close();
    if ((e as { code?: unknown }).code === 'SQLITE_BUSY') {
      throw new DataDirInUseError(`${path.resolve(dir)} is in use by another seller-node process (a running node or log fill holds ${file}); stop it first, or use another data dir`);
    }
    throw e;
  }
  return {
    release() {
      if (db.open) db.close();
    },
  };
}
