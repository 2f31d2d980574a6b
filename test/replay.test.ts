// Audit replay: the requests a node served, re-run from their receipts and bodies, give exactly the
// bytes the receipts hash.
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { toBase64, toHex, utf8 } from '../attestation/bytes.ts';
import { serializeEnvelope } from '../attestation/dsse.ts';
import { signPriceList } from '../attestation/price-list.ts';
import { ratesToWire, type ReceiptPayload } from '../attestation/receipt.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { readRequestsFile, replay, replayFault } from '../src/audit/replay.ts';
import { InferService } from '../src/serve/infer-service.ts';
import { exportLog } from '../src/store/export.ts';
import { runCli, STACK_TRACE, type CliResult } from './helpers/cli-run.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { stopProbeChild } from './helpers/probe-child.ts';
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

/** Cancelled streams: the buyer leaves after `writes` writes (a stream reset: later writes fail). */
const cut: ReceiptPayload[] = [];
async function serveCut(endpoint: string, body: object, writes: number): Promise<void> {
  const bytes = utf8(JSON.stringify(body));
  const t = ticketPayload(node.id, { endpoint, model: 'tiny/llama', price_version: prices.payload.version, body_sha256: toHex(crypto.createHash('sha256').update(bytes).digest()), max_cost_micro_usd: '100000' });
  const leaving = new AbortController();
  let written = 0;
  let trailer: Record<string, unknown> = {};
  const data = async () => {
    if (leaving.signal.aborted) throw new Error('stream reset');
    if (++written === writes) leaving.abort();
  };
  await service.handle({ head: { endpoint, ticket: signTicket(market, t) }, body: bytes, signal: leaving.signal }, { head: async () => {}, data, trailer: async (x) => void (trailer = x) });
  const v = verifyReceipt(trailer.receipt as string, { provider: node.id });
  if (!v.ok || v.value.payload.status !== 'cancelled') throw new Error('no cancelled receipt');
  bodies.set(t.request_id, bytes);
  cut.push(v.value.payload);
}

beforeAll(async () => {
  serving = await startServing({ nodeSeed: node.seed, nodeId: node.id, marketId: market.id, contextLength: 2048, priceVersion: prices.payload.version });
  service = serving.service;
  const messages = [{ role: 'user', content: 'hello world' }];
  await serve('chat/completions', { model: 'tiny/llama', messages, max_tokens: 30, seed: 4, temperature: 0.9 });
  await serve('chat/completions', { model: 'tiny/llama', messages, max_tokens: 30, seed: 9, stream: true, stream_options: { include_usage: true } });
  await serve('completions', { model: 'tiny/llama', prompt: 'the quick', max_tokens: 25, temperature: 0 });
  // llama.cpp's samplers, as a buyer sets them: a replay samples the same way.
  await serve('completions', { model: 'tiny/llama', prompt: 'the quick', max_tokens: 25, temperature: 1.3, seed: 12, top_k: 7, min_p: 0.02, repetition_penalty: 1.4 });
  await serve('embeddings', { model: 'tiny/llama', input: ['hello', 'world'] });
  await serve('responses', { model: 'tiny/llama', input: 'hello world', max_output_tokens: 20, seed: 8, stream: true });
  // Buyers who left mid-stream (a chat, a completion, a response), and one before any token.
  await serveCut('chat/completions', { model: 'tiny/llama', messages, max_tokens: 200, seed: 21, stream: true }, 4);
  await serveCut('completions', { model: 'tiny/llama', prompt: 'the quick', max_tokens: 200, seed: 22, temperature: 1, stream: true }, 7);
  await serveCut('responses', { model: 'tiny/llama', input: 'hello world', max_output_tokens: 200, seed: 23, stream: true }, 5);
  await serveCut('chat/completions', { model: 'tiny/llama', messages, max_tokens: 200, seed: 24, stream: true }, 1);
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

/** An export of everything served so far, with the node's price list, in serving.dir/NAME. */
async function exportTo(name: string): Promise<string> {
  const out = path.join(serving.dir, name);
  await serving.log.flush();
  await exportLog(serving.log, out, [{ version: prices.payload.version, text: serializeEnvelope(prices.envelope) }]);
  return out;
}

/** A requests file of these (request_id, body) pairs in serving.dir/NAME. */
function requestsFile(name: string, entries: Iterable<[string, Uint8Array]>): string {
  const file = path.join(serving.dir, name);
  fs.writeFileSync(file, [...entries].map(([request_id, b]) => JSON.stringify({ request_id, body: toBase64(b) })).join('\n') + '\n');
  return file;
}

function expectUsageError(r: CliResult, stderrHas: RegExp, code: number): void {
  expect(r.code, r.stderr).toBe(code);
  expect(r.stderr).toMatch(stderrHas);
  expect(r.stderr).not.toMatch(STACK_TRACE);
  expect(r.stdout).not.toMatch(/^OK/m);
}

describe('replay', () => {
  test('every completed request reproduces its response hash', async () => {
    const r = await replay({ receipts: payloads, requests: bodies, modelPath: modelPath(), contextLength: 2048 });
    expect(r.mismatches).toEqual([]);
    expect(r.replayed).toBe(payloads.length);
    expect(r.matched).toBe(payloads.length);
  });

  test('a cancelled stream: the bytes its receipt hashes are a point of the replayed stream, carrying exactly the tokens billed', async () => {
    expect(cut.map((c) => c.usage.output_tokens > 0)).toEqual([true, true, true, false]);
    const r = await replay({ receipts: cut, requests: bodies, modelPath: modelPath(), contextLength: 2048 });
    expect(r.mismatches).toEqual([]);
    expect(r).toMatchObject({ replayable: cut.length, replayed: cut.length, matched: cut.length });
    // A receipt billing one token more than its bytes carry, or naming bytes the stream never had.
    const [chat, completion] = cut;
    const billed = chat!.usage.output_tokens;
    const overbilled = { ...chat!, usage: { ...chat!.usage, output_tokens: billed + 1 } };
    const forged = { ...completion!, response_sha256: '00'.repeat(32) };
    const bad = await replay({ receipts: [overbilled, forged], requests: bodies, modelPath: modelPath(), contextLength: 2048 });
    expect(bad.mismatches).toEqual([
      { seq: chat!.seq, request_id: chat!.request_id, reason: `cancelled: the bytes response_sha256 names carry ${billed} output tokens, the receipt bills ${billed + 1}`, output_tokens: { receipt: billed + 1, replay: billed } },
      { seq: completion!.seq, request_id: completion!.request_id, reason: `cancelled: no point of the replayed stream hashes to response_sha256 ${'00'.repeat(32)}` },
    ]);
    expect(replayFault(bad)).toMatchObject({ code: 'replay_mismatch' });
    // A whole body cancelled bills the work done when its buyer left: no bytes show it, not replayed.
    const whole = payloads.find((p) => p.endpoint === 'completions')!;
    const skipped = await replay({ receipts: [{ ...whole, status: 'cancelled' }], requests: bodies, modelPath: modelPath() });
    expect(skipped).toMatchObject({ replayable: 0, replayed: 0, skipped: { 'status cancelled': 1 } });
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
    const all = payloads.length + cut.length;
    expect(ok.stdout).toMatch(new RegExp(`replay\\s+${all} of ${all} responses reproduced byte for byte\\nOK \\(\\d+\\.\\d\\d s; replay \\d+\\.\\d\\d s\\)\\n$`));
    expect(ok.stderr).toBe('');
    fs.writeFileSync(requests, JSON.stringify({ request_id: payloads[0]!.request_id, body: toBase64(utf8('{}')) }) + '\n');
    const bad = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', '2048'], { timeoutMs: 60_000 });
    expect(bad.code).toBe(1);
    expect(bad.stdout).toMatch(/REPLAY MISMATCH at seq 0/);
    // The verdict comes after the replay, and nothing reads as a pass.
    expect(bad.stdout).not.toMatch(/^OK/m);
    expect(bad.stdout).toMatch(/\nREPLAY FAILED: 1 given request body does not hash to request_sha256\n$/);
    const missing = await runCli(['audit', out, '--replay', '--requests', requests]);
    expect(missing.code).toBe(2);
    // Nothing is replayed from an export whose receipts cannot be priced.
    fs.rmSync(path.join(out, 'prices'), { recursive: true });
    const unpriced = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', '2048'], { timeoutMs: 60_000 });
    expect(unpriced.code).toBe(1);
    expect(unpriced.stdout).toMatch(/^FAIL at seq 0, line 1: price_list_missing: .*no prices\/ folder/m);
    expect(unpriced.stdout).not.toMatch(/^replay\s/m);
  });

  test('a replay that reproduces nothing although the log holds replayable receipts fails', async () => {
    const out = await exportTo('export-nothing');
    const requests = requestsFile('all.jsonl', bodies);
    const other = path.join(serving.dir, 'other.gguf');
    writeTinyLlama(other, { seed: 2 });
    const otherSha = crypto.createHash('sha256').update(fs.readFileSync(other)).digest('hex');
    const servedSha = payloads[0]!.model_sha256;
    expect(otherSha).not.toBe(servedSha);
    const wrong = await runCli(['audit', out, '--replay', '--model', other, '--requests', requests]);
    expect(wrong.code, wrong.stderr).toBe(1);
    expect(wrong.stdout).not.toMatch(/^OK/m);
    expect(wrong.stdout).toMatch(new RegExp(`^replay\\s+nothing replayed \\(skipped: ${payloads.length + cut.length} another model file\\)\\nREPLAY FAILED: nothing replayed: the model file's sha256 ${otherSha} matches no receipt \\(receipts name ${servedSha}\\)\\n$`, 'm'));
    const j = await runCli(['audit', out, '--replay', '--model', other, '--requests', requests, '--json']);
    expect(j.code).toBe(1);
    const report = JSON.parse(j.stdout) as { ok: boolean; fault: { code: string }; summary?: unknown; replay: { ok: boolean; replayed: number; replayable: number; model_sha256: string; receipt_models: string[] } };
    expect(report).toMatchObject({ ok: false, fault: { code: 'replay_nothing_replayed' }, replay: { ok: false, replayed: 0, replayable: payloads.length + cut.length, model_sha256: otherSha, receipt_models: [servedSha] } });
    expect(report.summary).toBeDefined(); // the log itself passed

    // The right model, but no body for any receipt: the one given is unused, and said so.
    const unknown = requestsFile('unknown.jsonl', [['req-zzz', utf8('{}')]]);
    const none = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', unknown, '--json']);
    expect(none.code).toBe(1);
    expect(none.stderr).toMatch(/^warning: 1 request body matches no receipt in the log \(req-zzz\); it was not replayed$/m);
    expect(JSON.parse(none.stdout)).toMatchObject({ ok: false, fault: { code: 'replay_nothing_replayed', message: expect.stringContaining(`no request body was given for any of the ${payloads.length} completed receipts of this model file; 1 given body matches no receipt`) }, replay: { unused_requests: 1, unused_request_ids: ['req-zzz'] } });
  });

  test('unused request bodies are warned about, capped, and do not fail a replay that reproduced its receipts', async () => {
    const out = await exportTo('export-unused');
    const [first] = payloads;
    const extra: [string, Uint8Array][] = Array.from({ length: 7 }, (_, i) => [`req-unknown-${i}`, utf8('{}')]);
    const requests = requestsFile('some.jsonl', [[first!.request_id, bodies.get(first!.request_id)!], ...extra]);
    const r = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', '2048'], { timeoutMs: 60_000 });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`^replay\\s+1 of 1 responses reproduced byte for byte \\(skipped: ${payloads.length - 1 + cut.length} no request body given\\)\\nOK \\(`, 'm'));
    expect(r.stderr).toMatch(/^warning: 7 request bodies match no receipt in the log \(req-unknown-0, req-unknown-1, req-unknown-2, req-unknown-3, req-unknown-4, …\); they were not replayed$/m);
  });

  test('a replay answered context_length_exceeded hints that --context may be too small', async () => {
    const out = await exportTo('export-context');
    const requests = requestsFile('ctx.jsonl', bodies);
    const r = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', '16'], { timeoutMs: 60_000 });
    expect(r.code, r.stderr).toBe(1);
    expect(r.stdout).toMatch(/^REPLAY MISMATCH at seq \d+ \(request [^)]+\): replay answered 400 \{"code":"context_length_exceeded".*\} \(hint: is --context 16 smaller than the node's context\?\)$/m);
    expect(r.stdout).toMatch(/\nREPLAY FAILED: \d+ of \d+ replayed responses? differs? from (its receipt|their receipts)\n$/);
    expect(r.stdout).not.toMatch(/^OK/m);
  });

  test('a replay that ends sooner than its receipt (a request without max_tokens, too small a --context) says so and hints at --context', async () => {
    // Run last-but-one in this file's order: it serves one more request (later exports include it).
    const body = { model: 'tiny/llama', prompt: 'the quick', temperature: 0 };
    await serve('completions', body);
    const served = payloads.at(-1)!;
    expect(served.usage.output_tokens).toBeGreaterThan(40); // (the context left room for them)
    const out = await exportTo('export-shorter');
    const requests = requestsFile('shorter.jsonl', [[served.request_id, bodies.get(served.request_id)!]]);
    const context = served.usage.input_tokens + 20;
    const r = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', String(context)], { timeoutMs: 60_000 });
    expect(r.code, r.stderr).toBe(1);
    expect(r.stdout).toMatch(new RegExp(`^REPLAY MISMATCH at seq ${served.seq} \\(request ${served.request_id}\\): response_sha256 is ${served.response_sha256}, replay gives [0-9a-f]{64} \\(20 output tokens, the receipt ${served.usage.output_tokens}\\) \\(hint: is --context ${context} smaller than the node's context\\?\\)$`, 'm'));
    // At the node's context it reproduces.
    const ok = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', '2048'], { timeoutMs: 60_000 });
    expect(ok.code, ok.stdout + ok.stderr).toBe(0);
    // A response that differs at the same length gets no hint: the context is not why.
    const forged = await replay({ receipts: [{ ...served, response_sha256: '00'.repeat(32) }], requests: bodies, modelPath: modelPath(), contextLength: 2048 });
    expect(forged.mismatches).toEqual([{ seq: served.seq, request_id: served.request_id, reason: expect.stringMatching(/^response_sha256 is 0{64}, replay gives [0-9a-f]{64}$/) }]);
  });

  test('a log with nothing replayable passes; a mismatch or nothing replayed fails', async () => {
    // (whole bodies: a cancelled stream is replayed)
    const cancelled = payloads.filter((p) => !JSON.parse(Buffer.from(bodies.get(p.request_id)!).toString('utf8')).stream).map((p) => ({ ...p, status: 'cancelled' as const }));
    const idle = await replay({ receipts: cancelled, requests: bodies, modelPath: modelPath() });
    expect(idle).toMatchObject({ replayable: 0, replayed: 0, skipped: { 'status cancelled': cancelled.length } });
    expect(replayFault(idle)).toBeUndefined();
    const nothing = await replay({ receipts: payloads, requests: new Map(), modelPath: modelPath() });
    expect(replayFault(nothing)).toMatchObject({ code: 'replay_nothing_replayed' });
    const forged = await replay({ receipts: [{ ...payloads[0]!, response_sha256: '00'.repeat(32) }], requests: bodies, modelPath: modelPath(), contextLength: 2048 });
    expect(replayFault(forged)).toEqual({ code: 'replay_mismatch', message: '1 of 1 replayed response differs from its receipt' });
  });

  test('a model whose load and run in a child process outlasts --probe-timeout is refused, saying how to allow a slower load', async () => {
    const out = await exportTo('export-slow');
    const requests = requestsFile('slow.jsonl', bodies);
    const stopped = stopProbeChild(modelPath());
    const r = await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--context', '2048', '--probe-timeout', '1'], { timeoutMs: 60_000 });
    await stopped;
    expectUsageError(r, new RegExp(`^seller-node: ${modelPath()}: llama\\.cpp did not load and run it within 1 s in a child process: the node would hang on it \\(--probe-timeout S allows a slower load\\)$`, 'm'), 1);
  });

  test('replay options without --replay, --replay without its files, and unreadable files are clean errors', async () => {
    const out = await exportTo('export-usage');
    const requests = requestsFile('usage.jsonl', bodies);
    expectUsageError(await runCli(['audit', out, '--model', modelPath()]), /^seller-node: --model is only used with --replay$/m, 2);
    expectUsageError(await runCli(['audit', out, '--requests', requests]), /^seller-node: --requests is only used with --replay$/m, 2);
    expectUsageError(await runCli(['audit', out, '--context', '2048']), /^seller-node: --context is only used with --replay$/m, 2);
    expectUsageError(await runCli(['audit', out, '--probe-timeout', '60']), /^seller-node: --probe-timeout is only used with --replay$/m, 2);
    expectUsageError(await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', requests, '--probe-timeout', '0']), /--probe-timeout/, 2);
    expectUsageError(await runCli(['audit', out, '--replay', '--model', modelPath()]), /--replay needs --model FILE and --requests FILE \(missing --requests\)/, 2);
    expectUsageError(await runCli(['audit', out, '--replay', '--requests', requests]), /--replay needs --model FILE and --requests FILE \(missing --model\)/, 2);
    const nope = path.join(serving.dir, 'no-such.jsonl');
    expectUsageError(await runCli(['audit', out, '--replay', '--model', modelPath(), '--requests', nope]), new RegExp(`^seller-node: cannot read --requests ${nope}: not found$`, 'm'), 1);
    const noModel = path.join(serving.dir, 'no-such.gguf');
    expectUsageError(await runCli(['audit', out, '--replay', '--model', noModel, '--requests', requests]), new RegExp(`^seller-node: cannot read --model ${noModel}: not found$`, 'm'), 1);
    expectUsageError(await runCli(['audit', out, '--replay', '--model', serving.dir, '--requests', requests]), /^seller-node: cannot read --model .*: it is a folder$/m, 1);
    const fifo = path.join(serving.dir, 'model.fifo');
    execFileSync('mkfifo', [fifo]);
    expectUsageError(await runCli(['audit', out, '--replay', '--model', fifo, '--requests', requests], { timeoutMs: 20_000 }), new RegExp(`^seller-node: cannot read --model ${fifo}: not a regular file \\(a FIFO\\); a model file is read twice, at random$`, 'm'), 1);
  });
});
