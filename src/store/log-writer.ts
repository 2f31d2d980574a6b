// SQLite layout and writes of the receipt log, shared by its worker threads and its in-process
// mode. A group-committed batch is stored as one row: its payloads, signatures and leaf hashes as
// flat blobs. That keeps the per-receipt cost of durability to a memcpy and a small index entry,
// where a row per receipt costs B-tree work per receipt.
import Database from 'better-sqlite3';
import type { SignedBatch } from '../../attestation/sign-batch.ts';

export const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS receipt_batches (
  first_seq INTEGER PRIMARY KEY,
  count INTEGER NOT NULL,
  payloads BLOB NOT NULL,   -- UTF-8 canonical payloads laid end to end
  offsets BLOB NOT NULL,    -- (count + 1) little-endian uint32 offsets into payloads
  sigs BLOB NOT NULL,       -- count × 64-byte Ed25519 signatures
  leaves BLOB NOT NULL      -- count × 32-byte Merkle leaf hashes of the envelopes
);
CREATE TABLE IF NOT EXISTS receipt_requests (request_key INTEGER NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (request_key, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (size INTEGER PRIMARY KEY, root BLOB NOT NULL, note TEXT NOT NULL, created_at INTEGER NOT NULL);
`;

/** Opens a connection the way every writer must: WAL, and a commit is on disk (fsync) when it returns. */
export function openDb(file: string): Database.Database {
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.pragma('busy_timeout = 10000');
  return db;
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

/** Returns a function that commits one signed batch (one transaction: one fsync). */
export function makeInserter(db: Database.Database): (firstSeq: number, requestKeys: Float64Array, b: SignedBatch) => void {
  const insertBatch = db.prepare('INSERT INTO receipt_batches (first_seq, count, payloads, offsets, sigs, leaves) VALUES (?, ?, ?, ?, ?, ?)');
  const insertRequest = db.prepare('INSERT OR IGNORE INTO receipt_requests (request_key, seq) VALUES (?, ?)');
  return db.transaction((firstSeq: number, requestKeys: Float64Array, b: SignedBatch) => {
    const count = b.offsets.length - 1;
    insertBatch.run(firstSeq, count, b.payloads, offsetsBlob(b.offsets), b.sigs, b.leaves);
    for (let i = 0; i < count; i++) insertRequest.run(requestKeys[i]!, firstSeq + i);
  });
}
