// Closing the receipt log after it stopped because its files were changed in place
// (log_files_changed) must leave them as the stop found them. SQLite's last connection to a WAL
// database checkpoints the WAL into the database file as it closes and deletes the -wal: into an
// older copy written over the live file, that mixes the node's newer pages into the older copy and
// throws away the -wal, the one file that still held them beside the node's copy. A read-only
// connection held open beside the log's keeps SQLite's close from checkpointing (see
// ReceiptLog.closeConnections). A normal close still checkpoints: its files are left whole, the
// -wal copied in and gone.
//
// The changes are made by another process (cp, truncate), as an operator's would be: this process
// closing a descriptor of the database would drop SQLite's locks on it (POSIX).
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, test, vi } from 'vitest';
import { CloseGuard } from '../src/store/close-guard.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';
import { errorsOf, fill, logFixture, seed, untilSomeOnlyInWal, type Notice } from './helpers/log-fixture.ts';
import { until } from './helpers/wait.ts';
import { openFilesUnder } from './helpers/open-files.ts';

const fixture = logFixture('log-close-stop-');
const { tmp, open, closeLog } = fixture;
afterEach(async () => {
  vi.restoreAllMocks();
  await fixture.cleanup();
});
/** The file's SHA-256, or undefined when it is not there. */
const hashOf = (file: string): string | undefined => (fs.existsSync(file) ? crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex') : undefined);
const filesOf = (file: string) => ({ db: hashOf(file), wal: hashOf(`${file}-wal`), shm: hashOf(`${file}-shm`) });
/** Receipts the database file holds read alone (copied aside, without its -wal). */
function receiptsInFileAlone(file: string): number {
  const alone = path.join(tmp(), 'alone.db');
  fs.copyFileSync(file, alone);
  const db = new Database(alone, { readonly: true });
  try {
    const table = db.prepare("SELECT 1 FROM sqlite_master WHERE name = 'receipt_batches'").get();
    return table ? db.prepare<[], { n: number }>('SELECT COALESCE(SUM(count), 0) AS n FROM receipt_batches').get()!.n : 0;
  } finally {
    db.close();
  }
}

/** A log of 20 receipts closed, a backup of it, the log opened again with more receipts, the newest in its WAL alone. */
async function logWithBackup(threads: number): Promise<{ s: Uint8Array; dir: string; file: string; backup: string; notices: Notice[]; log: ReceiptLog; size: number }> {
  const s = seed();
  const dir = tmp();
  const file = path.join(dir, 'receipts.db');
  const backup = path.join(tmp(), 'receipts.db');
  const first = open(file, s, []);
  await fill(first, 0, 20);
  await closeLog(first);
  fs.copyFileSync(file, backup); // (a backup of the stopped node's log)
  const notices: Notice[] = [];
  const log = open(file, s, notices, { threads, checkpointEvery: 25 });
  await fill(log, 20, 200); // (WAL checkpoints on the way: pages of the database file the backup does not have)
  const size = await untilSomeOnlyInWal(log, file, 220);
  return { s, dir, file, backup, notices, log, size };
}

describe.each([0, 2])('closing after an older copy was written over the live database (%i signer threads)', (threads) => {
  test('stopped at the next append: the close checkpoints nothing into the older copy, and its -wal and -shm stay as they were', async () => {
    const { file, backup, notices, log, size } = await logWithBackup(threads);
    execFileSync('cp', [backup, file]);
    await expect(log.append(syntheticReceiptBody(size))).rejects.toMatchObject({ code: 'log_files_changed' });
    await until('the copy and its error line', () => errorsOf(notices).length > 0);
    const before = filesOf(file);
    expect(before.db).toBe(hashOf(backup));
    expect(before.wal).toBeDefined();
    expect(before.shm).toBeDefined();
    await closeLog(log);
    // Byte for byte what the stop found: the older copy, and the node's WAL beside it.
    expect(filesOf(file)).toEqual(before);
    expect(hashOf(file)).toBe(hashOf(backup));
    expect(receiptsInFileAlone(file)).toBe(20);
    expect(errorsOf(notices)).toHaveLength(1);
  });

  test('found by the close itself: the same', async () => {
    const { file, backup, notices, log } = await logWithBackup(threads);
    execFileSync('cp', [backup, file]);
    const before = filesOf(file);
    await closeLog(log);
    expect(log.failure).toMatchObject({ code: 'log_files_changed' });
    expect(errorsOf(notices)).toEqual([expect.stringMatching(/was written over in place .* were copied to /)]);
    // (the -shm, SQLite's index of the WAL, is written by the copy's reads through the connection
    // before it closes: read marks; it stays, and is rebuilt from the -wal by whoever opens it)
    const after = filesOf(file);
    expect({ db: after.db, wal: after.wal }).toEqual({ db: before.db, wal: before.wal });
    expect(after.shm).toBeDefined();
    expect(hashOf(file)).toBe(hashOf(backup));
    expect(receiptsInFileAlone(file)).toBe(20);
  });
});

test('closing after the database file was emptied in place: it stays empty, the -wal stays whole', async () => {
  const s = seed();
  const dir = tmp();
  const file = path.join(dir, 'receipts.db');
  const notices: Notice[] = [];
  const log = open(file, s, notices, { checkpointEvery: 25 });
  await fill(log, 0, 100);
  const size = await untilSomeOnlyInWal(log, file, 100);
  execFileSync('truncate', ['-s', '0', file]);
  await expect(log.append(syntheticReceiptBody(size))).rejects.toMatchObject({ code: 'log_files_changed' });
  await until('the copy and its error line', () => errorsOf(notices).length > 0);
  const before = filesOf(file);
  expect(fs.statSync(`${file}-wal`).size).toBeGreaterThan(0);
  await closeLog(log);
  expect(filesOf(file)).toEqual(before);
  expect(fs.statSync(file).size).toBe(0);
});

describe.each([0, 2])('a normal close still checkpoints (%i signer threads)', (threads) => {
  test('the -wal copied into the database file and gone, the file whole alone, and it opens again', async () => {
    const s = seed();
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: Notice[] = [];
    const log = open(file, s, notices, { threads, checkpointEvery: 25 });
    await fill(log, 0, 100);
    const size = await untilSomeOnlyInWal(log, file, 100);
    expect(receiptsInFileAlone(file)).toBeLessThan(size);
    await closeLog(log);
    expect(fs.existsSync(`${file}-wal`)).toBe(false);
    expect(fs.existsSync(`${file}-shm`)).toBe(false);
    expect(receiptsInFileAlone(file)).toBe(size);
    const back = open(file, s, notices);
    expect(back.size).toBe(size);
    await closeLog(back);
    expect(errorsOf(notices)).toEqual([]);
  });

  test('and so does the close of a log stopped for another reason (a commit that failed): its files are its own', async () => {
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: Notice[] = [];
    const log = open(file, seed(), notices, { threads });
    await fill(log, 0, 3);
    const other = new Database(file);
    other.pragma('busy_timeout = 5000');
    other.prepare('INSERT INTO receipt_batches (first_seq, count, payloads, offsets, sigs, leaves, request_keys) VALUES (3, 1, ?, ?, ?, ?, ?)').run(Buffer.from('{}'), Buffer.alloc(8), Buffer.alloc(64), Buffer.alloc(32), Buffer.alloc(8));
    other.close();
    await expect(log.append(syntheticReceiptBody(3))).rejects.toMatchObject({ code: 'log_failed' });
    await closeLog(log);
    expect(fs.existsSync(`${file}-wal`)).toBe(false);
    expect(receiptsInFileAlone(file)).toBe(4); // (its 3 and the other writer's)
  });
});

describe('what the log holds open is released on every path (s27 review)', () => {
  /** This process's descriptors open on `file` or beside it (-wal, -shm). */
  const openOn = (file: string) => openFilesUnder(file);

  test('a guard that cannot be opened: the open fails and leaves no descriptor, and the next open and close leave none', async () => {
    const file = path.join(tmp(), 'receipts.db');
    const s = seed();
    const first = open(file, s, []);
    await first.append(syntheticReceiptBody(0));
    await first.close();
    expect(openOn(file)).toEqual([]);
    const spy = vi.spyOn(CloseGuard, 'open').mockImplementation(() => {
      throw new Error('EMFILE: too many open files');
    });
    expect(() => ReceiptLog.open({ path: file, seed: s, threads: 0, checkpointIntervalMs: 0 })).toThrow(/EMFILE/);
    expect(openOn(file)).toEqual([]);
    spy.mockRestore();
    const again = open(file, s, []);
    expect(again.size).toBe(1);
    await again.append(syntheticReceiptBody(1));
    await again.close();
    expect(openOn(file)).toEqual([]);
  });

  test('a close whose flush fails still ends the signer threads and releases the connections and the seal', async () => {
    const file = path.join(tmp(), 'receipts.db');
    const log = open(file, seed(), [], { threads: 1 });
    await log.append(syntheticReceiptBody(0));
    vi.spyOn(log, 'flush').mockRejectedValue(new Error('flush failed'));
    await expect(log.close()).rejects.toThrow('flush failed');
    expect(openOn(file)).toEqual([]);
  });
});
