// replay() (src/audit/replay.ts) when a step after the runtime started fails: the error reaches
// the caller as it is, the runtime and the receipt log are released, the temporary folder is gone,
// and the next replay in the same process works.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, test, vi } from 'vitest';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { toHex, utf8 } from '../attestation/bytes.ts';
import type { ReceiptPayload } from '../attestation/receipt.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { replay } from '../src/audit/replay.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { startServing, type Serving } from './helpers/serving.ts';

const market = testKey();
const node = testKey();
let serving: Serving;
let receipt: ReceiptPayload;
const bodies = new Map<string, Uint8Array>();
/** The folder TMPDIR points at while a replay runs: only replay's own temporary folders go there. */
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'replay-cleanup-'));
const savedTmpdir = process.env.TMPDIR;

beforeAll(async () => {
  serving = await startServing({ nodeSeed: node.seed, nodeId: node.id, marketId: market.id, contextLength: 512 });
  const bytes = utf8(JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 12, seed: 3 }));
  const t = ticketPayload(node.id, { body_sha256: toHex(crypto.createHash('sha256').update(bytes).digest()), max_cost_micro_usd: '100000' });
  let trailer: Record<string, unknown> = {};
  await serving.service.handle({ head: { endpoint: 'chat/completions', ticket: signTicket(market, t) }, body: bytes, signal: new AbortController().signal }, { head: async () => {}, data: async () => {}, trailer: async (x) => void (trailer = x) });
  const v = verifyReceipt(trailer.receipt as string, { provider: node.id });
  if (!v.ok) throw new Error('the served request has no valid receipt');
  receipt = v.value.payload;
  bodies.set(t.request_id, bytes);
});
afterEach(() => {
  if (savedTmpdir === undefined) delete process.env.TMPDIR;
  else process.env.TMPDIR = savedTmpdir;
  vi.restoreAllMocks();
});
afterAll(async () => {
  await serving?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const modelPath = () => path.join(serving.dir, 'tiny.gguf');

/** Counts runtime starts and stops, receipt log closes and the temporary folders made (the real calls still run). */
function watch() {
  const starts = vi.spyOn(LlamaEmbeddedAdapter.prototype, 'start');
  const stops = vi.spyOn(LlamaEmbeddedAdapter.prototype, 'stop');
  const logCloses = vi.spyOn(ReceiptLog.prototype, 'close');
  const made: string[] = [];
  const mkdtemp = fs.mkdtempSync.bind(fs);
  vi.spyOn(fs, 'mkdtempSync').mockImplementation(((prefix: string, options?: unknown) => {
    const dir = mkdtemp(prefix, options as never) as unknown as string;
    made.push(dir);
    return dir;
  }) as typeof fs.mkdtempSync);
  return {
    made,
    counts: () => ({ starts: starts.mock.calls.length, stops: stops.mock.calls.length, logCloses: logCloses.mock.calls.length }),
  };
}

/** A replay that works, with TMPDIR at `tmp`: the served receipt reproduces, and nothing is left there. */
async function replaysAgain(): Promise<void> {
  process.env.TMPDIR = tmp;
  const r = await replay({ receipts: [receipt], requests: bodies, modelPath: modelPath(), contextLength: 512 });
  expect(r).toMatchObject({ replayed: 1, matched: 1, mismatches: [] });
  expect(fs.readdirSync(tmp)).toEqual([]);
}

describe('replay: a failure after the runtime started', () => {
  test('the temporary folder cannot be made (TMPDIR missing): the error names it, the runtime is stopped, and replay works again', async () => {
    const w = watch();
    const missing = path.join(tmp, 'no-such-folder');
    process.env.TMPDIR = missing;
    const failed = replay({ receipts: [receipt], requests: bodies, modelPath: modelPath(), contextLength: 512 });
    await expect(failed).rejects.toMatchObject({ code: 'ENOENT', syscall: 'mkdtemp' });
    await expect(failed).rejects.toThrow(`${missing}/seller-node-replay-`);
    expect(w.counts()).toEqual({ starts: 1, stops: 1, logCloses: 0 }); // no log was opened
    expect(fs.existsSync(missing)).toBe(false);
    await replaysAgain();
  });

  test('a receipt that throws mid-run (rates that are not integers): the error surfaces, the log and runtime are released, the folder is removed', async () => {
    const w = watch();
    process.env.TMPDIR = tmp;
    // A receipt not checked before replay (replay trusts its caller to pass a verified export's).
    const unpriced = { ...receipt, price: { ...receipt.price, rates: { ...receipt.price.rates, input_per_mtok: 'not a number' } } } as ReceiptPayload;
    // The good one first: the log has a receipt in it, and the runtime has run, when the second fails.
    const failed = replay({ receipts: [receipt, unpriced], requests: bodies, modelPath: modelPath(), contextLength: 512 });
    await expect(failed).rejects.toThrow(SyntaxError);
    await expect(failed).rejects.toThrow(/Cannot convert not a number to a BigInt/);
    expect(w.made).toHaveLength(1);
    expect(path.dirname(w.made[0]!)).toBe(tmp);
    expect(path.basename(w.made[0]!)).toMatch(/^seller-node-replay-/);
    expect(fs.existsSync(w.made[0]!)).toBe(false);
    expect(fs.readdirSync(tmp)).toEqual([]);
    expect(w.counts()).toEqual({ starts: 1, stops: 1, logCloses: 1 });
    await replaysAgain();
    expect(w.counts()).toEqual({ starts: 2, stops: 2, logCloses: 2 });
  });
});

describe('replay: the device', () => {
  test('receipts computed on the CPU are replayed on the CPU (floating point differs on a GPU); others on the GPU when the host has one; the model is probed first', async () => {
    const devices: unknown[] = [];
    const probed: boolean[] = [];
    vi.spyOn(LlamaEmbeddedAdapter.prototype, 'start').mockImplementation(async function (this: LlamaEmbeddedAdapter) {
      const opts = (this as unknown as { opts: { gpu?: unknown; probe?: unknown } }).opts;
      devices.push(opts.gpu);
      probed.push(opts.probe !== undefined); // (the child-process probe, as at the node's start: an aborting model does not kill the audit)
      throw new Error('not started: the test asks only which device');
    });
    expect(receipt.runtime.version).toMatch(/\/cpu$/); // (this host has no GPU)
    const onGpu = { ...receipt, runtime: { ...receipt.runtime, version: receipt.runtime.version.replace(/\/cpu$/, '/cuda') } };
    for (const receipts of [[receipt], [onGpu], [receipt, onGpu]]) {
      await expect(replay({ receipts, requests: bodies, modelPath: modelPath(), contextLength: 512 })).rejects.toThrow('not started');
    }
    expect(devices).toEqual([false, 'auto', 'auto']);
    expect(probed).toEqual([true, true, true]);
  });
});
