// Two connections to one receipt log: `seller-node log export` opens the node's receipts.db while
// the node runs, and signs a checkpoint over every durable receipt when none covers them yet.
// The node must then carry on: its next checkpoint of the same size is the same statement.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { verifyLog } from '../attestation/log-verify.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { exportLog } from '../src/store/export.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';

const dirs: string[] = [];
const open: ReceiptLog[] = [];
afterEach(async () => {
  for (const l of open.splice(0)) await l.close();
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});
function tmp(): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'rlog-shared-'));
  dirs.push(d);
  return d;
}

describe('a receipt log exported while its node runs', () => {
  test('the node signs its next checkpoints, appends and closes as before, and both exports verify', async () => {
    const seed = new Uint8Array(crypto.randomBytes(32));
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const node = ReceiptLog.open({ path: file, seed, checkpointIntervalMs: 0, checkpointEvery: 10 });
    open.push(node);
    await Promise.all(Array.from({ length: 5 }, (_, i) => node.append(syntheticReceiptBody(i))));
    expect(node.latestCheckpoint()).toBeUndefined(); // the timer has not fired yet

    // `log export` in another connection: it checkpoints size 5 into the node's database.
    const reader = ReceiptLog.open({ path: file, seed, threads: 0, checkpointIntervalMs: 0 });
    const first = await exportLog(reader, path.join(dir, 'out1'), []);
    await reader.close();
    expect(first).toMatchObject({ receipts: 5, checkpoints: 1, latestCheckpointSize: 5 });
    const exported = fs.readFileSync(path.join(dir, 'out1', 'checkpoint'), 'utf8');

    // The node's own checkpoint of that size (its timer firing) is the same note, not a crash.
    expect(node.checkpoint()).toBe(exported);
    expect(node.latestCheckpoint()?.size).toBe(5);
    // It keeps appending, checkpointing at every 10 receipts, and closes with a final checkpoint.
    await Promise.all(Array.from({ length: 7 }, (_, i) => node.append(syntheticReceiptBody(5 + i))));
    expect(node.checkpoints().map((c) => c.size)).toEqual([5, 10]);
    await node.close();
    open.length = 0;

    const again = ReceiptLog.open({ path: file, seed, threads: 0, checkpointIntervalMs: 0 });
    open.push(again);
    expect(again.checkpoints().map((c) => c.size)).toEqual([5, 10, 12]);
    const v = verifyLog({ provider: again.providerId, receipts: [...again.lines()], checkpoints: again.checkpoints().map((c) => c.note) });
    expect(v).toMatchObject({ ok: true, value: { receipts: 12 } });
  });

  test('a stored checkpoint that disagrees with the tree stops the log, never a second note of that size', async () => {
    const seed = new Uint8Array(crypto.randomBytes(32));
    const file = path.join(tmp(), 'receipts.db');
    const node = ReceiptLog.open({ path: file, seed, checkpointIntervalMs: 0, threads: 0 });
    open.push(node);
    await Promise.all(Array.from({ length: 3 }, (_, i) => node.append(syntheticReceiptBody(i))));
    // Another writer stored a checkpoint of size 3 over another root.
    const Database = (await import('better-sqlite3')).default;
    const db = new Database(file);
    db.prepare('INSERT INTO checkpoints (size, root, note, created_at) VALUES (3, ?, ?, 0)').run(Buffer.alloc(32, 7), 'forged');
    db.close();
    expect(() => node.checkpoint()).toThrow(/checkpoint of size 3/);
    expect(node.checkpoints().map((c) => c.note)).toEqual(['forged']);
    // The log stops rather than sign over a history it cannot vouch for.
    await expect(node.append(syntheticReceiptBody(3))).rejects.toMatchObject({ code: 'log_corrupt' });
  });

  test("the node's checkpoint timer firing after an export's checkpoint is no uncaught exception", async () => {
    const seed = new Uint8Array(crypto.randomBytes(32));
    const dir = tmp();
    const file = path.join(dir, 'receipts.db');
    const node = ReceiptLog.open({ path: file, seed, checkpointIntervalMs: 200 });
    open.push(node);
    await Promise.all(Array.from({ length: 4 }, (_, i) => node.append(syntheticReceiptBody(i))));
    // Before the timer's next turn: the export checkpoints the 4 receipts first.
    const reader = ReceiptLog.open({ path: file, seed, threads: 0, checkpointIntervalMs: 0 });
    await exportLog(reader, path.join(dir, 'out'), []);
    await reader.close();
    expect(node.stats().lastCheckpointSize).toBe(0); // (the export came first)
    await new Promise((r) => setTimeout(r, 500)); // the timer's turns
    expect(node.stats().lastCheckpointSize).toBe(4);
    const r = await node.append(syntheticReceiptBody(4));
    expect(r.seq).toBe('4');
  });
});
