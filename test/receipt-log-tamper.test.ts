// The receipt log's files changed in place by another program while the log runs, keeping their
// inode (so the device:inode check of file-guard.ts sees nothing): its -wal cut short
// (`truncate -s 0 receipts.db-wal`), an older copy of receipts.db copied over the live one (`cp`
// writes into the same inode). SQLite would carry on, and its next checkpoint would mix what is
// left into the log. The log must stop before it commits or checkpoints again (log_files_changed),
// refuse appends saying why, say so in one error line, and copy out every durable receipt it still
// holds: the database file, the batches it committed that the file did not hold yet (in memory),
// and what its connection still reads, each receipt checked against its Merkle tree. And normal
// heavy use, checkpoints, a reader beside it, restarts and close must never look like a change.
//
// The changes are made by another process (cp, truncate), as an operator's would be: this process
// closing a descriptor of the database would drop SQLite's locks on it (POSIX).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, test, vi } from 'vitest';
import { verifyLog } from '../attestation/log-verify.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';
import { errorsOf, fill, logFixture, seed, untilSomeOnlyInWal, type Notice } from './helpers/log-fixture.ts';
import { until } from './helpers/wait.ts';

const fixture = logFixture('log-tamper-');
const { tmp, open, closeLog } = fixture;
afterEach(async () => {
  vi.restoreAllMocks();
  await fixture.cleanup();
});
const STOPPED = 'the receipt log has stopped, and paid work is refused until the node is restarted: ';
const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The rescued copy beside the log: the one file, its name. */
function rescued(dir: string): string {
  const found = fs.readdirSync(dir).filter((f) => /^receipts\.rescued-\d+\.db$/.test(f));
  expect(found).toHaveLength(1);
  return path.join(dir, found[0]!);
}

/** Moves the rescued copy into place as the operator is told to, opens it, and checks it is the whole log. */
async function reopenRescued(dir: string, file: string, s: Uint8Array, size: number, lines: string[]): Promise<void> {
  const copy = rescued(dir);
  expect(fs.statSync(copy).mode & 0o777).toBe(0o600);
  for (const x of ['', '-wal', '-shm']) fs.rmSync(file + x, { force: true });
  fs.renameSync(copy, file);
  const notices: Notice[] = [];
  const back = open(file, s, notices); // (refused, log_behind, if it lacked a receipt receipts.head or receipts.checkpoint vouch for)
  expect(back.size).toBe(size);
  expect([...back.lines()]).toEqual(lines);
  expect(verifyLog({ provider: back.providerId, receipts: [...back.lines()], checkpoints: back.checkpoints().map((c) => c.note) }).ok).toBe(true);
  await fill(back, size, 2); // (and it goes on)
  await closeLog(back);
  expect(errorsOf(notices)).toEqual([]);
}

describe.each([0, 2])('the -wal cut short in place while the log runs (%i signer threads)', (threads) => {
  test('the next commit is refused (log_files_changed), appends say why, one error line names the copy, and the copy holds every durable receipt, those the cut WAL alone held too', async () => {
    const s = seed();
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: Notice[] = [];
    const log = open(file, s, notices, { threads, checkpointEvery: 25 });
    await fill(log, 0, 200); // (WAL checkpoints on the way: most receipts are in the database file)
    const size = await untilSomeOnlyInWal(log, file, 200);
    const lines = [...log.lines()];
    const ino = fs.statSync(`${file}-wal`).ino;

    execFileSync('truncate', ['-s', '0', `${file}-wal`]);
    expect(fs.statSync(`${file}-wal`).ino).toBe(ino); // (the same file: no device:inode change to see)
    // The database file alone, as SQLite would have it now, lacks the receipts the WAL held.
    const alone = path.join(tmp(), 'alone.db');
    execFileSync('cp', [file, alone]);
    const db = new Database(alone);
    expect(db.prepare<[], { n: number }>('SELECT COALESCE(SUM(count), 0) AS n FROM receipt_batches').get()!.n).toBeLessThan(size);
    db.close();

    const refused = log.append(syntheticReceiptBody(size));
    await expect(refused).rejects.toMatchObject({ code: 'log_files_changed', message: expect.stringContaining(`receipt log file ${file}-wal was cut short in place (it is 0 bytes;`) });
    expect(log.failure).toMatchObject({ code: 'log_files_changed' });
    expect(log.size).toBe(size);
    await until('the copy and its error line', () => errorsOf(notices).length > 0);
    const [line, ...more] = errorsOf(notices);
    expect(more).toEqual([]);
    expect(line).toMatch(new RegExp(`^${esc(STOPPED)}receipt log file ${esc(file)}-wal was cut short in place \\(it is 0 bytes; SQLite's index of it names \\d+ frames, \\d+ bytes, not yet all copied into the database\\) while the node used it: something other than the node changed it .* the log takes no more receipts\\. Its ${size} durable receipts \\(each checked against the log's Merkle tree\\) were copied to ${esc(dir)}/receipts\\.rescued-\\d+\\.db: stop the node, move that file to ${esc(file)}, remove ${esc(file)}-wal and ${esc(file)}-shm, and start again\\.$`));
    expect(log.failure!.message).toBe(line!.slice(STOPPED.length)); // (appends from now on are refused with the whole of it)
    await expect(log.append(syntheticReceiptBody(size + 1))).rejects.toMatchObject({ code: 'log_files_changed', message: log.failure!.message });
    await closeLog(log);
    expect(errorsOf(notices)).toHaveLength(1); // (close says nothing more)
    await reopenRescued(dir, file, s, size, lines);
  });

  test('noticed by the log\'s own file check while no receipt comes', async () => {
    const s = seed();
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: Notice[] = [];
    const log = open(file, s, notices, { threads, fileCheckMs: 20 });
    await fill(log, 0, 5);
    const lines = [...log.lines()];
    execFileSync('truncate', ['-s', '100', `${file}-wal`]); // (cut, not emptied)
    await until('the log to stop', () => log.failure !== undefined);
    expect(log.failure).toMatchObject({ code: 'log_files_changed' });
    await until('its error line', () => errorsOf(notices).length > 0);
    expect(errorsOf(notices)).toEqual([expect.stringMatching(/was cut short in place \(it is 100 bytes; .* Its 5 durable receipts \(each checked against the log's Merkle tree\) were copied to /)]);
    await closeLog(log);
    await reopenRescued(dir, file, s, 5, lines);
  });

  test('noticed as the log closes: no final checkpoint is signed into the cut files, the copy is made before the connection closes', async () => {
    const s = seed();
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: Notice[] = [];
    const log = open(file, s, notices, { threads });
    await fill(log, 0, 4);
    const lines = [...log.lines()];
    execFileSync('truncate', ['-s', '0', `${file}-wal`]);
    await closeLog(log);
    expect(log.failure).toMatchObject({ code: 'log_files_changed' });
    expect(errorsOf(notices)).toEqual([expect.stringMatching(/was cut short in place .* Its 4 durable receipts \(each checked against the log's Merkle tree\) were copied to /)]);
    await reopenRescued(dir, file, s, 4, lines);
  });
});

describe.each([0, 2])('an older copy of receipts.db copied over the live one in place (%i signer threads)', (threads) => {
  test('the next commit is refused (log_files_changed), one error line, and the copy holds every durable receipt: the older copy\'s and the newer ones the node held', async () => {
    const s = seed();
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const backup = path.join(tmp(), 'receipts.db');
    let notices: Notice[] = [];
    const first = open(file, s, notices, { threads });
    await fill(first, 0, 20);
    await closeLog(first);
    fs.copyFileSync(file, backup); // (a backup of the stopped node's log)
    notices = [];
    const log = open(file, s, notices, { threads });
    await fill(log, 20, 10);
    const lines = [...log.lines()];
    const ino = fs.statSync(file).ino;

    execFileSync('cp', [backup, file]);
    expect(fs.statSync(file).ino).toBe(ino);
    await expect(log.append(syntheticReceiptBody(30))).rejects.toMatchObject({ code: 'log_files_changed', message: expect.stringContaining(`receipt log file ${file} was written over in place (`) });
    await until('the copy and its error line', () => errorsOf(notices).length > 0);
    expect(errorsOf(notices)).toEqual([expect.stringMatching(new RegExp(`^${esc(STOPPED)}receipt log file ${esc(file)} was written over in place \\(.*, by no checkpoint of the node's\\) while the node used it: .* Its 30 durable receipts \\(each checked against the log's Merkle tree\\) were copied to `))]);
    await closeLog(log);
    expect(errorsOf(notices)).toHaveLength(1);
    await reopenRescued(dir, file, s, 30, lines);
  });
});

describe('an older copy copied over a log that has checkpointed since', () => {
  test('what no file or memory of the node holds any more is named by seq, the copy holds the rest, each receipt as signed', async () => {
    const s = seed();
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const backup = path.join(tmp(), 'receipts.db');
    let notices: Notice[] = [];
    const first = open(file, s, notices, { threads: 2 });
    await fill(first, 0, 10);
    await closeLog(first);
    fs.copyFileSync(file, backup);
    notices = [];
    const log = open(file, s, notices, { threads: 2, checkpointEvery: 500 });
    // Thousands: the older receipts' pages are copied into the database file and the WAL started
    // over many times since (the WAL holds the latest pages alone).
    await fill(log, 10, 3000);
    const size = log.size;
    execFileSync('cp', [backup, file]);
    await expect(log.append(syntheticReceiptBody(size))).rejects.toMatchObject({ code: 'log_files_changed' });
    await until('the copy and its error line', () => errorsOf(notices).length > 0);
    const [line] = errorsOf(notices);
    const m = /Of its (\d+) durable receipts, (\d+) \(each checked against the log's Merkle tree\) were copied to (\S+); seq (.+) are in no file or memory the node still holds, and buyers hold them signed\. Stop the node\. If a copy of .* holding all \d+ receipts exists, put it back, .* and start again; if not, keep \S+ for the audit and start over with a new key \(seller-node init\)/.exec(line!);
    expect(m, line).not.toBeNull();
    expect(Number(m![1])).toBe(size);
    await closeLog(log);
    // Every receipt in the copy is the one signed at its seq; the ones it lacks are those named.
    const copy = new Database(m![3]!, { readonly: true });
    const rows = copy.prepare<[], { first_seq: number; count: number }>('SELECT first_seq, count FROM receipt_batches ORDER BY first_seq').all();
    copy.close();
    const held = new Set(rows.flatMap((r) => Array.from({ length: r.count }, (_, i) => r.first_seq + i)));
    expect(held.size).toBe(Number(m![2]));
    const named = m![4]!.split(', ').flatMap((r) => {
      const [a, z] = r.split(' to ').map(Number);
      return Array.from({ length: (z ?? a!) - a! + 1 }, (_, i) => a! + i);
    });
    expect(named.length).toBeGreaterThan(0);
    expect(named.length + held.size).toBe(size);
    for (const seq of named) expect(held.has(seq)).toBe(false);
    for (let seq = 0; seq < 10; seq++) expect(held.has(seq)).toBe(true); // (the older copy's)
    expect(held.has(size - 1)).toBe(true); // (the newest, from memory)
    // Opened as a log, the copy says what it lacks (its receipts are checked on the way).
    const at = path.join(tmp(), 'receipts.db');
    fs.copyFileSync(m![3]!, at);
    expect(() => ReceiptLog.open({ path: at, seed: s, threads: 0 })).toThrow(expect.objectContaining({ code: 'log_corrupt', message: expect.stringContaining(`is missing seq ${named[0]}`) }));
  });
});

describe('a copy that fails is tried again while the node runs', () => {
  test('the line says it failed and what to do; a later check makes it, says so once, and the log\'s failure says where it is', async () => {
    const s = seed();
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: Notice[] = [];
    const at = 1_700_000_000_789;
    vi.spyOn(Date, 'now').mockReturnValue(at);
    const target = path.join(dir, `receipts.rescued-${at}.db`);
    const log = open(file, s, notices, { threads: 0, fileCheckMs: 20 });
    await fill(log, 0, 3);
    const lines = [...log.lines()];
    fs.mkdirSync(target); // (in the copy's way, as a full disk would be)
    execFileSync('truncate', ['-s', '0', `${file}-wal`]);
    await until('the first line', () => errorsOf(notices).length === 1);
    expect(errorsOf(notices)[0]).toMatch(new RegExp(`^${esc(STOPPED)}receipt log file .*-wal was cut short in place .* Copying its 3 durable receipts out failed \\(.+\\)\\. The node still holds them and tries again every few seconds while it runs: .* do not stop the node before it says the copy is made\\. If it stops first: put .* back only from a copy that holds all 3 receipts`));
    expect(log.failure).toMatchObject({ code: 'log_files_changed', message: expect.stringContaining('Copying its 3 durable receipts out failed') });
    fs.rmdirSync(target);
    await until('the copy', () => errorsOf(notices).length === 2);
    expect(errorsOf(notices)[1]).toBe(`receipt log: the copy failed before has now been made. Its 3 durable receipts (each checked against the log's Merkle tree) were copied to ${target}: stop the node, move that file to ${file}, remove ${file}-wal and ${file}-shm, and start again.`);
    expect(log.failure!.message).toContain(`were copied to ${target}`);
    await closeLog(log);
    expect(errorsOf(notices)).toHaveLength(2);
    vi.restoreAllMocks();
    await reopenRescued(dir, file, s, 3, lines);
  });
});

describe('normal use never looks like a change', () => {
  test.each([0, 2])('heavy appends (%i signer threads) with WAL checkpoints, a file check every few ms, a reader beside it signing checkpoints, a restart and close: no error, nothing rescued', async (threads) => {
    const s = seed();
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: Notice[] = [];
    for (let run = 0; run < 2; run++) {
      const log = open(file, s, notices, { threads, checkpointEvery: 20, checkpointIntervalMs: 5, fileCheckMs: 2, maxBatch: 16 });
      const reader = open(file, s, notices, { threads: 0, fileCheckMs: 3 }); // (log export beside a running node)
      const base = log.size;
      for (let round = 0; round < 20; round++) {
        await Promise.all(Array.from({ length: 200 }, (_, i) => log.append(syntheticReceiptBody(base + round * 200 + i))));
        if (round % 5 === 0) {
          // (another reader opened and closed meanwhile, as `log export` runs and ends)
          const again = open(file, s, notices, { threads: 0, fileCheckMs: 3 });
          again.checkpoint();
          await closeLog(again);
        }
      }
      expect([log.failure, reader.failure]).toEqual([undefined, undefined]);
      await closeLog(reader);
      await closeLog(log);
    }
    expect(notices.filter((n) => n.level === 'error')).toEqual([]);
    expect(fs.readdirSync(dir).filter((f) => f.includes('rescued'))).toEqual([]);
    expect(fs.statSync(file).size).toBeGreaterThan(4 * 1024 * 1024); // (the WAL was copied into the database on the way, many times)
    const back = open(file, s, notices);
    expect(back.size).toBe(8000);
  }, 120_000);
});

describe('every stop of the log is one error line', () => {
  test.each([0, 2])('a commit that fails (another writer took its seq; %i signer threads), with many receipts on their way: every one refused, one line', async (threads) => {
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: Notice[] = [];
    const log = open(file, seed(), notices, { threads, maxBatch: 4 });
    await fill(log, 0, 3);
    const other = new Database(file);
    other.pragma('busy_timeout = 5000');
    other.prepare('INSERT INTO receipt_batches (first_seq, count, payloads, offsets, sigs, leaves, request_keys) VALUES (3, 1, ?, ?, ?, ?, ?)').run(Buffer.from('{}'), Buffer.alloc(8), Buffer.alloc(64), Buffer.alloc(32), Buffer.alloc(8));
    other.close();
    const settled = await Promise.allSettled(Array.from({ length: 40 }, (_, i) => log.append(syntheticReceiptBody(3 + i))));
    expect(settled.every((r) => r.status === 'rejected')).toBe(true);
    expect(log.failure).toMatchObject({ code: 'log_failed', message: expect.stringMatching(/^receipt log write failed: UNIQUE constraint failed/) });
    await expect(log.append(syntheticReceiptBody(99))).rejects.toBe(log.failure);
    await closeLog(log);
    expect(errorsOf(notices)).toEqual([`${STOPPED}${log.failure!.message}`]);
  });

  test('a stored checkpoint over another root (log_corrupt), found by the checkpoint timer and asked for again: one line', async () => {
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: Notice[] = [];
    const log = open(file, seed(), notices, { threads: 0, checkpointIntervalMs: 10 });
    await fill(log, 0, 2);
    const other = new Database(file);
    other.prepare('INSERT INTO checkpoints (size, root, note, created_at) VALUES (3, ?, ?, 0)').run(Buffer.alloc(32), 'not this log\n');
    other.close();
    await fill(log, 2, 1); // (size 3 falls due: the timer finds the stored one)
    await until('the log to stop', () => log.failure !== undefined);
    expect(log.failure).toMatchObject({ code: 'log_corrupt' });
    expect(() => log.checkpoint(3)).toThrow(log.failure!);
    await closeLog(log);
    expect(errorsOf(notices)).toEqual([`${STOPPED}${log.failure!.message}`]);
  });
});
