// The files the receipt log keeps beside its database, receipts.checkpoint (the latest signed
// checkpoint) and receipts.head (how many receipts were acknowledged), failing to be written: a
// folder standing at their name, or the disk refusing the write (ENOSPC). What the code does: the
// log goes on acknowledging receipts (they are durable in the database; these files only guard
// against the database losing them later) and says each failure as a warning naming the file and
// the reason and what is unprotected meanwhile (told at once, then at most every 10 s: a write is
// tried with every batch); nothing half-written is left beside the log; once the obstacle is gone
// the next checkpoint (or the next receipts) writes the file again, said once, and a restart is
// then protected.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test, vi } from 'vitest';
import { chainHeadPath, headPath } from '../src/store/checkpoint-head.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';

const dirs: string[] = [];
const logs: ReceiptLog[] = [];
afterEach(async () => {
  vi.restoreAllMocks();
  for (const l of logs.splice(0)) await l.close().catch(() => undefined);
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

interface Notice {
  m: string;
  level: 'warn' | 'error';
}
function setup(): { s: Uint8Array; dir: string; file: string; notices: Notice[]; open: () => ReceiptLog } {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'side-files-'));
  dirs.push(dir);
  const s = new Uint8Array(crypto.randomBytes(32));
  const file = path.join(dir, 'receipts.db');
  const notices: Notice[] = [];
  const open = () => {
    const l = ReceiptLog.open({ path: file, seed: s, threads: 0, checkpointIntervalMs: 0, checkpointEvery: 1_000_000, onNotice: (m, level) => void notices.push({ m, level }) });
    logs.push(l);
    return l;
  };
  return { s, dir, file, notices, open };
}
async function closeLog(l: ReceiptLog): Promise<void> {
  logs.splice(logs.indexOf(l), 1);
  await l.close();
}
async function fill(l: ReceiptLog, from: number, n: number): Promise<void> {
  for (let i = from; i < from + n; i++) await l.append(syntheticReceiptBody(i));
}
/** What is in the folder besides the database files: no temporary file is left by a failed write. */
const leftovers = (dir: string) => fs.readdirSync(dir).filter((f) => f.endsWith('.tmp'));
const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

describe('receipts.checkpoint cannot be written', () => {
  test('a folder at its name when the log opens: said at open and at each checkpoint; receipts are still acknowledged and the checkpoint signed and stored; written once the folder is gone', async () => {
    const { dir, file, notices, open } = setup();
    const head = headPath(file);
    fs.mkdirSync(head);
    const log = open();
    expect(notices).toEqual([{ level: 'warn', m: expect.stringMatching(new RegExp(`^${esc(head)} \\(the receipt log's latest checkpoint\\) could not be read \\(it is a folder\\); it is written again at the next checkpoint$`)) }]);
    await fill(log, 0, 3); // acknowledged: durable in the database
    expect(log.size).toBe(3);
    const note = log.checkpoint();
    expect(note).toContain('\n3\n');
    expect(log.latestCheckpoint()).toMatchObject({ size: 3, note }); // stored in the database all the same
    expect(notices.slice(1)).toEqual([{ level: 'warn', m: expect.stringMatching(new RegExp(`^${esc(head)} \\(the receipt log's latest checkpoint\\) could not be written: EISDIR: .+; tried again at the next checkpoint\\. Until it is written, a log that loses files would not be refused at the next start$`)) }]);
    expect(log.failure).toBeUndefined(); // the log goes on
    expect(fs.statSync(head).isDirectory()).toBe(true);
    expect(leftovers(dir)).toEqual([]);
    // The folder removed: the next checkpoint writes the file, and says so once.
    fs.rmdirSync(head);
    await fill(log, 3, 1);
    log.checkpoint();
    expect(fs.readFileSync(head, 'utf8')).toContain('\n4\n');
    expect(notices.slice(2)).toEqual([{ level: 'warn', m: `${head} is written again` }]);
    await fill(log, 4, 1);
    log.checkpoint();
    expect(notices).toHaveLength(3);
    await closeLog(log);
  });

  test('the disk refusing the write (ENOSPC) while the log runs: said, the older file kept as it was, nothing half-written left; the next checkpoint writes it', async () => {
    const { dir, file, notices, open } = setup();
    const head = headPath(file);
    const log = open();
    await fill(log, 0, 2);
    log.checkpoint();
    const kept = fs.readFileSync(head, 'utf8');
    expect(kept).toContain('\n2\n');
    // The side files are written with fs.writeSync (the database by SQLite itself): a full disk refuses them.
    const realWrite = fs.writeSync;
    let full = true;
    vi.spyOn(fs, 'writeSync').mockImplementation(((...args: Parameters<typeof fs.writeSync>) => {
      if (full) throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', errno: -28, syscall: 'write' });
      return (realWrite as (...a: unknown[]) => number)(...args);
    }) as typeof fs.writeSync);
    await fill(log, 2, 2);
    expect(log.checkpoint()).toContain('\n4\n');
    expect(notices.map((n) => n.level)).not.toContain('error');
    expect(notices.map((n) => n.m)).toContainEqual(expect.stringMatching(new RegExp(`^${esc(head)} \\(the receipt log's latest checkpoint\\) could not be written: ENOSPC: no space left on device, write; tried again at the next checkpoint\\. Until it is written, a log that loses files would not be refused at the next start$`)));
    expect(fs.readFileSync(head, 'utf8')).toBe(kept); // the old checkpoint, whole
    expect(leftovers(dir)).toEqual([]);
    expect(log.failure).toBeUndefined();
    full = false;
    await fill(log, 4, 1);
    log.checkpoint();
    expect(fs.readFileSync(head, 'utf8')).toContain('\n5\n');
    await closeLog(log);
  });
});

describe('receipts.head cannot be written', () => {
  test('a folder at its name: each receipt is still acknowledged, the failure said (warn) naming the file, at once and then at most every 10 s with the count untold; written again once the folder is gone, said once', async () => {
    const { dir, file, notices, open } = setup();
    const chain = chainHeadPath(file);
    fs.mkdirSync(chain);
    const log = open();
    expect(notices).toEqual([]); // (not read as anything at open: it only ever protects)
    await fill(log, 0, 1);
    expect(log.size).toBe(1);
    const said = new RegExp(`^${esc(chain)} \\(how many receipts the log acknowledged\\) could not be written: EISDIR: .+; tried again with the next receipts\\. Until it is written, receipts lost from the log's files since its last checkpoint would go unnoticed at the next start$`);
    expect(notices).toEqual([{ level: 'warn', m: expect.stringMatching(said) }]);
    expect(log.failure).toBeUndefined();
    // The writes after it (at most every 100 ms) fail too, and are counted, not said, for 10 s.
    let clock = performance.now();
    vi.spyOn(performance, 'now').mockImplementation(() => clock);
    for (let i = 1; i <= 3; i++) {
      clock += 150;
      await fill(log, i, 1);
    }
    expect(notices).toHaveLength(1);
    clock += 10_000;
    await fill(log, 4, 1);
    expect(notices).toHaveLength(2);
    expect(notices[1]).toEqual({ level: 'warn', m: expect.stringMatching(/tried again with the next receipts\. .* \(3 more failures of it since the last time this was said\)$/) });
    expect(leftovers(dir)).toEqual([]);
    // The folder gone: the next receipts write it, and that is said once.
    fs.rmdirSync(chain);
    clock += 150;
    await fill(log, 5, 1);
    expect(fs.readFileSync(chain, 'utf8')).toMatch(/^6 [0-9a-f]{64}\n$/);
    expect(notices.slice(2)).toEqual([{ level: 'warn', m: `${chain} is written again` }]);
    clock += 150;
    await fill(log, 6, 1);
    expect(notices).toHaveLength(3);
    await closeLog(log);
  });

  test('while it cannot be written, losing the -wal after a crash is not caught by it; once it is written again, it is', async () => {
    // What the warning means for the operator: receipts acknowledged past the last checkpoint are not protected meanwhile.
    const { dir, file, s, open } = setup();
    const chain = chainHeadPath(file);
    const log = open();
    await fill(log, 0, 4);
    log.checkpoint(); // 4, kept in receipts.checkpoint
    const snapshot = (to: string) => {
      fs.mkdirSync(to);
      for (const f of fs.readdirSync(dir)) if (/^receipts\.(db|db-wal|checkpoint|head)$/.test(f) && fs.statSync(path.join(dir, f)).isFile()) fs.copyFileSync(path.join(dir, f), path.join(to, f));
    };
    const older = path.join(dir, 'older');
    snapshot(older); // the -wal as it was at 4 receipts
    fs.rmSync(chain);
    fs.mkdirSync(chain); // receipts.head cannot be written from now on
    await fill(log, 4, 2); // acknowledged to buyers, no checkpoint over them
    await new Promise((r) => setTimeout(r, 110)); // (its deferred write, at most 100 ms later, has failed too)
    const lost = path.join(dir, 'lost');
    snapshot(lost);
    for (const f of ['receipts.db', 'receipts.db-wal']) fs.copyFileSync(path.join(older, f), path.join(lost, f)); // the crash lost the last -wal frames
    const reopen = (at: string) => ReceiptLog.open({ path: path.join(at, 'receipts.db'), seed: s, threads: 0, checkpointIntervalMs: 0 });
    const unguarded = reopen(lost);
    expect(unguarded.size).toBe(4); // opens, 2 acknowledged receipts short: nothing beside it said how many there were
    await unguarded.close();
    // receipts.head written again (the folder gone, the next receipts): the same loss is refused.
    fs.rmdirSync(chain);
    await fill(log, 6, 1);
    await vi.waitFor(() => expect(fs.readFileSync(chain, 'utf8')).toMatch(/^7 /), { timeout: 2000, interval: 20 });
    const lost2 = path.join(dir, 'lost2');
    snapshot(lost2);
    for (const f of ['receipts.db', 'receipts.db-wal']) fs.copyFileSync(path.join(older, f), path.join(lost2, f));
    expect(() => reopen(lost2)).toThrow(expect.objectContaining({ code: 'log_behind', message: expect.stringContaining('it holds 4 receipts, but had acknowledged 7') }));
    await closeLog(log);
  });
});

describe('a checkpoint that cannot be stored (a full disk)', () => {
  test('is warned about and stored when the next falls due; the log goes on acknowledging receipts (s25 hS)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'side-files-'));
    dirs.push(dir);
    const notices: Notice[] = [];
    const log = ReceiptLog.open({ path: path.join(dir, 'receipts.db'), seed: new Uint8Array(crypto.randomBytes(32)), threads: 0, checkpointIntervalMs: 0, checkpointEvery: 5, onNotice: (m, level) => void notices.push({ m, level }) });
    logs.push(log);
    const stmt = (log as unknown as { stmt: { insertCheckpoint: { run: (...a: unknown[]) => unknown } } }).stmt.insertCheckpoint;
    const run = stmt.run.bind(stmt);
    let full = true;
    stmt.run = (...a: unknown[]) => {
      if (full) throw Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' });
      return run(...a);
    };
    await fill(log, 0, 5);
    expect(log.failure).toBeUndefined();
    expect(log.latestCheckpoint()).toBeUndefined();
    expect(notices).toEqual([{ level: 'warn', m: expect.stringMatching(/checkpoint of size 5 could not be stored: database or disk is full; its receipts are durable/) }]);
    await fill(log, 5, 4); // (tried again with each batch: said at once, then at most every 10 s)
    expect(notices).toHaveLength(1);
    full = false;
    await fill(log, 9, 1);
    expect(log.latestCheckpoint()?.size).toBe(10);
    expect(notices[1]).toMatchObject({ level: 'warn', m: expect.stringMatching(/\(its checkpoints\) is written again$/) });
    expect(log.failure).toBeUndefined();
  });
});
