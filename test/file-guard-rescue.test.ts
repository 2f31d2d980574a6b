// rescueDatabase failing: the copy of what a deleted database still holds cannot be made (the whole
// data dir was deleted, a file stands where the copy would go). It must say so, why, and what to do
// instead (restore from a backup), never claim a copy that is not there; the receipt log and the
// node stop all the same, and say it where the operator looks (the log's error notice, the node's
// error line, /healthz and /readyz).
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, test, vi } from 'vitest';
import type { RunningNode } from '../src/node.ts';
import { createHost } from '../src/p2p/host.ts';
import { rescueDatabase } from '../src/store/file-guard.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';
import { startTinyNode } from './helpers/node-config.ts';
import { askNode, logLines } from './helpers/paid-ask.ts';
import { captureNodeWatches } from './helpers/node-watch.ts';
import { testKey } from './helpers/receipts.ts';
import { until } from './helpers/wait.ts';

const dirs: string[] = [];
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  vi.restoreAllMocks();
  for (const c of cleanups.splice(0).reverse()) await c();
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});
const tmp = () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'rescue-fail-'));
  dirs.push(d);
  return d;
};

/** A database with one row, open, in folder `dir`. */
function openWithRow(dir: string): { db: Database.Database; file: string } {
  const file = path.join(dir, 'state.db');
  const db = new Database(file);
  cleanups.push(() => db.close());
  db.pragma('journal_mode = WAL');
  db.exec("CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('kept')");
  return { db, file };
}

const ADVICE = 'restore it from a backup.';
const FAILED = /^Copying its records out failed \((.+)\)\. The node still holds them and tries again every few seconds while it runs: free space on the data dir's disk if it is full \(a deleted file frees none while the node holds it open\), and do not stop the node before it says the copy is made\. If it stops first: restore it from a backup\.$/;
const said = (r: { ok: boolean; message: string }): string => (r.ok ? `ok: ${r.message}` : r.message);

describe('rescueDatabase cannot make its copy', () => {
  test('the whole folder deleted: says the copy failed and why, then what the caller advises, and claims no copy', () => {
    const dir = tmp();
    const { db, file } = openWithRow(dir);
    fs.rmSync(dir, { recursive: true, force: true });
    const answer = said(rescueDatabase(db, file, 'its records', ADVICE));
    const m = FAILED.exec(answer);
    expect(m, answer).not.toBeNull();
    expect(m![1]).toMatch(/unable to open/i); // SQLite's own reason, kept
    expect(answer).not.toContain('were copied to');
    expect(fs.existsSync(dir)).toBe(false); // (nothing made in its place)
  });

  test('the folder replaced by a file: the same', () => {
    const dir = tmp();
    const { db, file } = openWithRow(dir);
    fs.rmSync(dir, { recursive: true, force: true });
    fs.writeFileSync(dir, 'not a folder');
    expect(said(rescueDatabase(db, file, 'its records', ADVICE))).toMatch(FAILED);
    expect(fs.readFileSync(dir, 'utf8')).toBe('not a folder');
  });

  test('something already at the copy\'s name (a file, or a folder): not overwritten, the copy is said to have failed', () => {
    const dir = tmp();
    const { db, file } = openWithRow(dir);
    const at = 1_700_000_000_123;
    vi.spyOn(Date, 'now').mockReturnValue(at);
    const target = path.join(dir, `state.rescued-${at}.db`);
    fs.writeFileSync(target, 'an earlier rescue the operator has not moved yet');
    expect(said(rescueDatabase(db, file, 'its records', ADVICE))).toMatch(FAILED);
    expect(fs.readFileSync(target, 'utf8')).toBe('an earlier rescue the operator has not moved yet');
    fs.rmSync(target);
    fs.mkdirSync(target);
    expect(said(rescueDatabase(db, file, 'its records', ADVICE))).toMatch(FAILED);
    expect(fs.statSync(target).isDirectory()).toBe(true);
    // Once the name is free the copy is taken, and it holds the row (the control: the same call succeeds).
    fs.rmSync(target, { recursive: true });
    expect(said(rescueDatabase(db, file, 'its records', ADVICE))).toBe(`ok: Its records were copied to ${target}: stop the node, move that file to ${file} (and remove ${file}-wal and -shm if they are there) and start again.`);
    const copy = new Database(target, { readonly: true });
    try {
      expect(copy.prepare('SELECT v FROM t').all()).toEqual([{ v: 'kept' }]);
    } finally {
      copy.close();
    }
  });
});

describe('the receipt log whose folder was deleted under it', () => {
  test.each([0, 1])('it stops (%i signer threads), says at error level that the copy failed and that only a backup holding every receipt may be put back, refuses appends, and closes', async (threads) => {
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: { m: string; level: string }[] = [];
    const log = ReceiptLog.open({ path: file, seed: new Uint8Array(crypto.randomBytes(32)), threads, checkpointIntervalMs: 0, fileCheckMs: 20, onNotice: (m, level) => void notices.push({ m, level }) });
    cleanups.push(() => log.close());
    for (let i = 0; i < 3; i++) await log.append(syntheticReceiptBody(i));
    fs.rmSync(dir, { recursive: true, force: true });
    const failure = await vi.waitFor(() => {
      if (!log.failure) throw new Error('the log has not stopped yet');
      return log.failure;
    }, { timeout: 5000, interval: 10 });
    expect(failure).toMatchObject({ code: 'log_failed' });
    expect(failure.message).toMatch(new RegExp(`^receipt log file ${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} was deleted or replaced while the node used it; the log takes no more receipts\\. Copying its 3 durable receipts out failed \\(.+\\)\\. The node still holds them and tries again every few seconds while it runs: .* If it stops first: put .*receipts\\.db back only from a copy that holds all 3 receipts \\(seq 0 to 2\\): buyers hold the ones acknowledged since any older backup, and serving on under this key from one would sign other receipts under the same seqs\\. Without such a copy, start over with a new key \\(seller-node init\\)\\.$`));
    expect(failure.message).not.toContain('were copied to');
    // (one error line, the stop's: what stopped it, and what to do)
    expect(notices.filter((n) => n.level === 'error').map((n) => n.m)).toEqual([`the receipt log has stopped, and paid work is refused until the node is restarted: ${failure.message}`]);
    await expect(log.append(syntheticReceiptBody(3))).rejects.toMatchObject({ code: 'log_failed', message: failure.message });
    expect(() => log.checkpoint()).toThrow(failure); // (no checkpoint is signed over a log that stopped)
    expect(log.size).toBe(3);
    cleanups.pop();
    await log.close(); // (a close after the failure resolves: nothing more is signed)
    expect(fs.existsSync(dir)).toBe(false);
  });
});

describe('a copy that failed is tried again while the node runs', () => {
  test('the receipt log copies its receipts out at a later check once it can (the disk freed, here: its name free again), says so once, and leaves nothing half-made', async () => {
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const notices: { m: string; level: string }[] = [];
    const at = 1_700_000_000_456;
    vi.spyOn(Date, 'now').mockReturnValue(at);
    const target = path.join(dir, `receipts.rescued-${at}.db`);
    const log = ReceiptLog.open({ path: file, seed: new Uint8Array(crypto.randomBytes(32)), threads: 0, checkpointIntervalMs: 0, fileCheckMs: 20, onNotice: (m, level) => void notices.push({ m, level }) });
    cleanups.push(() => log.close());
    for (let i = 0; i < 3; i++) await log.append(syntheticReceiptBody(i));
    fs.mkdirSync(target); // (in the copy's way, as a full disk would be)
    fs.rmSync(file);
    await vi.waitFor(() => expect(notices).toHaveLength(1), { timeout: 5000, interval: 10 });
    expect(notices[0]!.m).toMatch(/Copying its 3 durable receipts out failed .* tries again every few seconds/);
    await new Promise((r) => setTimeout(r, 100)); // (further checks: failed again, nothing more said)
    expect(notices).toHaveLength(1);
    fs.rmdirSync(target);
    await vi.waitFor(() => expect(notices).toHaveLength(2), { timeout: 5000, interval: 10 });
    expect(notices[1]).toEqual({ level: 'error', m: `receipt log: the copy failed before has now been made. Its 3 durable receipts were copied to ${target}: stop the node, move that file to ${file} (and remove ${file}-wal and -shm if they are there) and start again.` });
    expect(fs.statSync(target).mode & 0o777).toBe(0o600);
    const copy = new Database(target, { readonly: true });
    try {
      expect(copy.prepare('SELECT count(*) AS n FROM receipt_batches').get()).toMatchObject({ n: expect.any(Number) });
    } finally {
      copy.close();
    }
    await new Promise((r) => setTimeout(r, 100));
    expect(notices).toHaveLength(2); // (done: no more copies)
    expect(log.failure).toMatchObject({ code: 'log_failed' });
  });
});

describe('the node whose data dir was deleted while it serves', () => {
  test('the receipt log stops at its next checkpoint, the state store at its next file check: both copies fail, each is an error line naming the backup to restore, /healthz and /readyz say why, paid work is refused', async () => {
    // The node's own 5 s file watch is taken from setInterval and run when the test wants it (no 5 s wait).
    const watches = captureNodeWatches();
    const home = tmp();
    const logFile = path.join(home, 'node.log');
    const fd = fs.openSync(logFile, 'w');
    cleanups.push(() => fs.closeSync(fd));
    const market = testKey();
    const buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
    cleanups.push(() => buyer.stop());
    const node: RunningNode = await startTinyNode(home, { publicKey: market.id, receipts: '{ signer_threads: 1, checkpoint_every: 1, checkpoint_interval_ms: 0, min_free_mb: 0 }' }, { logDestination: fd });
    cleanups.push(() => node.stop(1000));
    expect(watches).toHaveLength(1);
    expect((await askNode(buyer, node, market)).head.status).toBe(200);
    const data = path.join(home, 'data');
    fs.rmSync(data, { recursive: true, force: true });

    // The next receipt is the log's next checkpoint: it finds its file gone and cannot copy it out.
    // (That request's own receipt, committed into the deleted file just before, is not asserted on here.)
    await askNode(buyer, node, market);
    const health = await fetch(`${node.opsUrl}/healthz`);
    expect(health.status).toBe(503);
    const reason = ((await health.json()) as { reason: string }).reason;
    // (the whole of the log's failure, its advice included, up to 2,000 characters)
    expect(reason).toMatch(/^the receipt log has stopped \(receipt log file .*receipts\.db was deleted or replaced while the node used it; the log takes no more receipts\. Copying its 2 durable receipts out failed \(.*start over with a new key \(seller-node init\)\.\): paid work is refused until the node is restarted$/);
    expect(reason).toMatch(/: paid work is refused until the node is restarted$/);
    expect(reason).not.toContain('were copied to');
    watches[0]!(); // the state store's file check
    const ready = await fetch(`${node.opsUrl}/readyz`);
    expect(ready.status).toBe(503);
    const reasons = ((await ready.json()) as { reasons: string[] }).reasons;
    expect(reasons).toContainEqual(expect.stringMatching(/^the receipt log has stopped \(.*Copying its 2 durable receipts out failed/));
    expect(reasons).toContainEqual(expect.stringMatching(/^state file .*state\.db was deleted or replaced while the node used it: paid requests are refused until a restart\. Copying its used tickets and Idempotency-Key records out failed \(.+\)\. The node still holds them and tries again every few seconds while it runs: .* If it stops first: restore .*state\.db from a backup, or start without one after a minute \(the tickets used since have expired by then\); the Idempotency-Key records written since are lost: a retry under one of those keys would be run, and billed, again\.$/));
    const refused = await askNode(buyer, node, market);
    expect([refused.head.status, (refused.trailer as { error?: { code?: string } }).error?.code]).toEqual([503, 'no_capacity']);
    // (the node's log is written asynchronously: its error lines are waited for)
    await until('the two error lines', () => logLines(logFile, 50).length >= 2);
    const errors = logLines(logFile, 50).map((l) => l.msg);
    expect(errors).toContainEqual(expect.stringMatching(/^the receipt log has stopped, and paid work is refused until the node is restarted: receipt log file .*receipts\.db was deleted or replaced while the node used it; the log takes no more receipts\. Copying its 2 durable receipts out failed .*start over with a new key \(seller-node init\)\.$/));
    expect(errors).toContainEqual(expect.stringMatching(/^state file .*state\.db was deleted or replaced while the node used it: .*Copying its used tickets and Idempotency-Key records out failed .*billed, again\.$/));
    expect(errors.join('\n')).not.toContain('were copied to');
    expect(fs.existsSync(data)).toBe(false); // no copy, nor a folder, made in its place
    cleanups.pop();
    await node.stop(1000); // (stops, though its files are gone)
  }, 30_000);
});
