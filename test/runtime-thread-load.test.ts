// A model the runtime thread cannot load (adapters/runtime-thread.ts): the node names llama.cpp's
// reason, as it does on its own thread, and llama.cpp's lines reach the node's log. No binding is
// loaded on this thread here: llama.cpp's lines go to one binding of a process, and a serving node
// loads one, on its runtime thread.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { sendLlamaLines } from '../adapters/llama-load-errors.ts';
import { LlamaThreadAdapter } from '../adapters/runtime-thread.ts';
import { createKeyFile } from '../src/identity.ts';
import { parseConfig } from '../src/config.ts';
import { NodeStartError, startNode } from '../src/node.ts';
import { createHost } from '../src/p2p/host.ts';
import { startTinyNode, tinyNodeConfigYaml } from './helpers/node-config.ts';
import { askNode } from './helpers/paid-ask.ts';
import { testKey } from './helpers/receipts.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'runtime-thread-load-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

test("a file cut short: the start names llama.cpp's reason, its lines reach this thread's sink, and the thread ends", async () => {
  const file = path.join(dir, 'cut.gguf');
  writeTinyLlama(file);
  const whole = fs.readFileSync(file);
  fs.writeFileSync(file, whole.subarray(0, whole.length - 1000));
  const lines: string[] = [];
  const undo = sendLlamaLines((l) => lines.push(l));
  try {
    const rt = new LlamaThreadAdapter({ modelPath: file });
    const e = await rt.start().then(() => undefined, (x: unknown) => x as Error);
    expect(e?.message).toMatch(/cut\.gguf: llama\.cpp could not load it: tensor '.*' data is not within the file bounds/);
    expect(lines.some((l) => l.includes('data is not within the file bounds'))).toBe(true);
    expect(LlamaThreadAdapter.threadRunning).toBe(false);
  } finally {
    undo();
  }
});

test('the node refuses a model with an infinite weight on its runtime thread: a NodeStartError naming the model and the tensor', async () => {
  const home = path.join(dir, 'node');
  fs.mkdirSync(home);
  createKeyFile(path.join(home, 'node.key'));
  writeTinyLlama(path.join(home, 'tiny.gguf'), {
    edit: (m) => {
      const t = m.tensors.find((x) => x.name === 'blk.1.ffn_down.weight')!;
      t.data[100] = Number.NEGATIVE_INFINITY;
    },
  });
  const e = await startNode(parseConfig(tinyNodeConfigYaml({ publicKey: '11'.repeat(32), logLevel: 'fatal' }), home)).then(
    async (n) => {
      await n.stop(1000);
      return undefined;
    },
    (x: unknown) => x as Error,
  );
  expect(e).toBeInstanceOf(NodeStartError);
  expect(e?.message).toBe(`models: tiny/llama: the runtime could not start: model file ${path.join(home, 'tiny.gguf')}: tensor 'blk.1.ffn_down.weight' holds NaN or infinite values (a corrupt file): llama.cpp refuses to load it`);
  expect(LlamaThreadAdapter.threadRunning).toBe(false);
});

test('a node whose runtime thread died says so: /healthz and /readyz 503 naming it, not accepting, paid work refused with nothing charged; its stop still ends cleanly', async () => {
  const market = testKey();
  const node = await startTinyNode(path.join(dir, 'dies'), { publicKey: market.id, logLevel: 'fatal' });
  const buyer = await createHost({ seed: testKey().seed, listen: [] });
  try {
    expect((await fetch(`${node.opsUrl}/healthz`)).status).toBe(200);
    expect((await askNode(buyer, node, market)).head.status).toBe(200);
    await LlamaThreadAdapter.crashThreadForTests();
    const refused = await askNode(buyer, node, market);
    expect([refused.head.status, (refused.trailer.error as { code: string }).code]).toEqual([503, 'no_capacity']);
    expect((refused.trailer.error as { message: string }).message).toContain('the runtime thread failed');
    expect(refused.trailer.receipt).toBeUndefined();
    expect(await (await fetch(`${node.opsUrl}/status`)).json()).toMatchObject({ receipts: { receipts: 1 } });
    const health = await fetch(`${node.opsUrl}/healthz`);
    expect(health.status).toBe(503);
    expect(((await health.json()) as { reason: string }).reason).toMatch(/^the runtime thread failed \(the runtime thread ended/);
    const ready = await fetch(`${node.opsUrl}/readyz`);
    expect(ready.status).toBe(503);
    expect(JSON.stringify(await ready.json())).toContain('the runtime thread failed');
    expect(await (await fetch(`${node.opsUrl}/status`)).json()).toMatchObject({ accepting: false });
  } finally {
    await buyer.stop();
    await node.stop(1000);
  }
  expect(LlamaThreadAdapter.threadRunning).toBe(false);
});
