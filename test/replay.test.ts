// Audit replay: the requests a node served, re-run from their receipts and bodies, give exactly the
// bytes the receipts hash.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { toBase64, toHex, utf8 } from '../attestation/bytes.ts';
import { serializeEnvelope } from '../attestation/dsse.ts';
import { signPriceList } from '../attestation/price-list.ts';
import { ratesToWire, type ReceiptPayload } from '../attestation/receipt.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { readRequestsFile, replay } from '../src/audit/replay.ts';
import { InferService } from '../src/serve/infer-service.ts';
import { exportLog } from '../src/store/export.ts';
import { runCli } from './helpers/cli-run.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { startServing, TEST_RATES, type Serving } from './helpers/serving.ts';

const market = testKey();
const node = testKey();
let serving: Serving;
// The node's signed price list: its receipts cite this version, and the audit checks them against it.
const prices = signPriceList(node.seed, node.id, [{ model: 'tiny/llama', ...ratesToWire(TEST_RATES) }]);
let service: InferService;
const bodies = new Map<string, Uint8Array>();
const payloads: ReceiptPayload[] = [];

async function serve(endpoint: string, body: object): Promise<void> {
  const bytes = utf8(JSON.stringify(body));
  const t = ticketPayload(node.id, { endpoint, model: 'tiny/llama', price_version: prices.payload.version, body_sha256: toHex(crypto.createHash('sha256').update(bytes).digest()), max_cost_micro_usd: '100000' });
  let trailer: Record<string, unknown> = {};
  await service.handle({ head: { endpoint, ticket: signTicket(market, t) }, body: bytes, signal: new AbortController().signal }, { head: async () => {}, data: async () => {}, trailer: async (x) => void (trailer = x) });
  const v = verifyReceipt(trailer.receipt as string, { provider: node.id });
  if (!v.ok) throw new Error('receipt did not verify');
  bodies.set(t.request_id, bytes);
  payloads.push(v.value.payload);
}

beforeAll(async () => {
  serving = await startServing({ nodeSeed: node.seed, nodeId: node.id, marketId: market.id, contextLength: 2048, priceVersion: prices.payload.version });
  service = serving.service;
  const messages = [{ role: 'user', content: 'hello world' }];
  await serve('chat/completions', { model: 'tiny/llama', messages, max_tokens: 30, seed: 4, temperature: 0.9 });
  await serve('chat/completions', { model: 'tiny/llama', messages, max_tokens: 30, seed: 9, stream: true, stream_options: { include_usage: true } });
  await serve('completions', { model: 'tiny/llama', prompt: 'the quick', max_tokens: 25, temperature: 0 });
  await serve('embeddings', { model: 'tiny/llama', input: ['hello', 'world'] });
  await serve('responses', { model: 'tiny/llama', input: 'hello world', max_output_tokens: 20, seed: 8, stream: true });
  // Output capped by the hold, not by max_tokens: replay must find the same cap.
  const bytes = utf8(JSON.stringify({ model: 'tiny/llama', messages, max_tokens: 500, seed: 1 }));
  const t = ticketPayload(node.id, { endpoint: 'chat/completions', model: 'tiny/llama', price_version: prices.payload.version, body_sha256: toHex(crypto.createHash('sha256').update(bytes).digest()), max_cost_micro_usd: '9' });
  let trailer: Record<string, unknown> = {};
  await service.handle({ head: { endpoint: 'chat/completions', ticket: signTicket(market, t) }, body: bytes, signal: new AbortController().signal }, { head: async () => {}, data: async () => {}, trailer: async (x) => void (trailer = x) });
  const v = verifyReceipt(trailer.receipt as string, { provider: node.id });
  if (v.ok) {
    bodies.set(t.request_id, bytes);
    payloads.push(v.value.payload);
  }
});
afterAll(async () => {
  await serving?.close();
});

const modelPath = () => path.join(serving.dir, 'tiny.gguf');

describe('replay', () => {
  test('every completed request reproduces its response hash', async () => {
    const r = await replay({ receipts: payloads, requests: bodies, modelPath: modelPath(), contextLength: 2048 });
    expect(r.mismatches).toEqual([]);
    expect(r.replayed).toBe(payloads.length);
    expect(r.matched).toBe(payloads.length);
  });

  test('a wrong body, a wrong hash and missing bodies are reported, not crashed on', async () => {
    const [first, second] = payloads;
    const wrongBody = new Map(bodies);
    wrongBody.set(first!.request_id, utf8('{"model":"tiny/llama"}'));
    const forged = { ...second!, response_sha256: '00'.repeat(32) };
    const r = await replay({ receipts: [first!, forged], requests: wrongBody, modelPath: modelPath(), contextLength: 2048 });
    expect(r.mismatches.map((m) => m.reason)).toEqual([expect.stringContaining('request_sha256'), expect.stringContaining('replay gives')]);
    const none = await replay({ receipts: payloads, requests: new Map(), modelPath: modelPath() });
    expect(none).toMatchObject({ replayed: 0, skipped: { 'no request body given': payloads.length } });
  });

  test('seller-node audit --replay on an export', async () => {
    const out = path.join(serving.dir, 'export');
    await serving.log.flush();
    await exportLog(serving.log, out, [{ version: prices.payload.version, text: serializeEnvelope(prices.envelope) }]);
    const requests = path.join(serving.dir, 'requests.jsonl');
    fs.writeFileSync(requests, [...bodies].map(([request_id, b]) => JSON.stringify({ request_id, body: toBase64(b) })).join('\n') + '\n');
    expect(readRequestsFile(requests).size).toBe(bodies.size);
    const ok = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', '2048'], { timeoutMs: 60_000 });
    expect(ok.code).toBe(0);
    expect(ok.stdout).toMatch(new RegExp(`replay\\s+${payloads.length} of ${payloads.length} responses reproduced`));
    fs.writeFileSync(requests, JSON.stringify({ request_id: payloads[0]!.request_id, body: toBase64(utf8('{}')) }) + '\n');
    const bad = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', '2048'], { timeoutMs: 60_000 });
    expect(bad.code).toBe(1);
    expect(bad.stdout).toMatch(/REPLAY MISMATCH at seq 0/);
    const missing = await runCli(['audit', out, '--replay', '--requests', requests]);
    expect(missing.code).toBe(2);
    // Nothing is replayed from an export whose receipts cannot be priced.
    fs.rmSync(path.join(out, 'prices'), { recursive: true });
    const unpriced = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', '2048'], { timeoutMs: 60_000 });
    expect(unpriced.code).toBe(1);
    expect(unpriced.stdout).toMatch(/^FAIL at seq 0, line 1: price_list_missing: .*no prices\/ folder/m);
    expect(unpriced.stdout).not.toMatch(/^replay\s/m);
  });
});
