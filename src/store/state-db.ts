// state.db: the node's small working state (used ticket ids, idempotency records, which hold the
// answers of requests sent with an Idempotency-Key for 24 h: private to this user, and zeroed when
// deleted).
import type Database from 'better-sqlite3';
import { openWritableSqlite } from '../sqlite-file.ts';

/**
 * WAL with synchronous = NORMAL: a write survives any crash of the node process (the WAL is in
 * the page cache) without an fsync on the path to the first token; only a power cut in the next
 * moment could lose it. Tickets live 60 s; receipts, the money, are fsynced in receipts.db.
 */
export function openStateDb(file: string): Database.Database {
  const db = openWritableSqlite(file);
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = NORMAL');
  // Deleted rows (recorded answers past their 24 h) are overwritten with zeros, not left in free pages.
  db.pragma('secure_delete = ON');
  // Checkpoints are a WalCheckpointer's (a thread of its own), never SQLite's own within a write:
  // the node runs each through its seal (sqlite-seal.ts: a database file changed by anything else
  // is then told from its checkpoints), and runs one itself past FALLBACK_CHECKPOINT_PAGES of WAL,
  // should the thread not keep up (node.ts, its file watch).
  db.pragma('wal_autocheckpoint = 0');
  // Read once: SQLite then has the WAL open, its -wal and -shm there, for the seal to open too (a
  // new state.db has neither until its first read, and a seal attached then never watched them).
  db.pragma('schema_version', { simple: true });
  return db;
}
