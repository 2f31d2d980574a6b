// Copying a receipt log out after its files were changed in place (sqlite-seal.ts): its -wal cut
// short or written over, or an older copy of its database written over it. VACUUM INTO through the
// open connection (file-guard.ts, for a file deleted or replaced) would read the changed files:
// pages the cut WAL no longer holds, or old pages under new ones. So the copy is built from every
// source the node still has, and each receipt in it is checked against the log's Merkle tree,
// which the node holds in memory for every durable receipt:
//   1. the database file as it is (a WAL cut short leaves it as the last checkpoint left it; an
//      older copy written over it holds that copy's receipts), copied byte for byte, then opened;
//   2. the batches the node committed that the database file did not hold yet (kept in memory
//      until a checkpoint copies them in: exactly what a cut WAL loses);
//   3. what the open connection still reads (its cache, the WAL's pages over the old file).
// A receipt is kept only when its stored leaf is the tree's at its seq and is the hash of its
// envelope line (payload and signature as stored): a page from another time cannot pass.
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { leafHash } from '../../attestation/merkle.ts';
import { batchItem, type SignedBatch } from '../../attestation/sign-batch.ts';
import { INSERT_BATCH, SCHEMA, insertBatchRow, requestKey, rowToBatch, type BatchRow } from './log-writer.ts';

/** A committed batch the database file may not hold yet. */
export interface HeldBatch {
  firstSeq: number;
  signed: SignedBatch;
  requestKeys: Float64Array;
}

export interface SalvageInput {
  /** The log's open connection (it may read through the changed files). */
  db: Database.Database;
  dbPath: string;
  /** The database file as this process opened it (read only; never closed here), -1 when there is none. */
  dbFd: number;
  providerId: string;
  /** Durable receipts: seqs 0 to size - 1. */
  size: number;
  leafAt(seq: number): Uint8Array;
  /** A receipt's envelope line from its payload and signature (its leaf is leafHash of it). */
  lineOf(payload: Uint8Array, sig: Uint8Array): string;
  held: readonly HeldBatch[];
  /** Sizes of checkpoints to have in the copy, and each one's signed note and root. */
  checkpoints: readonly number[];
  checkpointAt(size: number): { root: Uint8Array; note: string };
}

export type SalvageResult = { ok: true; file: string; kept: number; missing: [number, number][] } | { ok: false; error: string };

/** Receipts checked between two turns of the event loop. */
const CHECK_CHUNK = 2048;
const yieldLoop = (): Promise<void> => new Promise((r) => setImmediate(r));

/** The seq ranges (inclusive) of [0, size) not covered. */
function gaps(covered: Map<number, number>, size: number): [number, number][] {
  const out: [number, number][] = [];
  let at = 0;
  for (const [first, count] of [...covered].sort((a, b) => a[0] - b[0])) {
    if (first > at) out.push([at, first - 1]);
    at = Math.max(at, first + count);
  }
  if (at < size) out.push([at, size - 1]);
  return out;
}

/** Whether [first, first + count) overlaps a covered batch. */
function overlaps(covered: Map<number, number>, first: number, count: number): boolean {
  for (const [f, n] of covered) if (first < f + n && f < first + count) return true;
  return false;
}

function removeDb(file: string): void {
  for (const f of [file, `${file}-wal`, `${file}-shm`, `${file}-journal`]) {
    try {
      fs.rmSync(f, { force: true });
    } catch {
      // (its folder gone: nothing to remove)
    }
  }
}

/** Copies the database file's bytes (from this process's descriptor) to `to`, made 0600, synced. */
async function copyBytes(fromFd: number, to: string): Promise<void> {
  const out = fs.openSync(to, 'wx', 0o600);
  try {
    const buf = Buffer.alloc(8 * 1024 * 1024);
    for (let at = 0; ; ) {
      const n = fs.readSync(fromFd, buf, 0, buf.length, at);
      if (n <= 0) break;
      for (let w = 0; w < n; ) w += fs.writeSync(out, buf, w, n - w, at + w);
      at += n;
      await yieldLoop();
    }
    fs.fsyncSync(out);
  } finally {
    fs.closeSync(out);
  }
}

class Salvage {
  private readonly input: SalvageInput;
  /** Batches in the copy, checked: first seq → count. */
  readonly covered = new Map<number, number>();
  /** Reads that failed (a damaged page) in rows(). */
  readErrors = 0;
  private checkedSinceYield = 0;

  constructor(input: SalvageInput) {
    this.input = input;
  }

  /** A stored row as a batch every receipt of which is the log's at its seq, or undefined. */
  async verify(r: BatchRow): Promise<SignedBatch | undefined> {
    const { size, leafAt, lineOf } = this.input;
    if (!Number.isSafeInteger(r.first_seq) || !Number.isSafeInteger(r.count) || r.count < 1 || r.first_seq < 0 || r.first_seq + r.count > size) return undefined;
    let b: SignedBatch;
    try {
      b = rowToBatch(r);
    } catch {
      return undefined;
    }
    for (let i = 0; i < r.count; i++) {
      const { payload, sig, leaf } = batchItem(b, i);
      const want = leafAt(r.first_seq + i);
      if (Buffer.compare(leaf, want) !== 0 || Buffer.compare(leafHash(lineOf(payload, sig)), want) !== 0) return undefined;
      if (++this.checkedSinceYield >= CHECK_CHUNK) {
        this.checkedSinceYield = 0;
        await yieldLoop();
      }
    }
    return b;
  }

  /**
   * Reads rows of `db` from `first` on, `limit` at a time, passing each on; a read that fails
   * (a damaged page) skips ahead, twice as far each time, so a broken file costs a few reads.
   */
  async *rows(db: Database.Database, from: number, to: number): AsyncGenerator<BatchRow> {
    let at = from;
    let step = 1;
    // (the batch that covers `from` may start before it)
    try {
      const r = db.prepare<[number], BatchRow>('SELECT * FROM receipt_batches WHERE first_seq <= ? ORDER BY first_seq DESC LIMIT 1').get(from);
      if (r && r.first_seq < from && r.first_seq + r.count > from) {
        yield r;
        at = r.first_seq + Math.max(1, r.count);
      }
    } catch {
      this.readErrors++; // (unreadable: from `from` on)
    }
    while (at < to) {
      let page: BatchRow[];
      try {
        page = db.prepare<[number], BatchRow>('SELECT * FROM receipt_batches WHERE first_seq >= ? ORDER BY first_seq LIMIT 64').all(at);
        step = 1;
      } catch {
        this.readErrors++;
        at += step;
        step *= 2;
        continue;
      }
      if (page.length === 0) return;
      for (const r of page) {
        if (r.first_seq >= to) return;
        yield r;
        at = Math.max(at, r.first_seq + Math.max(1, r.count));
      }
      await yieldLoop();
    }
  }

  /** Keeps in `out` the rows of `db` it checks, over the gaps; `store` inserts one. */
  async fillFrom(db: Database.Database, store: (firstSeq: number, keys: Float64Array, b: SignedBatch) => void): Promise<void> {
    for (const [a, z] of gaps(this.covered, this.input.size)) {
      for await (const r of this.rows(db, a, z + 1)) {
        if (overlaps(this.covered, r.first_seq, r.count)) continue;
        const b = await this.verify(r);
        if (!b) continue;
        const keys = new Float64Array(r.count);
        for (let i = 0; i < r.count; i++) keys[i] = requestKey((JSON.parse(Buffer.from(batchItem(b, i).payload).toString('utf8')) as { request_id?: unknown }).request_id as string ?? '');
        store(r.first_seq, keys, b);
        this.covered.set(r.first_seq, r.count);
      }
    }
  }
}

/**
 * Builds `<name>.rescued-<ms>.db` beside the log from what the node still holds (see above). The
 * copy is a receipt log this key opens when it holds every receipt; otherwise it says which seqs
 * none of the sources held. A copy that could not be made is removed.
 */
export async function salvageReceipts(input: SalvageInput): Promise<SalvageResult> {
  const target = path.join(path.dirname(input.dbPath), `${path.basename(input.dbPath).replace(/\.db$/, '')}.rescued-${Date.now()}.db`);
  if (fs.existsSync(target)) return { ok: false, error: `${target} is there already` };
  let out: Database.Database | undefined;
  try {
    const s = new Salvage(input);
    // 1. The database file as it is, checked row by row.
    let cps: { size: number; root: Uint8Array }[] = [];
    if (input.dbFd >= 0) {
      await copyBytes(input.dbFd, target);
      try {
        out = new Database(target);
        out.pragma('journal_mode = DELETE'); // (one file, as it is handed over)
        out.pragma('synchronous = OFF'); // (synced once, whole, at the end)
        const bad: number[] = [];
        for await (const r of s.rows(out, 0, Number.MAX_SAFE_INTEGER)) {
          if (!overlaps(s.covered, r.first_seq, r.count) && (await s.verify(r))) s.covered.set(r.first_seq, r.count);
          else bad.push(r.first_seq);
        }
        cps = out.prepare<[], { size: number; root: Uint8Array }>('SELECT size, root FROM checkpoints').all();
        out.prepare("SELECT value FROM meta WHERE key = 'provider'").get();
        // (a damaged file is written no further: the copy is built anew from what it held)
        if (s.readErrors > 0) throw new Error('damaged');
        const del = out.prepare('DELETE FROM receipt_batches WHERE first_seq = ?');
        out.transaction(() => bad.forEach((f) => del.run(f)))();
      } catch {
        // The file holds no log it can be built on: its rows that check are read into a new one.
        try {
          out?.close();
        } catch {
          // (closing what failed)
        }
        out = undefined;
        cps = [];
        const source = `${target}.source`;
        fs.renameSync(target, source);
        for (const x of ['-wal', '-shm', '-journal']) fs.rmSync(`${target}${x}`, { force: true });
        try {
          out = newLog(target, input.providerId);
          s.covered.clear();
          let src: Database.Database | undefined;
          try {
            src = new Database(source, { fileMustExist: true });
          } catch {
            // (nothing readable in it)
          }
          if (src) {
            const ins = out.prepare(INSERT_BATCH);
            try {
              await s.fillFrom(src, (f, k, b) => insertBatchRow(ins, f, k, b));
            } finally {
              src.close();
            }
          }
        } finally {
          removeDb(source);
        }
      }
    }
    out ??= newLog(target, input.providerId);
    const ins = out.prepare(INSERT_BATCH);
    // 2. The batches the database file did not hold yet, from memory.
    for (const h of input.held) {
      const count = h.signed.offsets.length - 1;
      if (h.firstSeq + count > input.size || overlaps(s.covered, h.firstSeq, count)) continue;
      insertBatchRow(ins, h.firstSeq, h.requestKeys, h.signed);
      s.covered.set(h.firstSeq, count);
    }
    // 3. What the open connection still reads, where the copy has gaps.
    await s.fillFrom(input.db, (f, k, b) => insertBatchRow(ins, f, k, b));
    // Checkpoints: only those over the receipts' own tree (a stored one over another root, from the
    // file of another time, goes), and the ones signed lately (signing is deterministic: the same note).
    const delCp = out.prepare('DELETE FROM checkpoints WHERE size = ?');
    const putCp = out.prepare('INSERT OR IGNORE INTO checkpoints (size, root, note, created_at) VALUES (?, ?, ?, ?)');
    out.transaction(() => {
      for (const c of cps) if (c.size > input.size || c.size < 1 || Buffer.compare(c.root, input.checkpointAt(c.size).root) !== 0) delCp.run(c.size);
      for (const size of new Set([...input.checkpoints, input.size])) {
        if (size < 1 || size > input.size) continue;
        const { root, note } = input.checkpointAt(size);
        putCp.run(size, root, note, Date.now());
      }
      out!.prepare("INSERT OR REPLACE INTO meta (key, value) VALUES ('provider', ?)").run(input.providerId); // (an older copy of another log's file: its rows went, unchecked)
    })();
    const missing = gaps(s.covered, input.size);
    out.close();
    out = undefined;
    fs.chmodSync(target, 0o600);
    const fd = fs.openSync(target, 'r+');
    try {
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    const kept = input.size - missing.reduce((n, [a, z]) => n + z - a + 1, 0);
    return { ok: true, file: target, kept, missing };
  } catch (e) {
    try {
      out?.close();
    } catch {
      // (closing what failed)
    }
    removeDb(target);
    return { ok: false, error: (e as Error).message };
  }
}

/** A new, empty receipt log file of `providerId` (rollback journal: one file). */
function newLog(file: string, providerId: string): Database.Database {
  const db = new Database(file);
  try {
    fs.chmodSync(file, 0o600);
    db.pragma('page_size = 65536');
    db.pragma('journal_mode = DELETE');
    db.pragma('synchronous = OFF'); // (synced once, whole, at the end)
    db.exec(SCHEMA);
    db.prepare("INSERT OR IGNORE INTO meta (key, value) VALUES ('provider', ?)").run(providerId);
    return db;
  } catch (e) {
    db.close();
    throw e;
  }
}

/** Seq ranges as said to an operator: "4 to 9, 12". */
export function sayRanges(ranges: readonly [number, number][], most = 8): string {
  const said = ranges.slice(0, most).map(([a, z]) => (a === z ? `${a}` : `${a} to ${z}`));
  return ranges.length > most ? `${said.join(', ')} and ${ranges.length - most} more ranges` : said.join(', ');
}
