// A model file written over in place while the node serves it. Mapped (mmap: true): that model is
// refused until a restart, and only it. The node's capacity snapshot says `accepting: false` for
// that model alone, the market tickets it no more, the gateway's catalog has no live route for it,
// and the node's other models are sold as before. /readyz says the node is degraded, naming the
// model. Read into memory (the default): the file is cut short and filled with other bytes, and the
// node serves on, the same answers under the same hash, without a crash (a mapped file cut short
// kills the process: SIGBUS).
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import type { RunningNode } from '../src/node.ts';
import { errorOf, marketTotals } from './helpers/gateway-reads.ts';
import { startMarketFixture, type MarketFixture } from './helpers/market-fixture.ts';
import { until, waitForListed } from './helpers/wait.ts';

let fx: MarketFixture;
/** The node's folder: its model files. */
let dir: string;
let url: string;
let node: RunningNode;
let gw: Gateway;

beforeAll(async () => {
  fx = await startMarketFixture('model-served-change-', { heartbeatIntervalMs: 300 });
  url = fx.url;
  // The tiny node with two more models beside tiny/llama: tiny/other mapped, tiny/copy read into memory.
  node = await fx.tinyNode('node', {
    context: 512,
    slots: 1,
    logLevel: 'fatal',
    moreModels: [
      { id: 'tiny/other', file: 'other.gguf', seed: 2, mmap: true },
      { id: 'tiny/copy', file: 'copy.gguf', seed: 3 },
    ],
  });
  dir = path.join(fx.dir, 'node');
  await waitForListed(url, [node.providerId]);
  gw = await createGateway({ market: url, port: 0 });
}, 60_000);

afterAll(async () => {
  await gw?.close(1000);
  await fx?.close();
});

const chat = (model: string): Promise<Response> =>
  fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hello' }], max_tokens: 4, seed: 1 }) });

type Answer = { choices: { message: { content: string } }[]; service: { receipt: { payload: string } } };
const receiptOf = (a: Answer) => JSON.parse(Buffer.from(a.service.receipt.payload, 'base64').toString()) as Record<string, unknown>;

test('a model read into memory (the default): its file cut short and written over in place, the node serves on, the same answers under the same hash', async () => {
  const first = (await (await chat('tiny/copy')).json()) as Answer;
  const file = path.join(dir, 'copy.gguf');
  const size = fs.statSync(file).size;
  fs.truncateSync(file, 0); // what `cp other.gguf copy.gguf` does first: a mapped model dies of SIGBUS on its next token
  const cut = await chat('tiny/copy');
  expect(cut.status).toBe(200);
  const during = (await cut.json()) as Answer;
  fs.writeFileSync(file, crypto.randomBytes(size)); // (other bytes, the same size)
  const after = (await (await chat('tiny/copy')).json()) as Answer;
  for (const a of [during, after]) {
    expect(a.choices[0]!.message.content).toBe(first.choices[0]!.message.content);
    const [r, r0] = [receiptOf(a), receiptOf(first)];
    expect([r.model_sha256, r.usage]).toEqual([r0.model_sha256, r0.usage]); // (response_sha256 covers the request id too)
  }
  const status = (await (await fetch(`${node.opsUrl}/status`)).json()) as { models: { id: string; accepting: boolean }[] };
  expect(status.models.find((m) => m.id === 'tiny/copy')!.accepting).toBe(true);
  expect(JSON.stringify(await (await fetch(`${node.opsUrl}/readyz`)).json())).not.toContain('tiny/copy');
}, 60_000);

type Listed = { provider: string; accepting: boolean; capacity?: { models: { id: string; accepting?: boolean }[] } };

test('one mapped model\'s file written over in place: that model is taken off the market, the others are still sold', async () => {
  for (const model of ['tiny/llama', 'tiny/other']) {
    const r = await chat(model);
    expect(r.status, model).toBe(200);
    await r.json();
  }
  fs.appendFileSync(path.join(dir, 'other.gguf'), Buffer.from([0])); // (in place: its size and times change)

  // The next heartbeat carries it: the market lists the provider as accepting, that model as not.
  const listed = async (): Promise<Listed | undefined> => ((await (await fetch(`${url}/v1/providers`)).json()) as Listed[]).find((p) => p.provider === node.providerId);
  await until('the market to hear that tiny/other is not taken', async () => (await listed())?.capacity?.models.find((m) => m.id === 'tiny/other')?.accepting === false, 15_000);
  const p = (await listed())!;
  expect(p.accepting).toBe(true);
  expect(p.capacity!.models.find((m) => m.id === 'tiny/llama')!.accepting).toBeUndefined();

  const status = (await (await fetch(`${node.opsUrl}/status`)).json()) as { accepting: boolean; models: { id: string; accepting: boolean }[] };
  expect(status.accepting).toBe(true);
  expect(Object.fromEntries(status.models.map((m) => [m.id, m.accepting]))).toEqual({ 'tiny/llama': true, 'tiny/other': false, 'tiny/copy': true });
  const ready = await fetch(`${node.opsUrl}/readyz`);
  expect(ready.status).toBe(503);
  expect(JSON.stringify(await ready.json())).toContain('model tiny/other: its file was modified in place');

  // Through the gateway: the changed model has no provider (no ticket used, nothing charged); the other is served.
  const before = await marketTotals(url);
  const [status503, e] = await errorOf(await chat('tiny/other'));
  expect([status503, e.code]).toEqual([503, 'no_provider']);
  expect(e.message).toMatch(/not accepting work for this model now/);
  expect(await marketTotals(url)).toEqual(before);
  const ok = await chat('tiny/llama');
  expect(ok.status).toBe(200);
  await ok.json();

  // The catalog counts no live route of the changed model.
  const models = (await (await fetch(`${gw.url}/models`)).json()) as { data: { id: string; capacity: { slots: number } }[] };
  expect(Object.fromEntries(models.data.map((m) => [m.id, m.capacity.slots]))).toEqual({ 'tiny/llama': 1, 'tiny/other': 0, 'tiny/copy': 1 });
}, 60_000);

test("the market reads a model's `accepting` only as a boolean, and keeps it only when false", async () => {
  const { validateCapacitySnapshot } = await import('../src/market/capacity.ts');
  const snap = (accepting: unknown) => ({ v: 1, provider: 'ab'.repeat(32), at: 1, price_version: 'p1', attestation_tier: 'T1', accepting: true, models: [{ id: 'm', slots: 1, free_slots: 1, queued: 0, queue_limit: 4, context: 512, ...(accepting === undefined ? {} : { accepting }) }] });
  for (const a of [undefined, true, false]) expect(() => validateCapacitySnapshot(snap(a)), String(a)).not.toThrow();
  for (const a of ['no', 0, null]) expect(() => validateCapacitySnapshot(snap(a)), String(a)).toThrow(/models\[0\]\.accepting: expected a boolean/);
});
