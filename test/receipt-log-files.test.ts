// The receipt log's own files going missing under it: a log that lost receipts it signed a
// checkpoint over (its -wal file deleted or cut short, or the database replaced by an older copy)
// is refused at open, not continued into a fork; a database deleted while the log runs stops the
// log, and what the open connection still reads is copied out so nothing acknowledged is lost.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { verifyLog } from '../attestation/log-verify.ts';
import { headPath } from '../src/store/checkpoint-head.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';

const dirs: string[] = [];
const logs: ReceiptLog[] = [];
afterEach(async () => {
  for (const l of logs.splice(0)) await l.close().catch(() => undefined);
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});
const tmp = () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'log-files-'));
  dirs.push(d);
  return d;
};
const seed = () => new Uint8Array(crypto.randomBytes(32));
function open(file: string, s: Uint8Array, extra: Partial<Parameters<typeof ReceiptLog.open>[0]> = {}): ReceiptLog {
  const l = ReceiptLog.open({ path: file, seed: s, threads: 0, checkpointIntervalMs: 0, ...extra });
  logs.push(l);
  return l;
}
async function closeLog(l: ReceiptLog): Promise<void> {
  logs.splice(logs.indexOf(l), 1);
  await l.close();
}
async function fill(l: ReceiptLog, from: number, n: number): Promise<void> {
  for (let i = from; i < from + n; i++) await l.append(syntheticReceiptBody(i));
}
const removeDb = (file: string) => ['', '-wal', '-shm'].forEach((x) => fs.rmSync(file + x, { force: true }));
/** A new log in a new folder: its seed, folder, database path and the open log. */
function freshLog(extra: Partial<Parameters<typeof ReceiptLog.open>[0]> = {}): { s: Uint8Array; dir: string; file: string; log: ReceiptLog } {
  const s = seed();
  const dir = tmp();
  const file = path.join(dir, 'receipts.db');
  return { s, dir, file, log: open(file, s, extra) };
}

describe('the WAL stays small', () => {
  test.each([0, 1])('lone receipts (%i signer threads, each commit a whole 64 KiB page) are checkpointed every 128 pages: 300 of them leave a WAL of a few MiB, not 19', async (threads) => {
    const { file, log } = freshLog({ threads });
    await fill(log, 0, 300);
    const wal = fs.statSync(`${file}-wal`).size;
    expect(wal).toBeLessThan(12 * 1024 * 1024);
    expect(fs.statSync(file).size).toBeGreaterThan(64 * 1024); // (checkpointed into the database)
  });
});

describe('a log that lost receipts it signed a checkpoint over is refused at open', () => {
  test('the database replaced by an older copy (the newer receipts were in the lost -wal file): log_behind, naming both sizes and what to do', async () => {
    const { s, dir, file, log } = freshLog();
    await fill(log, 0, 5);
    await closeLog(log); // checkpoint 5
    fs.copyFileSync(file, path.join(dir, 'older.db'));
    const again = open(file, s);
    await fill(again, 5, 3);
    await closeLog(again); // checkpoint 8, kept in receipts.checkpoint
    expect(fs.readFileSync(headPath(file), 'utf8')).toContain('\n8\n');
    removeDb(file);
    fs.copyFileSync(path.join(dir, 'older.db'), file);
    expect(() => open(file, s)).toThrow(expect.objectContaining({ code: 'log_behind', message: expect.stringMatching(/has lost receipts: it holds 5 receipts, but this key signed a checkpoint over 8 .*start over with a new key/) }));
    // Put back, it opens and goes on.
    removeDb(file);
    fs.writeFileSync(file, ''); // (an empty database: the same refusal, with 0)
    expect(() => open(file, s)).toThrow(expect.objectContaining({ code: 'log_behind', message: expect.stringContaining('it holds 0 receipts') }));
  });

  test('another log under the same key, as long or longer: its first receipts are not the ones signed for', async () => {
    const s = seed();
    const a = path.join(tmp(), 'receipts.db');
    const first = open(a, s);
    await fill(first, 0, 3);
    await closeLog(first);
    const b = path.join(tmp(), 'receipts.db');
    const other = open(b, s);
    await fill(other, 100, 4);
    await closeLog(other);
    fs.copyFileSync(headPath(a), headPath(b));
    expect(() => open(b, s)).toThrow(expect.objectContaining({ code: 'log_behind', message: expect.stringContaining('its first 3 receipts are not the ones this key signed a checkpoint over') }));
  });

  test('a log whose -wal file is cut short after a crash is refused, and opens again once the file is back', async () => {
    const { s, dir, log } = freshLog();
    await fill(log, 0, 6);
    log.checkpoint(); // 6, kept beside the log; the receipts are still in the -wal file
    // The state a crash leaves (the connection never closed), copied aside.
    const crashed = path.join(dir, 'crashed');
    fs.mkdirSync(crashed);
    for (const f of ['receipts.db', 'receipts.db-wal', 'receipts.checkpoint']) fs.copyFileSync(path.join(dir, f), path.join(crashed, f));
    const wal = path.join(crashed, 'receipts.db-wal');
    const whole = fs.readFileSync(wal);
    fs.truncateSync(wal, Math.floor(whole.length / 2));
    expect(() => open(path.join(crashed, 'receipts.db'), s)).toThrow(expect.objectContaining({ code: 'log_behind' }));
    fs.writeFileSync(wal, whole);
    const back = open(path.join(crashed, 'receipts.db'), s);
    expect(back.size).toBe(6);
  });

  test('receipts acknowledged after the last checkpoint count too: a log that lost them (its -wal after a crash) is refused, though its checkpoint still holds', async () => {
    const { s, dir, file, log } = freshLog();
    await fill(log, 0, 6);
    log.checkpoint(); // 6
    // The files as they were then: what a -wal that lost its last frames leaves behind.
    const older = path.join(dir, 'older');
    fs.mkdirSync(older);
    for (const f of ['receipts.db', 'receipts.db-wal']) fs.copyFileSync(path.join(dir, f), path.join(older, f));
    await fill(log, 6, 2); // acknowledged to buyers, no checkpoint over them yet
    await new Promise((r) => setTimeout(r, 150)); // (the count is kept at most every 100 ms)
    expect(fs.readFileSync(path.join(dir, 'receipts.head'), 'utf8')).toMatch(/^8 [0-9a-f]{64}\n$/);
    for (const f of ['receipts.checkpoint', 'receipts.head']) fs.copyFileSync(path.join(dir, f), path.join(older, f));
    expect(() => open(path.join(older, 'receipts.db'), s)).toThrow(expect.objectContaining({ code: 'log_behind', message: expect.stringMatching(/has lost receipts: it holds 6 receipts, but had acknowledged 8 .*receipts\.head.*buyers may hold the receipts it lost/) }));
    // Another log of 8 under the same key (other receipts): its receipt 7 is not the one acknowledged.
    const other = path.join(tmp(), 'receipts.db');
    const o = open(other, s);
    await fill(o, 100, 8);
    await closeLog(o);
    fs.copyFileSync(path.join(dir, 'receipts.head'), path.join(path.dirname(other), 'receipts.head'));
    fs.rmSync(path.join(path.dirname(other), 'receipts.checkpoint'));
    expect(() => open(other, s)).toThrow(expect.objectContaining({ code: 'log_behind', message: expect.stringContaining('its receipt seq 7 is not the one it acknowledged') }));
    // The whole log opens, and a clean close leaves the count.
    await closeLog(log);
    expect(fs.readFileSync(path.join(dir, 'receipts.head'), 'utf8')).toMatch(/^8 /);
    expect(open(file, s).size).toBe(8);
  });

  test('no checkpoint file yet (a log from before it existed): written at open; an unreadable one is reported and written again', async () => {
    const { s, file, log } = freshLog();
    await fill(log, 0, 4);
    await closeLog(log);
    fs.rmSync(headPath(file));
    const notices: string[] = [];
    const upgraded = open(file, s, { onNotice: (m) => notices.push(m) });
    expect(fs.readFileSync(headPath(file), 'utf8')).toContain('\n4\n');
    expect(notices).toEqual([]);
    await closeLog(upgraded);
    fs.writeFileSync(headPath(file), 'not a signed note');
    const reopened = open(file, s, { onNotice: (m) => notices.push(m) });
    expect(notices).toEqual([expect.stringMatching(/receipts\.checkpoint \(the receipt log's latest checkpoint\) could not be read \(.+\); it is written again at the next checkpoint$/)]);
    await closeLog(reopened);
    // A notice that throws does not stop the log from opening.
    fs.writeFileSync(headPath(file), 'not a signed note');
    const again = open(file, s, { onNotice: () => {
      throw new Error('observer failed');
    } });
    await fill(again, 4, 1);
    again.checkpoint();
    expect(fs.readFileSync(headPath(file), 'utf8')).toContain('\n5\n');
  });
});

describe('the files beside the log only move forward, and are watched however the log is set up', () => {
  test('a reader beside the appending log (log export) never moves receipts.checkpoint or receipts.head back', async () => {
    const { s, file, log: node } = freshLog({ checkpointEvery: 1_000_000 });
    await fill(node, 0, 10);
    const reader = open(file, s); // its snapshot: 10 receipts
    await fill(node, 10, 5);
    node.checkpoint(); // 15, kept by the node
    await new Promise((r) => setTimeout(r, 150));
    reader.checkpoint(); // 10, from its older snapshot
    await closeLog(reader);
    expect(fs.readFileSync(headPath(file), 'utf8')).toContain('\n15\n');
    expect(fs.readFileSync(path.join(path.dirname(file), 'receipts.head'), 'utf8')).toMatch(/^15 /);
  });

  test('with checkpoints by count only (interval 0), a database deleted under the log is still noticed by its own timer', async () => {
    const { file, log } = freshLog({ checkpointIntervalMs: 0, fileCheckMs: 50 });
    await fill(log, 0, 2);
    removeDb(file);
    const failure = await new Promise<Error | undefined>((resolve) => {
      const t = setInterval(() => log.failure && (clearInterval(t), resolve(log.failure)), 20);
    });
    expect(failure?.message).toMatch(/receipt log file .*receipts\.db was deleted or replaced while the node used it/);
  });

  test('a -wal that appears after the guard was made (a database\'s first write) is watched from then on', async () => {
    const { FileGuard } = await import('../src/store/file-guard.ts');
    const dir = tmp();
    const db = path.join(dir, 'state.db');
    fs.writeFileSync(db, '');
    const guard = new FileGuard(db);
    expect(guard.changed()).toBeUndefined();
    fs.writeFileSync(`${db}-wal`, 'x');
    expect(guard.changed()).toBeUndefined(); // now seen
    fs.rmSync(`${db}-wal`);
    expect(guard.changed()).toBe(`${db}-wal`);
  });
});

describe.each([0, 2])('the database deleted while the log runs (%i signer threads)', (threads) => {
  test('receipts on their way when the log stops are refused, never acknowledged after the copy was taken, and none hangs', async () => {
    const { file, log } = freshLog({ threads });
    await fill(log, 0, 3);
    log.checkpoint();
    await fill(log, 3, 1);
    removeDb(file);
    const onTheirWay = [4, 5, 6].map((i) => log.append(syntheticReceiptBody(i)));
    expect(() => log.checkpoint()).toThrow(expect.objectContaining({ code: 'log_failed' })); // noticed now, before they were handed over
    const settled = await Promise.allSettled(onTheirWay);
    expect(settled.map((r) => r.status)).toEqual(['rejected', 'rejected', 'rejected']);
    expect(log.size).toBe(4);
  });


  test('the log stops at its next checkpoint; the receipts acknowledged meanwhile are copied out, and the copy opens as the whole log', async () => {
    const { s, dir, file, log } = freshLog({ threads });
    await fill(log, 0, 3);
    log.checkpoint();
    removeDb(file);
    await fill(log, 3, 2); // acknowledged, into the deleted file
    expect(() => log.checkpoint()).toThrow(expect.objectContaining({ code: 'log_failed', message: expect.stringMatching(/receipt log file .*receipts\.db was deleted or replaced while the node used it; the log takes no more receipts\. Its 5 durable receipts were copied to .*receipts\.rescued-\d+\.db: stop the node, move that file to /) }));
    await expect(log.append(syntheticReceiptBody(5))).rejects.toMatchObject({ code: 'log_failed' });
    expect(log.failure).toBeDefined();
    await closeLog(log);
    const rescued = fs.readdirSync(dir).filter((f) => /^receipts\.rescued-\d+\.db$/.test(f));
    expect(rescued).toHaveLength(1);
    fs.renameSync(path.join(dir, rescued[0]!), file);
    const back = open(file, s, { threads });
    expect(back.size).toBe(5);
    const lines = [...back.lines()];
    const v = verifyLog({ provider: back.providerId, receipts: lines, checkpoints: [back.checkpoint()!] });
    expect(v.ok).toBe(true);
  });
});
