// Receipts signed and durably logged per second (ReceiptLog: 2 signer workers, SQLite WAL with
// group commit, fsync per batch) against raw node:crypto Ed25519 signing of the same payload
// bytes on both cores. Also: event-loop lag p99 while the log signs at full rate. Three rounds,
// baseline and log alternating; the figures are the medians.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { utf8 } from '../attestation/bytes.ts';
import { canonicalize } from '../attestation/canonical-json.ts';
import { pae } from '../attestation/dsse.ts';
import { GENESIS_PREV, RECEIPT_PAYLOAD_TYPE } from '../attestation/receipt.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';
import { identityFromSeed } from '../src/identity.ts';
import { inWorkers, median, record } from './lib.ts';

const RAW_SIGNER = `
import { workerData, parentPort } from 'node:worker_threads';
import crypto from 'node:crypto';
const key = crypto.createPrivateKey({ key: Buffer.concat([Buffer.from('302e020100300506032b657004220420', 'hex'), Buffer.from(workerData.seed)]), format: 'der', type: 'pkcs8' });
const t0 = performance.now();
for (const m of workerData.messages) crypto.sign(null, m, key);
parentPort.postMessage({ ms: performance.now() - t0, n: workerData.messages.length });
`;

export async function benchSignLog(n: number, rounds = 3): Promise<void> {
  const seed = new Uint8Array(crypto.randomBytes(32));
  const provider = identityFromSeed(seed).providerId;
  // The exact bytes the log signs: PAE over each canonical payload.
  const messages = Array.from({ length: n }, (_, i) =>
    pae(RECEIPT_PAYLOAD_TYPE, utf8(canonicalize({ v: 1, provider, seq: String(i), prev: GENESIS_PREV, ...syntheticReceiptBody(i) }))),
  );
  const bodies = Array.from({ length: n }, (_, i) => syntheticReceiptBody(i));
  const half = Math.ceil(n / 2);
  // Rounds alternate baseline and log, so drift on a shared machine hits both; figures are medians.
  const rows: { raw: number; log: number; p99: number; perCommit: number }[] = [];
  for (let round = 0; round < rounds; round++) {
    // Each worker times its own signing loop (thread start-up is not signing); both run at once.
    const rawRun = async () => {
      const runs = await inWorkers<{ ms: number }>(RAW_SIGNER, [{ seed, messages: messages.slice(0, half) }, { seed, messages: messages.slice(half) }], 2);
      return n / (Math.max(...runs.map((r) => r.ms)) / 1000);
    };
    if (round % 2) {
      const log = await logRun(seed, bodies);
      rows.push({ raw: await rawRun(), ...log });
    } else {
      const raw = await rawRun();
      rows.push({ raw, ...(await logRun(seed, bodies)) });
    }
  }
  const ratio = median(rows.map((r) => r.log / r.raw));
  record({ name: 'receipts signed + durably logged /s', value: median(rows.map((r) => r.log)), unit: '/s', baseline: median(rows.map((r) => r.raw)), ratio, target: '>= 0.6', pass: ratio >= 0.6 });
  record({ name: '  (receipts per commit, i.e. per fsync)', value: median(rows.map((r) => r.perCommit)), unit: 'receipts/fsync' });
  const p99 = median(rows.map((r) => r.p99));
  record({ name: `event-loop lag p99 while signing at full rate (worst round ${Math.max(...rows.map((r) => r.p99)).toFixed(1)} ms)`, value: p99, unit: 'ms', target: '<= 10 ms', pass: p99 <= 10 });
}

/** One full-rate run of a fresh receipt log: receipts/s, event-loop lag p99, receipts per commit. */
async function logRun(seed: Uint8Array, bodies: ReturnType<typeof syntheticReceiptBody>[]): Promise<{ log: number; p99: number; perCommit: number }> {
  const n = bodies.length;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'bench-log-'));
  const log = ReceiptLog.open({ path: path.join(dir, 'r.db'), seed, checkpointIntervalMs: 0 });
  // Steady state, as on a node that has been up a while: the signer and writer threads have
  // started and compiled their code before the clock starts (the baseline's workers likewise time
  // only their signing loops).
  await Promise.all(Array.from({ length: 2048 }, (_, i) => log.append(syntheticReceiptBody(n + i))));
  await log.flush();
  const before = log.stats().commits;
  const lag = monitorEventLoopDelay({ resolution: 1 });
  lag.enable();
  const t1 = performance.now();
  // Requests finish a few at a time, as on a busy node: 64 per turn of the event loop, with at
  // most 4096 waiting on the log.
  let outstanding = 0;
  let wake: (() => void) | undefined;
  const done = () => {
    outstanding--;
    if (wake && outstanding <= 2048) {
      wake();
      wake = undefined;
    }
  };
  for (let i = 0; i < n; i += 64) {
    for (const b of bodies.slice(i, i + 64)) {
      outstanding++;
      void log.append(b).then(done);
    }
    if (outstanding >= 4096) await new Promise<void>((r) => (wake = r));
    else await new Promise((r) => setImmediate(r));
  }
  await log.flush();
  const rate = n / ((performance.now() - t1) / 1000);
  lag.disable();
  const stats = log.stats();
  await log.close();
  fs.rmSync(dir, { recursive: true, force: true });
  return { log: rate, p99: lag.percentile(99) / 1e6, perCommit: n / (stats.commits - before) };
}
