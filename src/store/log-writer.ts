// SQLite layout and writes of the receipt log, shared by its writer thread and its in-process
// mode. A group-committed batch is stored as one row: its payloads, signatures, leaf hashes and
// request-id keys as flat blobs, in 64 KiB pages. A commit then writes a handful of pages at the
// end of the file. (A row per receipt costs B-tree work per receipt, and an index on request ids,
// which are random, dirties a different page for almost every receipt: measured, 250 page writes
// a commit instead of 5.)
import type Database from 'better-sqlite3';
import type { SignedBatch } from '../../attestation/sign-batch.ts';
import { openWritableSqlite } from '../sqlite-file.ts';
import type { SealProblem, SqliteSeal } from './sqlite-seal.ts';

export const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS receipt_batches (
  first_seq INTEGER PRIMARY KEY,
  count INTEGER NOT NULL,
  payloads BLOB NOT NULL,   -- UTF-8 canonical payloads laid end to end
  offsets BLOB NOT NULL,    -- (count + 1) little-endian uint32 offsets into payloads
  sigs BLOB NOT NULL,       -- count × 64-byte Ed25519 signatures
  leaves BLOB NOT NULL,     -- count × 32-byte Merkle leaf hashes of the envelopes
  request_keys BLOB NOT NULL -- count × float64 (little-endian) requestKey(request_id)
);
CREATE TABLE IF NOT EXISTS checkpoints (size INTEGER PRIMARY KEY, root BLOB NOT NULL, note TEXT NOT NULL, created_at INTEGER NOT NULL);
`;

/** Opens a connection the way every writer must: WAL, and a commit is on disk (fsync) when it returns. */
export function openDb(file: string): Database.Database {
  const db = openWritableSqlite(file);
  db.pragma('page_size = 65536'); // takes effect when the file is created
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.pragma('busy_timeout = 10000');
  // Never a checkpoint of SQLite's own: the inserter runs them (CHECKPOINT_PAGES), each only once
  // the log's files are found as SQLite left them (sqlite-seal.ts). A connection that commits no
  // receipts (the event loop's, `log export` beside a running node) never copies the WAL into the
  // database, so a change of that file can be told from a checkpoint.
  db.pragma('wal_autocheckpoint = 0');
  db.pragma(`journal_size_limit = ${16 * 1024 * 1024}`);
  return db;
}

/**
 * With 64 KiB pages, SQLite's default of a checkpoint every 1,000 pages lets the WAL reach 64 MiB
 * (a lone receipt's commit is a whole page), and the file stays that large. A checkpoint every 128
 * pages costs little (a run of lone receipts rewrites the same few pages: only the last copy of
 * each goes to the database), and the file is cut back to 16 MiB after one.
 */
export const CHECKPOINT_PAGES = 128;

/** The log's files were changed in place by another program (sqlite-seal.ts): nothing more is committed. */
export class FilesChangedError extends Error {
  override name = 'FilesChangedError';
  readonly code = 'log_files_changed';
  readonly problem: SealProblem;
  constructor(problem: SealProblem) {
    super(`receipt log file ${problem.file} ${problem.what}`);
    this.problem = problem;
  }
}

/**
 * Where a committed batch is in the WAL (its generation, the salts SQLite gives a WAL each time it
 * starts it over, and the index's last frame after the commit), and how much of the WAL had been
 * copied into the database then: the log keeps a batch in memory until the database file holds it
 * (receipt-log.ts, held).
 */
export interface CommitMark {
  gen: string;
  frame: number;
  backfillGen: string;
  backfilled: number;
  /** The files found changed at the checkpoint after this commit (the batch itself is durable). */
  problem?: SealProblem;
}

/**
 * Whether a batch at `mark` is in the database file, by a reading of the WAL index `now` taken
 * after the mark: its WAL copied in that far, or started over since (SQLite starts a WAL over only
 * once all of it is in the database).
 */
export function inDatabaseFile(mark: { gen: string; frame: number }, now: { backfillGen: string; backfilled: number }): boolean {
  return now.backfillGen !== mark.gen || now.backfilled >= mark.frame;
}

/**
 * A 53-bit integer key for a request id, for an index of fixed-size entries. Collisions are
 * harmless: lookups compare the payload's request id.
 */
export function requestKey(requestId: string): number {
  // Two 32-bit FNV-1a lanes with different offsets, 21 + 32 bits kept.
  let a = 0x811c9dc5;
  let b = 0x050c5d1f;
  for (let i = 0; i < requestId.length; i++) {
    const c = requestId.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193);
    b = Math.imul(b ^ c, 0x01000193) ^ (b >>> 13);
  }
  return (a >>> 11) * 0x100000000 + (b >>> 0);
}

export interface BatchRow {
  first_seq: number;
  count: number;
  payloads: Uint8Array;
  offsets: Uint8Array;
  sigs: Uint8Array;
  leaves: Uint8Array;
  request_keys: Uint8Array;
}

/** The request keys of a stored batch. */
export function rowRequestKeys(r: { request_keys: Uint8Array; count: number }): Float64Array {
  const b = r.request_keys;
  if (b.byteLength !== r.count * 8) throw new Error('receipt batch request keys are damaged');
  const out = new Float64Array(r.count);
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  for (let i = 0; i < r.count; i++) out[i] = view.getFloat64(i * 8, true);
  return out;
}

/** A stored row as a SignedBatch (views, no copies). */
export function rowToBatch(r: BatchRow): SignedBatch {
  const o = r.offsets;
  if (o.byteLength !== (r.count + 1) * 4 || r.sigs.byteLength !== r.count * 64 || r.leaves.byteLength !== r.count * 32) {
    throw new Error(`receipt batch at seq ${r.first_seq} is damaged`);
  }
  const offsets = new Uint32Array(r.count + 1);
  const view = new DataView(o.buffer, o.byteOffset, o.byteLength);
  for (let i = 0; i <= r.count; i++) offsets[i] = view.getUint32(i * 4, true);
  return { payloads: r.payloads, offsets, sigs: r.sigs, leaves: r.leaves };
}

function offsetsBlob(offsets: Uint32Array): Uint8Array {
  const out = new Uint8Array(offsets.length * 4);
  const view = new DataView(out.buffer);
  offsets.forEach((v, i) => view.setUint32(i * 4, v, true));
  return out;
}

/** A batch's request keys as stored (count × little-endian float64). */
export function requestKeysBlob(requestKeys: Float64Array): Uint8Array {
  const keys = new Uint8Array(requestKeys.length * 8);
  const view = new DataView(keys.buffer);
  requestKeys.forEach((k, i) => view.setFloat64(i * 8, k, true));
  return keys;
}

/** Stores one batch as its row (the caller's transaction, if any). */
export function insertBatchRow(stmt: Database.Statement, firstSeq: number, requestKeys: Float64Array, b: SignedBatch): void {
  stmt.run(firstSeq, b.offsets.length - 1, b.payloads, offsetsBlob(b.offsets), b.sigs, b.leaves, requestKeysBlob(requestKeys));
}

export const INSERT_BATCH = 'INSERT INTO receipt_batches (first_seq, count, payloads, offsets, sigs, leaves, request_keys) VALUES (?, ?, ?, ?, ?, ?, ?)';

export interface Inserter {
  /**
   * Commits one signed batch (one transaction: one fsync), once the log's files are found as
   * SQLite left them (else FilesChangedError), then checkpoints the WAL when it holds
   * CHECKPOINT_PAGES frames or more (after the same check: a problem found then is in the mark).
   */
  (firstSeq: number, requestKeys: Float64Array, b: SignedBatch): CommitMark | undefined;
  /** Commits nothing more from now on (the log stopped): `e` is thrown at every later call. */
  stop(e: Error): void;
}

/**
 * Returns a function that commits one signed batch. After one commit fails it commits nothing
 * more, throwing that failure again: a later batch that fitted (a smaller one on a full disk)
 * would leave a gap in seq, breaking the chain on disk (s25 hR). Both writers, the thread and the
 * in-process one, commit through it. Per commit, with a seal: one stat and three small reads
 * before (sqlite-seal.ts), one read of the WAL index after.
 */
export function makeInserter(db: Database.Database, seal: SqliteSeal): Inserter {
  const insertBatch = db.prepare(INSERT_BATCH);
  let failed: unknown;
  let unindexed = 0;
  const insert = ((firstSeq: number, requestKeys: Float64Array, b: SignedBatch): CommitMark | undefined => {
    if (failed !== undefined) throw failed;
    const before = seal.check();
    if (before) throw (failed = new FilesChangedError(before));
    try {
      insertBatchRow(insertBatch, firstSeq, requestKeys, b);
    } catch (e) {
      failed = e;
      throw e;
    }
    const at = seal.index();
    if (!at) {
      // (no WAL index to read, which a WAL-mode file always has: the WAL is still kept bounded)
      if (++unindexed % CHECKPOINT_PAGES === 0) db.pragma('wal_checkpoint(PASSIVE)');
      return undefined;
    }
    const mark: CommitMark = { gen: at.gen, frame: at.mxFrame, backfillGen: at.gen, backfilled: at.nBackfill };
    if (at.mxFrame >= CHECKPOINT_PAGES) {
      let problem: SealProblem | undefined;
      try {
        problem = seal.checkpoint(db);
      } catch {
        // (a checkpoint that fails, SQLITE_BUSY say, is tried after the next commit: the batch is durable)
      }
      if (problem) {
        failed = new FilesChangedError(problem);
        mark.problem = problem;
      }
      const after = seal.index();
      if (after) Object.assign(mark, { backfillGen: after.gen, backfilled: after.nBackfill });
    }
    return mark;
  }) as Inserter;
  insert.stop = (e: Error) => {
    failed ??= e;
  };
  return insert;
}
