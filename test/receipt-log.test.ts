import { spawn, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, test } from 'vitest';
import { toHex } from '../attestation/bytes.ts';
import { verifyCheckpoint, receiptLogKey, receiptLogOrigin } from '../attestation/checkpoint.ts';
import { headPath } from '../src/store/checkpoint-head.ts';
import { verifyLog } from '../attestation/log-verify.ts';
import { verifyConsistency, verifyInclusion, leafHash } from '../attestation/merkle.ts';
import { ed25519PublicKey } from '../attestation/ed25519.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { SEGMENT } from '../src/store/request-key-filter.ts';
import { requestKey } from '../src/store/log-writer.ts';
import { exportLog } from '../src/store/export.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';
import { utf8 } from '../attestation/bytes.ts';
import { REPO_ROOT } from './helpers/vectors.ts';
import { until } from './helpers/wait.ts';
import { CLI_BIN } from './helpers/cli-run.ts';
import { loadKeyFile } from '../src/identity.ts';

const dirs: string[] = [];
const open: ReceiptLog[] = [];
afterEach(async () => {
  for (const l of open.splice(0)) await l.close();
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});
function tmp(): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'rlog-'));
  dirs.push(d);
  return d;
}
function openLog(file: string, seed: Uint8Array, extra: Partial<Parameters<typeof ReceiptLog.open>[0]> = {}): ReceiptLog {
  const l = ReceiptLog.open({ path: file, seed, checkpointIntervalMs: 0, ...extra });
  open.push(l);
  return l;
}
const seed = () => new Uint8Array(crypto.randomBytes(32));

describe('ReceiptLog', () => {
  test('many requests finishing at once get seqs in call order and one valid chain', async () => {
    const s = seed();
    const log = openLog(path.join(tmp(), 'r.db'), s, { checkpointEvery: 100 });
    const results = await Promise.all(Array.from({ length: 700 }, (_, i) => log.append(syntheticReceiptBody(i))));
    expect(results.map((r) => r.seq)).toEqual(Array.from({ length: 700 }, (_, i) => String(i)));
    results.forEach((r, i) => expect(r.payload.request_id).toBe(syntheticReceiptBody(i).request_id));
    // Group commit: far fewer transactions than receipts.
    expect(log.stats().commits).toBeLessThan(20);
    expect(log.stats().backlog).toBe(0);
    const v = verifyLog({ provider: log.providerId, receipts: [...log.lines()], checkpoints: log.checkpoints().map((c) => c.note) });
    expect(v).toMatchObject({ ok: true, value: { receipts: 700 } });
    expect(log.checkpoints().length).toBeGreaterThanOrEqual(1);
  });

  test('each append resolves with the envelope that is on disk, verifiable on its own', async () => {
    const s = seed();
    const file = path.join(tmp(), 'r.db');
    const log = openLog(file, s);
    // A usage_runtime with integer-like keys (which JS enumerates first) still signs canonically.
    const r = await log.append({ ...syntheticReceiptBody(0), usage_runtime: { '10': 1, '9': 2, tokens: { '2': 1, '11': 0 } } });
    expect(verifyReceipt(r.line, { provider: log.providerId }).ok).toBe(true);
    // Another connection (another process would see the same) reads it back.
    const db = new Database(file, { readonly: true });
    expect(db.prepare('SELECT sum(count) AS n FROM receipt_batches').get()).toEqual({ n: 1 });
    db.close();
    expect(log.lineBySeq(0)).toBe(r.line);
    expect(log.byRequestId(r.payload.request_id)).toEqual([{ seq: 0, line: r.line }]);
    expect(log.byRequestId('nope')).toEqual([]);
  });

  test('byRequestId finds every receipt of a request id in seq order, from memory and after a reopen', async () => {
    const s = seed();
    const file = path.join(tmp(), 'r.db');
    const log = openLog(file, s);
    const body = (i: number, requestId: string) => ({ ...syntheticReceiptBody(i), request_id: requestId });
    const appended: Awaited<ReturnType<ReceiptLog['append']>>[] = [];
    for (const [i, id] of ['retried', 'other', 'retried', 'third', 'retried'].entries()) appended.push(await log.append(body(i, id)));
    const expected = [0, 2, 4].map((seq) => ({ seq, line: appended[seq]!.line }));
    expect(log.byRequestId('retried')).toEqual(expected);
    expect(log.byRequestId('other')).toEqual([{ seq: 1, line: appended[1]!.line }]);
    await log.close();
    open.splice(open.indexOf(log), 1);
    // Reopened, nothing is in memory: the stored batches' request keys are scanned.
    const again = openLog(file, s);
    expect(again.byRequestId('retried')).toEqual(expected);
    expect(again.byRequestId('third')).toEqual([{ seq: 3, line: appended[3]!.line }]);
    expect(again.byRequestId('never')).toEqual([]);
  });

  test('byRequestId: ids that share the in-memory index key (its low 30 bits) are told apart by the payload', async () => {
    // A birthday search for two ids whose request keys differ but agree in their low 30 bits.
    const seen = new Map<number, string>();
    let pair: [string, string] | undefined;
    for (let i = 0; !pair; i++) {
      const id = `req-${i}`;
      const k = requestKey(id);
      const other = seen.get(k % 2 ** 30);
      if (other !== undefined && requestKey(other) !== k) pair = [other, id];
      seen.set(k % 2 ** 30, id);
    }
    const [a, b] = pair;
    const log = openLog(path.join(tmp(), 'r.db'), seed());
    const body = (i: number, requestId: string) => ({ ...syntheticReceiptBody(i), request_id: requestId });
    const got: Awaited<ReturnType<ReceiptLog['append']>>[] = [];
    for (const [i, id] of [a, b, a, 'x', b].entries()) got.push(await log.append(body(i, id)));
    expect(log.byRequestId(a)).toEqual([0, 2].map((seq) => ({ seq, line: got[seq]!.line })));
    expect(log.byRequestId(b)).toEqual([1, 4].map((seq) => ({ seq, line: got[seq]!.line })));
    expect(log.byRequestId('x')).toEqual([{ seq: 3, line: got[3]!.line }]);
  });

  test('after a reopen, lookups read only the segments that may hold the id: found in any segment, retries across segments in seq order', async () => {
    const s = seed();
    const file = path.join(tmp(), 'r.db');
    const log = openLog(file, s);
    const n = SEGMENT * 2 + 500; // three segments
    const idOf = (i: number) => (i === 10 || i === SEGMENT + 10 || i === n - 1 ? 'retried-across' : `req-${i}`);
    for (let i = 0; i < n; i += 1024) await Promise.all(Array.from({ length: Math.min(1024, n - i) }, (_, j) => log.append({ ...syntheticReceiptBody(i + j), request_id: idOf(i + j) })));
    const lines = [10, SEGMENT + 10, n - 1].map((seq) => log.lineBySeq(seq));
    await log.close();
    open.splice(open.indexOf(log), 1);
    const again = openLog(file, s);
    expect(again.byRequestId('retried-across')).toEqual([10, SEGMENT + 10, n - 1].map((seq, i) => ({ seq, line: lines[i] })));
    for (const seq of [0, SEGMENT - 1, SEGMENT, 2 * SEGMENT + 7]) expect(again.byRequestId(`req-${seq}`).map((r) => r.seq)).toEqual([seq]);
    expect(again.byRequestId('never-issued')).toEqual([]);
    // New receipts are found too (from memory), and still after the next reopen (from the filter).
    const added = await again.append({ ...syntheticReceiptBody(n), request_id: 'retried-across' });
    expect(again.byRequestId('retried-across').map((r) => r.seq)).toEqual([10, SEGMENT + 10, n - 1, n]);
    expect(added.seq).toBe(String(n));
  });

  test('in-process and worker signing produce identical bytes', async () => {
    const s = seed();
    const a = openLog(path.join(tmp(), 'a.db'), s, { threads: 0 });
    const b = openLog(path.join(tmp(), 'b.db'), s, { threads: 2 });
    const ra = await Promise.all([0, 1, 2, 3].map((i) => a.append(syntheticReceiptBody(i))));
    const rb = await Promise.all([0, 1, 2, 3].map((i) => b.append(syntheticReceiptBody(i))));
    expect(rb.map((r) => r.line)).toEqual(ra.map((r) => r.line));
    expect(toHex(a.root())).toBe(toHex(b.root()));
  });

  test('an invalid body is refused with the field named, and takes no seq', async () => {
    const log = openLog(path.join(tmp(), 'r.db'), seed());
    const bad = { ...syntheticReceiptBody(0), usage: { input_tokens: -1, output_tokens: 0 } };
    await expect(log.append(bad)).rejects.toMatchObject({ code: 'receipt_invalid', field: 'usage.input_tokens' });
    const overCharged = { ...syntheticReceiptBody(0), cost_micro_usd: '999999999' };
    await expect(log.append(overCharged)).rejects.toMatchObject({ code: 'receipt_invalid', field: 'cost_micro_usd' });
    const overHold = { ...syntheticReceiptBody(0), hold_micro_usd: '0' };
    await expect(log.append(overHold)).rejects.toMatchObject({ code: 'receipt_invalid' });
    const ok = await log.append(syntheticReceiptBody(1));
    expect(ok.seq).toBe('0');
  });

  test('restart continues the seq and the chain; checkpoints stay consistent', async () => {
    const s = seed();
    const file = path.join(tmp(), 'r.db');
    const log1 = ReceiptLog.open({ path: file, seed: s, checkpointIntervalMs: 0, checkpointEvery: 10 });
    await Promise.all(Array.from({ length: 25 }, (_, i) => log1.append(syntheticReceiptBody(i))));
    const root25 = log1.root();
    await log1.close(); // signs a final checkpoint at 25
    const log2 = openLog(file, s, { checkpointEvery: 10 });
    expect(log2.size).toBe(25);
    // Requests from before the restart are found on disk (the in-memory index starts empty).
    const old = log2.byRequestId(syntheticReceiptBody(7).request_id);
    expect(old.map((r) => r.seq)).toEqual([7]);
    expect(verifyReceipt(old[0]!.line, { provider: log2.providerId }).ok).toBe(true);
    const r = await log2.append(syntheticReceiptBody(25));
    expect(r.seq).toBe('25');
    await Promise.all(Array.from({ length: 10 }, (_, i) => log2.append(syntheticReceiptBody(26 + i))));
    // Checkpoints fall on every multiple of checkpointEvery, and at close (25).
    expect(log2.checkpoints().map((c) => c.size)).toEqual([10, 20, 25, 30]);
    expect(log2.checkpoint()).toBeDefined(); // 36
    expect(log2.checkpoint()).toBeUndefined(); // nothing new
    const cps = log2.checkpoints();
    expect(cps.map((c) => c.size)).toContain(25);
    const origin = receiptLogOrigin(log2.providerId);
    const key = { name: origin, origin, publicKey: ed25519PublicKey(s) };
    const parsed = cps.map((c) => verifyCheckpoint(c.note, key));
    for (const p of parsed) expect(p.ok).toBe(true);
    const first = parsed.find((p) => p.ok && p.value.size === 25)!;
    const last = parsed.at(-1)!;
    if (!first.ok || !last.ok) throw new Error('unreachable');
    expect(toHex(first.value.rootHash)).toBe(toHex(root25));
    expect(verifyConsistency(25, last.value.size, log2.consistencyProof(25, last.value.size), first.value.rootHash, last.value.rootHash).ok).toBe(true);
    expect(verifyInclusion(3, last.value.size, leafHash(utf8(log2.lineBySeq(3)!)), log2.inclusionProof(3, last.value.size), last.value.rootHash).ok).toBe(true);
    expect(verifyLog({ provider: log2.providerId, receipts: [...log2.lines()], checkpoints: cps.map((c) => c.note) }).ok).toBe(true);
  });

  test('a log refuses a different key, and a tampered store', async () => {
    const s = seed();
    const file = path.join(tmp(), 'r.db');
    const log = ReceiptLog.open({ path: file, seed: s, checkpointIntervalMs: 0, threads: 0 });
    // Three batches: seq 0, 1-2, 3.
    await log.append(syntheticReceiptBody(0));
    await Promise.all([1, 2].map((i) => log.append(syntheticReceiptBody(i))));
    await log.append(syntheticReceiptBody(3));
    await log.close();
    const backup = fs.readFileSync(file);
    const reset = () => fs.writeFileSync(file, backup);
    expect(() => ReceiptLog.open({ path: file, seed: seed(), threads: 0 })).toThrow(expect.objectContaining({ code: 'log_wrong_key' }));
    // A changed leaf no longer matches the signed checkpoint.
    let db = new Database(file);
    const leaves = Buffer.from((db.prepare('SELECT leaves FROM receipt_batches WHERE first_seq = 1').get() as { leaves: Buffer }).leaves);
    leaves[40] = leaves[40]! ^ 1;
    db.prepare('UPDATE receipt_batches SET leaves = ? WHERE first_seq = 1').run(leaves);
    db.close();
    expect(() => ReceiptLog.open({ path: file, seed: s, threads: 0 })).toThrow(expect.objectContaining({ code: 'log_corrupt' }));
    // A missing batch is a gap in seq.
    reset();
    db = new Database(file);
    db.prepare('DELETE FROM receipt_batches WHERE first_seq = 1').run();
    db.close();
    expect(() => ReceiptLog.open({ path: file, seed: s, threads: 0 })).toThrow(expect.objectContaining({ code: 'log_corrupt', message: expect.stringContaining('missing seq 1') }));
    // A truncated blob is damage, named as such.
    reset();
    db = new Database(file);
    db.prepare('UPDATE receipt_batches SET sigs = zeroblob(10) WHERE first_seq = 3').run();
    db.close();
    expect(() => ReceiptLog.open({ path: file, seed: s, threads: 0 })).toThrow(expect.objectContaining({ code: 'log_corrupt', message: expect.stringContaining('damaged') }));
    reset();
    const again = openLog(file, s, { threads: 0 });
    expect(again.size).toBe(4);
  });

  test('more batches than the signers take at once: every receipt is acknowledged in seq order, flush waits for the ones not yet handed over', async () => {
    const s = seed();
    // A batch of 3 at most and 2 signer threads taking 4 batches: most of 200 receipts wait in the queue.
    const log = openLog(path.join(tmp(), 'r.db'), s, { maxBatch: 3, checkpointEvery: 50 });
    const order: string[] = [];
    const all = Array.from({ length: 200 }, (_, i) => log.append(syntheticReceiptBody(i)).then((r) => void order.push(r.seq)));
    await log.flush();
    // flush returned only once every receipt accepted before it was durable and acknowledged.
    expect(order).toEqual(Array.from({ length: 200 }, (_, i) => String(i)));
    expect(log.stats()).toMatchObject({ receipts: 200, backlog: 0 });
    expect(log.stats().commits).toBeGreaterThanOrEqual(67);
    await Promise.all(all);
    expect(verifyLog({ provider: log.providerId, receipts: [...log.lines()], checkpoints: log.checkpoints().map((c) => c.note) })).toMatchObject({ ok: true, value: { receipts: 200 } });
  });

  test('receipts.checkpoint: written at most once an interval (headEveryMs, default 1 s) while receipts stream in, the latest an interval later, and at close', async () => {
    const s = seed();
    const dir = tmp();
    const appendRange = async (log: ReceiptLog, from: number, to: number) => {
      for (let i = from; i < to; i += 10) await Promise.all(Array.from({ length: 10 }, (_, k) => log.append(syntheticReceiptBody(i + k))));
    };
    const headOf = (file: string, log: ReceiptLog) => verifyCheckpoint(fs.readFileSync(headPath(file), 'utf8'), receiptLogKey(log.providerId)!);
    // An interval no run of this test reaches: only the first checkpoint's file is written, until close.
    const file = path.join(dir, 'receipts.db');
    const log = openLog(file, s, { checkpointEvery: 10, headEveryMs: 600_000 });
    await appendRange(log, 0, 10);
    expect(headOf(file, log)).toMatchObject({ ok: true, value: { size: 10 } }); // the first at once
    await appendRange(log, 10, 100);
    expect(log.latestCheckpoint()?.size).toBe(100);
    expect(headOf(file, log)).toMatchObject({ ok: true, value: { size: 10 } }); // nine more signed, the file unchanged
    await log.close();
    expect(headOf(file, log)).toMatchObject({ ok: true, value: { size: 100 } });
    // A short interval: the latest checkpoint is written when it has passed, without a close.
    const other = path.join(dir, 'other.db');
    const quick = openLog(other, s, { checkpointEvery: 10, headEveryMs: 200 });
    await appendRange(quick, 0, 20);
    expect(quick.latestCheckpoint()?.size).toBe(20);
    await until('the latest checkpoint in receipts.checkpoint', () => headOf(other, quick).ok && (headOf(other, quick) as { value: { size: number } }).value.size === 20);
  });

  test('in-process writing (threads 0): after a failed commit no later batch lands, so the stored log has no gap (s25 hR)', async () => {
    const s = seed();
    const file = path.join(tmp(), 'r.db');
    const log = openLog(file, s, { threads: 0, maxBatch: 1 });
    await log.append(syntheticReceiptBody(0));
    // Another writer takes seq 1's row: the commit of the next batch fails (UNIQUE first_seq).
    const other = new Database(file);
    other.prepare('INSERT INTO receipt_batches (first_seq, count, payloads, offsets, sigs, leaves, request_keys) VALUES (1, 1, ?, ?, ?, ?, ?)').run(Buffer.from('{}'), Buffer.alloc(8), Buffer.alloc(64), Buffer.alloc(32), Buffer.alloc(8));
    // Two batches handed over together: the first fails, the second (seq 2) must not be committed.
    const results = await Promise.allSettled([log.append(syntheticReceiptBody(1)), log.append(syntheticReceiptBody(2))]);
    expect(results.map((r) => r.status)).toEqual(['rejected', 'rejected']);
    expect(other.prepare('SELECT first_seq FROM receipt_batches ORDER BY first_seq').all()).toEqual([{ first_seq: 0 }, { first_seq: 1 }]);
    other.close();
  });

  test('a closed log refuses appends; close flushes what was pending', async () => {
    const s = seed();
    const file = path.join(tmp(), 'r.db');
    const log = ReceiptLog.open({ path: file, seed: s, checkpointIntervalMs: 0 });
    const pending = Array.from({ length: 50 }, (_, i) => log.append(syntheticReceiptBody(i)));
    await log.close();
    expect((await Promise.all(pending)).length).toBe(50);
    await expect(log.append(syntheticReceiptBody(50))).rejects.toMatchObject({ code: 'log_closed' });
    const again = openLog(file, s);
    expect(again.size).toBe(50);
    expect(again.latestCheckpoint()?.size).toBe(50);
  });

  test('a receipt whose append resolved survives SIGKILL, and the log reopens whole', async () => {
    const s = seed();
    const file = path.join(tmp(), 'r.db');
    const child = spawn(process.execPath, [path.join(REPO_ROOT, 'test/helpers/crash-appender.ts'), file, toHex(s)], { stdio: ['ignore', 'pipe', 'inherit'] });
    const acked: number[] = [];
    let buf = '';
    await new Promise<void>((resolve) => {
      child.stdout.on('data', (d: Buffer) => {
        buf += d.toString();
        const lines = buf.split('\n');
        buf = lines.pop()!;
        for (const l of lines) acked.push(Number(l));
        if (acked.length >= 2000) {
          child.kill('SIGKILL');
          resolve();
        }
      });
    });
    await new Promise((r) => child.on('exit', r));
    const log = openLog(file, s);
    expect(log.size).toBeGreaterThanOrEqual(Math.max(...acked) + 1);
    const v = verifyLog({ provider: log.providerId, receipts: [...log.lines()], checkpoints: log.checkpoints().map((c) => c.note) });
    expect(v.ok).toBe(true);
  });
});

// Two connections to one receipt log: `seller-node log export` opens the node's receipts.db while
// the node runs, and signs a checkpoint over every durable receipt when none covers them yet.
// The node must then carry on: its next checkpoint of the same size is the same statement.
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

describe('a receipt log opened while another process appends and checkpoints', () => {
  // `log export` / `log prove` beside a running node: the node commits receipts and checkpoints
  // from another process while this connection rebuilds its tree. Receipts and the latest
  // checkpoint are read in one transaction, so an open never sees a checkpoint beyond the receipts
  // it read (which looked like a checkpoint over another log: log_corrupt).
  test('every open succeeds, and each sees a whole, checkpoint-consistent prefix', async () => {
    const dir = tmp();
    const init = spawnSync(process.execPath, [CLI_BIN, 'init', '--data', dir], { encoding: 'utf8' });
    expect(init.status, init.stderr).toBe(0);
    const seed = loadKeyFile(path.join(dir, 'node.key')).seed;
    const fill = spawn(process.execPath, [CLI_BIN, 'log', 'fill', '--data', dir, '--count', '150000', '--checkpoint-every', '7', '--threads', '1'], { stdio: 'ignore' });
    const filled = new Promise<number | null>((r) => fill.on('exit', (code) => r(code)));
    let running = true;
    void filled.then(() => (running = false));
    try {
      const file = path.join(dir, 'receipts.db');
      // Until the filler has made its log and committed receipts (read-only: nothing written here).
      const started = () => {
        try {
          const db = new Database(file, { readonly: true, fileMustExist: true });
          try {
            return db.prepare<[], { n: number }>('SELECT COUNT(*) AS n FROM receipt_batches').get()!.n > 0;
          } finally {
            db.close();
          }
        } catch {
          return false;
        }
      };
      while (!started()) await new Promise((r) => setTimeout(r, 20));
      let opens = 0; // of a log big enough that rebuilding it takes a while
      const failures: string[] = [];
      while (running && opens < 20) {
        try {
          const reader = ReceiptLog.open({ path: file, seed, threads: 0, checkpointIntervalMs: 0 });
          const cp = reader.latestCheckpoint();
          if (cp) expect(cp.size).toBeLessThanOrEqual(reader.size);
          if (reader.size > 20_000) opens++;
          await reader.close(); // (its closing checkpoint is one the filler would sign at that size)
        } catch (e) {
          failures.push((e as Error).message);
          opens++;
        }
        await new Promise((r) => setTimeout(r, 10));
      }
      expect(opens).toBeGreaterThan(3); // (the fill was still running: the opens raced it)
      expect(failures).toEqual([]);
    } finally {
      fill.kill('SIGKILL');
      await filled;
    }
  }, 60_000);
});
