// Writes signed receipts to SQLite. Shared by the log's worker threads and its in-process mode.
import Database from 'better-sqlite3';
import { SIGNED_ITEM_BYTES } from '../../attestation/sign-batch.ts';

export const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS receipts (
  seq INTEGER PRIMARY KEY,
  request_key INTEGER NOT NULL,
  payload BLOB NOT NULL,
  sig BLOB NOT NULL,
  leaf BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS receipts_request_key ON receipts (request_key);
CREATE TABLE IF NOT EXISTS checkpoints (size INTEGER PRIMARY KEY, root BLOB NOT NULL, note TEXT NOT NULL, created_at INTEGER NOT NULL);
`;

/** Opens a connection the way every writer must: WAL, and a commit is on disk (fsync) when it returns. */
export function openDb(file: string, opts: { readonly?: boolean } = {}): Database.Database {
  const db = new Database(file, { readonly: opts.readonly ?? false });
  if (!opts.readonly) {
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = FULL');
  }
  db.pragma('busy_timeout = 10000');
  return db;
}

/**
 * A 53-bit integer key for a request id, for an index of fixed-size entries (a text index costs
 * several times more per insert). Collisions are harmless: lookups compare the payload's id.
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

export interface WriteBatch {
  firstSeq: number;
  requestKeys: Float64Array;
  payloads: Uint8Array;
  lengths: Uint32Array;
}

export function makeInserter(db: Database.Database): (b: WriteBatch, signed: Uint8Array) => void {
  const insert = db.prepare('INSERT INTO receipts (seq, request_key, payload, sig, leaf) VALUES (?, ?, ?, ?, ?)');
  return db.transaction((b: WriteBatch, signed: Uint8Array) => {
    let off = 0;
    for (let i = 0; i < b.lengths.length; i++) {
      const len = b.lengths[i]!;
      const o = i * SIGNED_ITEM_BYTES;
      insert.run(b.firstSeq + i, b.requestKeys[i]!, b.payloads.subarray(off, off + len), signed.subarray(o, o + 64), signed.subarray(o + 64, o + SIGNED_ITEM_BYTES));
      off += len;
    }
  });
}
