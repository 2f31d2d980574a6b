// The buyer gateway end to end: a real development marketplace, a real node (startNode on the tiny
// model, registering itself with the market) and the gateway, driven by the official `openai` npm
// client. Every receipt verifies against the node's key, token counts are the runtime tokenizer's,
// costs are the price arithmetic, an aborted stream leaves a `cancelled` receipt, and bad input is
// refused with the spec's error envelope.
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { serializeEnvelope, type DsseEnvelope } from '../attestation/dsse.ts';
import { computeCost, formatUsd } from '../attestation/money.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { verifyRequestContract } from '../attestation/request-contract.ts';
import { TEXT_REQUEST_CONTRACT } from '../src/serve/request-contract.ts';
import { sha256Hex } from '../attestation/hash.ts';
import { parseConfig } from '../src/config.ts';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import { checkReceipt } from '../src/gateway/receipt-check.ts';
import type { RequestRecord } from '../src/gateway/records.ts';
import { createKeyFile } from '../src/identity.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { startNode, type RunningNode } from '../src/node.ts';
import { waitFor, waitForListed } from './helpers/wait.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { errorOf, gatewayRecord, marketReceipt as marketReceiptAt, settledRecord, type MarketReceipt } from './helpers/gateway-reads.ts';

const RATES = { input_per_mtok: 150_000n, output_per_mtok: 600_000n };
const MODEL = 'tiny/llama';
const CONTEXT = 1024;

let dir: string;
let market: Market;
let marketUrl: string;
let node: RunningNode;
let gw: Gateway;
let client: OpenAI;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-e2e-'));
  market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)), heartbeatIntervalMs: 1000 });
  marketUrl = (await market.listen()).url;
  writeTinyLlama(path.join(dir, 'tiny.gguf'));
  createKeyFile(path.join(dir, 'node.key'));
  const yaml = tinyNodeConfigYaml({ publicKey: market.publicKey, marketUrl, context: CONTEXT, slots: 2, receipts: '{ signer_threads: 1, checkpoint_interval_ms: 0 }', logLevel: 'error' });
  node = await startNode(parseConfig(yaml, dir));
  // The node registers itself with the market (marketplace.url); wait until the market lists it.
  await waitForListed(marketUrl, [node.providerId]);
  gw = await createGateway({ market: marketUrl, port: 0 });
  client = new OpenAI({ baseURL: gw.url, apiKey: 'sk-svc-v1-test', maxRetries: 0 });
});

afterAll(async () => {
  await gw?.close(1000);
  await node?.stop(1000);
  await market?.close();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

/** The exact token count the node's runtime gives (POST /v1/count_tokens through the gateway). */
async function countTokens(body: object): Promise<number> {
  const r = await fetch(`${gw.url}/count_tokens`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, ...body }) });
  expect(r.status).toBe(200);
  return ((await r.json()) as { count: number }).count;
}

function costUsd(input: number, output: number): string {
  return formatUsd(computeCost({ input_tokens: input, output_tokens: output }, RATES));
}

/** Verifies a receipt envelope against the node's key and returns its payload. */
function verified(envelope: unknown) {
  const v = verifyReceipt(serializeEnvelope(envelope as DsseEnvelope), { provider: node.providerId });
  if (!v.ok) throw new Error(`receipt does not verify: ${v.error.code}: ${v.error.message}`);
  return v.value.payload;
}

const record = (id: string): Promise<RequestRecord> => gatewayRecord(gw.url, id);

/** The market's own copy of the settled receipt. */
/** The market's receipt for a request id, which must be there. */
async function marketReceipt(id: string): Promise<MarketReceipt> {
  const r = await marketReceiptAt(marketUrl, id);
  if (!r) throw new Error(`the market has no receipt for ${id}`);
  return r;
}

const messages = [{ role: 'user' as const, content: 'hello world, the cat sat on the mat' }];

describe('seller-node gateway (openai client → gateway → market ticket → node over libp2p)', () => {
  test('GET /v1/models lists the live provider\'s model', async () => {
    const page = await client.models.list();
    const ids = page.data.map((m) => m.id);
    expect(ids).toContain(MODEL);
    expect(page.data.find((m) => m.id === MODEL)).toMatchObject({ object: 'model', context_length: CONTEXT, providers: 1 });
    const one = await fetch(`${gw.url}/models/by-id?id=${encodeURIComponent(MODEL)}`);
    expect(one.status).toBe(200);
    // The node's signed request contract, its applied attributes, and its capacity (spec: "Model").
    const entry = (await one.json()) as { request_contracts: { provider: string; version: string; contract: DsseEnvelope }[]; supported_parameters: Record<string, string[]>; capacity: Record<string, number> };
    expect(entry.request_contracts.map((c) => c.provider)).toEqual([node.providerId]);
    const contract = verifyRequestContract(entry.request_contracts[0]!.contract, { provider: node.providerId });
    expect(contract.ok && contract.value.models).toEqual([MODEL]);
    expect(contract.ok && contract.value.endpoints).toEqual(TEXT_REQUEST_CONTRACT);
    expect(entry.supported_parameters.CHAT).toEqual(expect.arrayContaining(['seed', 'temperature', 'top_k', 'min_p', 'repetition_penalty', 'stop']));
    expect(entry.capacity).toMatchObject({ slots: expect.any(Number), free_slots: expect.any(Number), queued: 0 });
    expect(entry.capacity.slots).toBeGreaterThan(0);
    for (const p of [MODEL, encodeURIComponent(MODEL)]) expect((await fetch(`${gw.url}/models/${p}`)).status, p).toBe(200);
    // A literal "%" in an id is one character, decoded once: an unknown model, never a server error.
    for (const p of ['a%25', '%25E0%25A4', 'tiny%252Fllama']) {
      const r = await fetch(`${gw.url}/models/${p}`);
      expect([r.status, ((await r.json()) as { error: { code: string } }).error.code], p).toEqual([404, 'model_not_found']);
    }
    await expect(client.models.retrieve('nobody/nothing')).rejects.toMatchObject({ status: 404 });
    // The spec's price fields (micro-USD) and its query: filtered, paged, 400 for a bad filter.
    expect(page.data.find((m) => m.id === MODEL)).toMatchObject({ pricing: { prompt_per_million_au: '150000', completion_per_million_au: '600000', representative_request_au: '750' } });
    const get = async (q: string) => {
      const r = await fetch(`${gw.url}/models${q}`);
      return { status: r.status, body: (await r.json()) as { data?: { id: string }[]; error?: { code: string; message: string } } };
    };
    expect((await get('?max_input_price_per_million_usd=0.15&min_context_tokens=' + CONTEXT)).body.data!.map((m) => m.id)).toContain(MODEL);
    expect((await get('?max_input_price_per_million_usd=0.149999')).body.data!.map((m) => m.id)).not.toContain(MODEL);
    for (const q of ['?limit=0', '?limit=1&limit=2', '?attestation_tier=1&min_attestation_tier=1', '?sort=bogus']) {
      expect((await get(q)).body.error, q).toMatchObject({ code: 'invalid_request' });
      expect((await get(q)).status, q).toBe(400);
    }
    const stats = await get(`/by-id/stats?id=${encodeURIComponent(MODEL)}`);
    expect([stats.status, stats.body.error?.code]).toEqual([501, 'not_supported']);
  });

  test('chat completion: body + usage.cost + a verified receipt, settled with the market and recorded', async () => {
    const { data, response } = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, seed: 3 }).withResponse();
    const id = response.headers.get('x-request-id')!;
    expect(id).toMatch(/^req-/);
    const body = data as typeof data & { usage: { cost: string }; service: { request_id: string; receipt: unknown } };
    expect(body.object).toBe('chat.completion');
    expect(body.choices[0]!.message.role).toBe('assistant');
    expect(body.service.request_id).toBe(id);
    const inTokens = await countTokens({ messages });
    expect(body.usage.prompt_tokens).toBe(inTokens);
    expect(body.usage.completion_tokens).toBeGreaterThan(0);
    expect(body.usage.completion_tokens).toBeLessThanOrEqual(16);
    expect(body.usage.total_tokens).toBe(inTokens + body.usage.completion_tokens);
    expect(body.usage.cost).toBe(costUsd(inTokens, body.usage.completion_tokens));
    const p = verified(body.service.receipt);
    expect(p).toMatchObject({ request_id: id, status: 'completed', provider: node.providerId, model: MODEL, endpoint: 'chat/completions' });
    expect(p.usage).toEqual({ input_tokens: inTokens, output_tokens: body.usage.completion_tokens });
    expect(formatUsd(BigInt(p.cost_micro_usd))).toBe(body.usage.cost);

    const rec = await record(id);
    expect(rec).toMatchObject({ request_id: id, status: 'completed', provider: node.providerId, cost: body.usage.cost, settled: true });
    expect(rec.usage).toEqual({ prompt_tokens: inTokens, completion_tokens: body.usage.completion_tokens, total_tokens: body.usage.total_tokens });
    expect(rec.receipt).toEqual(body.service.receipt);
    const m = await marketReceipt(id);
    expect(m).toMatchObject({ status: 'completed', cost_micro_usd: p.cost_micro_usd });
    expect(m.receipt).toBe(serializeEnvelope(body.service.receipt as DsseEnvelope));

    // The same receipt checked as the gateway does, but for another body: refused.
    const line = serializeEnvelope(body.service.receipt as DsseEnvelope);
    const exp = { provider: node.providerId, requestId: id, ticketId: p.ticket_id, endpoint: 'chat/completions', model: MODEL, bodySha256: p.request_sha256, holdMicroUsd: p.hold_micro_usd, priceVersion: p.price.version, rates: p.price.rates };
    expect(checkReceipt(line, exp).ok).toBe(true);
    // Billed under another price version, or at rates other than the ticket's: refused.
    expect(checkReceipt(line, { ...exp, priceVersion: 'other' })).toMatchObject({ ok: false, message: expect.stringMatching(/price\.version/) });
    expect(checkReceipt(line, { ...exp, rates: { ...p.price.rates, output_per_mtok: '1' } })).toMatchObject({ ok: false, message: expect.stringMatching(/rates/) });
    expect(checkReceipt(line, { ...exp, bodySha256: '0'.repeat(64) })).toMatchObject({ ok: false, message: expect.stringMatching(/request_sha256/) });
    expect(checkReceipt(line, { ...exp, provider: market.publicKey })).toMatchObject({ ok: false });
  });

  test('chat stream without include_usage: live SSE relay, no usage chunk, receipt settled', async () => {
    const { data: stream, response } = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, seed: 4, stream: true }).withResponse();
    expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(response.headers.get('x-service-stream-mode')).toBe('live');
    const id = response.headers.get('x-request-id')!;
    let text = '';
    let chunks = 0;
    let last: (OpenAI.ChatCompletionChunk & { service?: { request_id: string; receipt: DsseEnvelope } }) | undefined;
    for await (const chunk of stream) {
      chunks++;
      expect(chunk.usage ?? null).toBeNull();
      text += chunk.choices[0]?.delta.content ?? '';
      last = chunk;
    }
    expect(chunks).toBeGreaterThan(2);
    // The client hands on the finish chunk's service, the receipt in it.
    expect(last!.choices[0]!.finish_reason).not.toBeNull();
    expect(last!.service!.request_id).toBe(id);
    const rec = await record(id);
    expect(rec.status).toBe('completed');
    expect(rec.settled).toBe(true);
    expect(verified(last!.service!.receipt)).toEqual(verified(rec.receipt));
    const p = verified(rec.receipt);
    expect(p.usage.input_tokens).toBe(await countTokens({ messages }));
    expect(p.usage.output_tokens).toBeGreaterThan(0);
    expect(rec.cost).toBe(costUsd(p.usage.input_tokens, p.usage.output_tokens));
    expect(typeof text).toBe('string');
  });

  test('chat stream with include_usage: exactly one usage chunk, before [DONE], matching the receipt', async () => {
    const { data: stream, response } = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, seed: 5, stream: true, stream_options: { include_usage: true } }).withResponse();
    const id = response.headers.get('x-request-id')!;
    const usages: (OpenAI.CompletionUsage & { cost?: string })[] = [];
    for await (const chunk of stream) if (chunk.usage) usages.push(chunk.usage);
    expect(usages).toHaveLength(1);
    const u = usages[0]!;
    expect(u.prompt_tokens).toBe(await countTokens({ messages }));
    expect(u.cost).toBe(costUsd(u.prompt_tokens, u.completion_tokens));
    const rec = await record(id);
    const p = verified(rec.receipt);
    expect(p.usage).toEqual({ input_tokens: u.prompt_tokens, output_tokens: u.completion_tokens });
    expect(rec.cost).toBe(u.cost);
  });

  test('a conversation through the official client\'s own helpers: the answer stream().finalMessage() gives, sent back as the next turn\'s history, is taken', async () => {
    const first = client.chat.completions.stream({ model: MODEL, messages, max_tokens: 8, seed: 2 });
    const answer = await first.finalMessage(); // (the client adds refusal and parsed to it)
    expect(answer).toMatchObject({ role: 'assistant', refusal: null, parsed: null });
    const next = await client.chat.completions.create({ model: MODEL, messages: [...messages, answer, { role: 'user', content: 'and then?' }], max_tokens: 8, seed: 2 });
    expect(next.choices[0]!.message.role).toBe('assistant');
    expect(next.usage!.prompt_tokens).toBeGreaterThan(0);
  });

  test('a responses conversation through the official client\'s stream helper: finalResponse()\'s output, sent back as input, is taken', async () => {
    const first = client.responses.stream({ model: MODEL, input: 'hello world', max_output_tokens: 8 });
    const answer = await first.finalResponse(); // (the client adds parsed: null to each output_text part)
    expect(answer.output[0]).toMatchObject({ type: 'message', content: [{ type: 'output_text', parsed: null }] });
    const next = await client.responses.create({ model: MODEL, input: [{ role: 'user', content: 'hello world' }, ...(answer.output as never[]), { role: 'user', content: 'and then?' }], max_output_tokens: 8 });
    expect(next.status).toMatch(/^(completed|incomplete)$/);
    expect(next.usage!.input_tokens).toBeGreaterThan(0);
  });

  test('legacy completion: body, usage.cost as the arithmetic, a verified receipt', async () => {
    const prompt = 'the quick brown fox';
    const res = (await client.completions.create({ model: MODEL, prompt, max_tokens: 10, seed: 6 })) as OpenAI.Completion & { usage: { cost: string }; service: { request_id: string; receipt: unknown } };
    expect(res.object).toBe('text_completion');
    expect(res.usage.cost).toBe(costUsd(res.usage.prompt_tokens, res.usage.completion_tokens));
    const p = verified(res.service.receipt);
    expect(p).toMatchObject({ endpoint: 'completions', status: 'completed', request_id: res.service.request_id });
    expect(p.usage).toEqual({ input_tokens: res.usage.prompt_tokens, output_tokens: res.usage.completion_tokens });
    expect((await record(res.service.request_id)).settled).toBe(true);
  });

  // count_tokens answers exactly what a completion bills: the runtime's input tokens, BOS included.
  test('legacy completion: prompt_tokens equal count_tokens({prompt})', async () => {
    const prompt = 'the quick brown fox';
    const res = await client.completions.create({ model: MODEL, prompt, max_tokens: 4, seed: 6 });
    expect(res.usage!.prompt_tokens).toBe(await countTokens({ prompt }));
  });

  test('responses (plain and streamed with the responses event protocol) through the official client', async () => {
    const res = (await client.responses.create({ model: MODEL, input: 'hello world', max_output_tokens: 16 })) as OpenAI.Responses.Response & { usage: { cost: string; input_tokens: number; output_tokens: number }; service: { request_id: string; receipt: unknown } };
    expect(res.object).toBe('response');
    expect(typeof res.output_text).toBe('string');
    const p = verified(res.service.receipt);
    expect(p).toMatchObject({ endpoint: 'responses', status: 'completed', usage: { input_tokens: res.usage.input_tokens, output_tokens: res.usage.output_tokens } });
    expect(res.usage.cost).toBe(costUsd(res.usage.input_tokens, res.usage.output_tokens));
    const stream = await client.responses.create({ model: MODEL, input: 'hello world', max_output_tokens: 16, stream: true });
    const types: string[] = [];
    let deltas = '';
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') deltas += ev.delta;
    }
    expect(types[0]).toBe('response.created');
    expect(['response.completed', 'response.incomplete']).toContain(types.at(-1));
    expect(deltas.length).toBeGreaterThan(0);
  });

  test('estimates: the provider\'s own count, priced at its rates; execution with the estimate is capped by it', async () => {
    const messages = [{ role: 'user' as const, content: 'hello world' }];
    const body = { model: MODEL, messages, max_tokens: 20, seed: 3 };
    const r = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: 'CHAT', body }) });
    expect(r.status).toBe(200);
    const est = (await r.json()) as { estimate_id: string; input_tokens: number; max_output_tokens: number; max_hold: string; expected_cost: string; price_version: string; can_start: { provider: string } };
    expect(est.estimate_id.length).toBeGreaterThanOrEqual(16);
    expect(est.input_tokens).toBe(await countTokens({ messages }));
    expect(est.max_output_tokens).toBe(20);
    expect(est.max_hold).toBe(costUsd(est.input_tokens, 20));
    expect(est.can_start.provider).toBe(node.providerId);
    // Executing the very same body with the estimate: the ticket's hold is the estimate's maximum.
    const run = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-estimate': est.estimate_id }, body: JSON.stringify(body) });
    expect(run.status).toBe(200);
    const done = (await run.json()) as { service: { receipt: DsseEnvelope } };
    const p = verified(done.service.receipt);
    expect(formatUsd(BigInt(p.hold_micro_usd))).toBe(est.max_hold);
    // The same request with its JSON spaced and ordered otherwise is still the estimated one.
    const respaced = `{ "seed": 3, "max_tokens": 20, "messages": [ { "content": "hello world", "role": "user" } ], "model": "${MODEL}" }`;
    const again = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-estimate': est.estimate_id }, body: respaced });
    expect(again.status).toBe(200);
    await again.json();
    // Other routing controls than the estimate's: refused naming the estimate.
    const rerouted = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-estimate': est.estimate_id, 'x-service-min-ctx': '100' }, body: JSON.stringify(body) });
    const rr = (await rerouted.json()) as { error: { code: string; message: string } };
    expect([rerouted.status, rr.error.code]).toEqual([400, 'invalid_request']);
    expect(rr.error.message).toMatch(/X-Service-Estimate.*other routing controls/);
    // Another body under the estimate, an unknown estimate, and a cost cap on /estimates are refused.
    const other = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-estimate': est.estimate_id }, body: JSON.stringify({ ...body, seed: 4 }) });
    expect([other.status, ((await other.json()) as { error: { code: string } }).error.code]).toEqual([400, 'invalid_request']);
    const unknown = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-estimate': 'est_00000000000000000000' }, body: JSON.stringify(body) });
    expect(unknown.status).toBe(400);
    const capped = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-max-cost-usd': '1' }, body: JSON.stringify({ endpoint: 'CHAT', body }) });
    expect(capped.status).toBe(400);
    for (const name of ['PICTURES', 'constructor', '__proto__', 'toString']) {
      const badEndpoint = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: name, body }) });
      expect(badEndpoint.status, name).toBe(400);
      expect(((await badEndpoint.json()) as { error: { message: string } }).error.message).toMatch(/^endpoint:/);
    }
    const badBody = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: 'CHAT', body: { model: MODEL } }) });
    expect(((await badBody.json()) as { error: { message: string } }).error.message).toMatch(/^body\.messages:/);
    // As at the node: max_tokens beyond the context is refused, not cut down to fit.
    const tooLong = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: 'CHAT', body: { ...body, max_tokens: 1 << 20 } }) });
    expect([tooLong.status, ((await tooLong.json()) as { error: { code: string } }).error.code]).toEqual([400, 'context_length_exceeded']);
    // The representative-price ceiling judges the model's price for 1,000 + 1,000 tokens, not this request.
    const pricey = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-max-representative-request-price-usd': '0.000001' }, body: JSON.stringify({ endpoint: 'CHAT', body }) });
    expect([pricey.status, ((await pricey.json()) as { error: { code: string } }).error.code]).toEqual([403, 'price_ceiling_exceeded']);
    // A body JSON parses but RFC 8785 cannot canonicalise (a number beyond float64, a lone surrogate) is estimated too.
    for (const odd of ['1e400', '"\\ud800"']) {
      const r2 = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: `{"endpoint":"CHAT","body":{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"metadata":{"x":${odd}}}}` });
      expect([odd, r2.status]).toEqual([odd, 200]);
      await r2.json();
    }
  });

  test('estimates for embeddings: each input counted on its own; one longer than the context is refused, as the node refuses it', async () => {
    const estimate = (input: string[]) => fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: 'EMBEDDINGS', body: { model: MODEL, input } }) });
    const fits = ['hello world', 'the cat sat'];
    const r = await estimate(fits);
    expect(r.status).toBe(200);
    const est = (await r.json()) as { input_tokens: number; max_output_tokens: number; max_hold: string };
    const counts = (await Promise.all(fits.map((prompt) => countTokens({ prompt })))).reduce((a, b) => a + b, 0);
    expect(est).toMatchObject({ input_tokens: counts, max_output_tokens: 0, max_hold: costUsd(counts, 0) });

    const long = 'the quick brown fox jumps over the lazy dog '.repeat(CONTEXT);
    expect(await countTokens({ prompt: long })).toBeGreaterThan(CONTEXT);
    const over = await estimate(['hello world', long]);
    expect([over.status, ((await over.json()) as { error: { code: string } }).error.code]).toEqual([400, 'context_length_exceeded']);
    const run = await fetch(`${gw.url}/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, input: ['hello world', long] }) });
    expect([run.status, ((await run.json()) as { error: { code: string } }).error.code]).toEqual([400, 'context_length_exceeded']);
  });

  test('estimates: a prompt that fills the context, without max_tokens, is refused as the node refuses it', async () => {
    // A prompt of exactly CONTEXT tokens by the node's tokenizer: one byte token per character after a fixed prefix.
    const prefix = (await countTokens({ prompt: '~'.repeat(20) })) - 20;
    const prompt = '~'.repeat(CONTEXT - prefix);
    expect(await countTokens({ prompt })).toBe(CONTEXT);
    const est = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: 'COMPLETIONS', body: { model: MODEL, prompt } }) });
    expect([est.status, ((await est.json()) as { error: { code: string } }).error.code]).toEqual([400, 'context_length_exceeded']);
    const run = await fetch(`${gw.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt }) });
    expect([run.status, ((await run.json()) as { error: { code: string } }).error.code]).toEqual([400, 'context_length_exceeded']);
    // One token shorter: room for one token of output, at both.
    const fits = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: 'COMPLETIONS', body: { model: MODEL, prompt: prompt.slice(1) } }) });
    expect(fits.status).toBe(200);
    expect(((await fits.json()) as { max_output_tokens: number }).max_output_tokens).toBe(1);
    const ran = await fetch(`${gw.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: prompt.slice(1) }) });
    expect(ran.status).toBe(200);
    const usage = ((await ran.json()) as { usage: { prompt_tokens: number; completion_tokens: number } }).usage;
    expect(usage.prompt_tokens).toBe(CONTEXT - 1);
    expect(usage.completion_tokens).toBeLessThanOrEqual(1);
  });

  test('estimates for a batch of embeddings larger than the counts run at once: every input counted, the total exact', async () => {
    const input = Array.from({ length: 21 }, (_, i) => `input number ${i} ${'x'.repeat(i)}`);
    const r = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: 'EMBEDDINGS', body: { model: MODEL, input } }) });
    expect(r.status).toBe(200);
    const est = (await r.json()) as { input_tokens: number; max_hold: string };
    let total = 0;
    for (const prompt of input) total += await countTokens({ prompt });
    expect(est).toMatchObject({ input_tokens: total, max_hold: costUsd(total, 0) });
  });

  test('bad input on the estimate and record routes: a clear error each, nothing recorded or charged', async () => {
    const totals = async () => (await (await fetch(`${marketUrl}/v1/totals`)).json()) as { receipts: number; cost_micro_usd: string };
    const before = await totals();
    const records = gw.records.size;
    const post = (path: string, body: string, headers: Record<string, string> = {}) => fetch(`${gw.url}/${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
    const body = { model: MODEL, messages: [{ role: 'user', content: 'hello world' }], max_tokens: 4 };
    // On /estimates: a body that is not JSON, an ask whose body is not an object, an estimate header.
    const [s1, e1] = await errorOf(await post('estimates', '{"endpoint": "CHAT", '));
    expect([s1, e1.code, e1.message]).toEqual([400, 'invalid_request', expect.stringMatching(/^body:/)]);
    const [s2, e2] = await errorOf(await post('estimates', JSON.stringify({ endpoint: 'CHAT', body: [body] })));
    expect([s2, e2.code, e2.message]).toEqual([400, 'invalid_request', expect.stringMatching(/^body: expected the request body/)]);
    const [s3, e3] = await errorOf(await post('estimates', JSON.stringify({ endpoint: 'CHAT', body }), { 'x-service-estimate': 'est_00000000000000000000' }));
    expect([s3, e3.code, e3.message]).toEqual([400, 'invalid_request', expect.stringMatching(/^X-Service-Estimate:/)]);
    // A body nested deeper than JSON.stringify's stack: 400, unparsed, not the gateway failing.
    const deep = `{"endpoint":"CHAT","body":{"model":"${MODEL}","messages":[{"role":"user","content":"x"}],"metadata":${'['.repeat(200_000)}${']'.repeat(200_000)}}}`;
    const [s9, e9] = await errorOf(await post('estimates', deep));
    expect([s9, e9.code, e9.message]).toEqual([400, 'invalid_request', 'body: nests objects and arrays more than 512 deep']);
    // A leading byte-order mark is read past, as the node reads a paid body.
    expect((await post('estimates', '\uFEFF' + JSON.stringify({ endpoint: 'CHAT', body }))).status).toBe(200);
    // An estimate used for another endpoint, or another model, than it was made for.
    const est = (await (await post('estimates', JSON.stringify({ endpoint: 'CHAT', body }))).json()) as { estimate_id: string };
    const [s4, e4] = await errorOf(await post('completions', JSON.stringify({ model: MODEL, prompt: 'hello world', max_tokens: 4 }), { 'x-service-estimate': est.estimate_id }));
    expect([s4, e4.code, e4.message]).toEqual([400, 'invalid_request', expect.stringMatching(/another request/)]);
    const [s5, e5] = await errorOf(await post('chat/completions', JSON.stringify({ ...body, model: 'other/model' }), { 'x-service-estimate': est.estimate_id }));
    expect([s5, e5.code]).toEqual([400, 'invalid_request']);
    // GET /v1/requests/{id}: a malformed id, an unknown one; and a route that does not exist.
    const [s6, e6] = await errorOf(await fetch(`${gw.url}/requests/${encodeURIComponent('bad id/../x')}`));
    expect([s6, e6.code]).toEqual([400, 'invalid_request']);
    const [s7, e7] = await errorOf(await fetch(`${gw.url}/requests/req-never-made`));
    expect([s7, e7.code]).toEqual([404, 'request_not_found']);
    const [s8, e8] = await errorOf(await fetch(`${gw.url}/images/generations/nothing`, { method: 'POST', body: '{}' }));
    expect([s8, e8.code, e8.message]).toEqual([404, 'not_found', 'no route POST /v1/images/generations/nothing']);
    // The spec's routes this gateway does not serve: 501 not_supported, saying what is missing.
    for (const [method, route, why] of [
      ['POST', 'images/generations', /^POST \/v1\/images\/generations: this gateway does not serve it: media jobs are not sold/],
      ['POST', 'decisions/flash-jev', /^POST \/v1\/decisions\/flash-jev: this gateway does not serve it: decisions are not sold/],
      ['GET', 'balance', /keeps no credit balance/],
      ['DELETE', 'jobs/job-1', /^DELETE \/v1\/jobs\/\{id\}: /],
      ['GET', 'proxy/offers', /proxies no other sellers/],
    ] as const) {
      const [s, e] = await errorOf(await fetch(`${gw.url}/${route}`, { method, ...(method === 'POST' ? { body: '{}', headers: { 'content-type': 'application/json' } } : {}) }));
      expect([s, e.code], route).toEqual([501, 'not_supported']);
      expect(e.message, route).toMatch(why);
    }
    // An estimate: a wrapper field it does not have is refused, not ignored; an unserved endpoint is 501.
    const [s10, e10] = await errorOf(await post('estimates', JSON.stringify({ endpoint: 'CHAT', body, x: 1 })));
    expect([s10, e10.code, e10.message]).toEqual([400, 'invalid_request', 'x: not a field of an estimate request ({endpoint, body})']);
    const [s11, e11] = await errorOf(await post('estimates', JSON.stringify({ endpoint: 'IMAGES', body: { model: MODEL, prompt: 'a cat' } })));
    expect([s11, e11.code, e11.message]).toEqual([501, 'not_supported', 'endpoint: IMAGES is not served by this gateway (it estimates CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS)']);
    // A number JSON cannot hold (1e400) is refused as the endpoint refuses it, not read as null
    // ("not given") by a re-serialisation (s23 h6: the estimate was 200 for a body execution refuses).
    for (const field of ['max_tokens', 'temperature', 'seed']) {
      const inner = `{"model":${JSON.stringify(MODEL)},"messages":[{"role":"user","content":"hi"}],"${field}":1e400}`;
      const [se, ee] = await errorOf(await post('estimates', `{"endpoint":"CHAT","body":${inner}}`));
      const [sx, ex] = await errorOf(await post('chat/completions', inner));
      expect([se, ee.code], field).toEqual([400, 'invalid_request']);
      expect([sx, ex.code], field).toEqual([400, 'invalid_request']);
      expect(ee.message, field).toBe(`body.${ex.message}`);
    }
    expect(gw.records.size).toBe(records);
    expect(await totals()).toEqual(before);
    expect((await fetch(`${gw.url}/models`)).status).toBe(200); // still up
  });

  test("a non-stream body is the node's bytes with the receipt added as the last member of service: without it, they are what response_sha256 covers", async () => {
    for (const [endpoint, body] of [
      ['chat/completions', { model: MODEL, messages, max_tokens: 8, seed: 5 }],
      ['completions', { model: MODEL, prompt: 'once upon', max_tokens: 8 }],
      ['responses', { model: MODEL, input: 'hello', max_output_tokens: 8 }],
      ['embeddings', { model: MODEL, input: ['a b', 'c'], encoding_format: 'float' }],
    ] as const) {
      const r = await fetch(`${gw.url}/${endpoint}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      expect(r.status, endpoint).toBe(200);
      const text = await r.text();
      const at = text.lastIndexOf(',"receipt":');
      expect(text.endsWith('}}'), endpoint).toBe(true);
      const nodeBytes = text.slice(0, at) + '}}';
      const p = verified((JSON.parse(text) as { service: { receipt: unknown } }).service.receipt);
      expect(sha256Hex(Buffer.from(nodeBytes)), endpoint).toBe(p.response_sha256);
    }
  });

  test('a stream carries service {request_id, receipt} in its closing chunk (usage chunk, else finish chunk; responses: the closing event), and without the receipt its bytes are what response_sha256 covers', async () => {
    for (const [endpoint, body, closing] of [
      ['chat/completions', { model: MODEL, messages, max_tokens: 8, seed: 5, stream: true }, 'finish'],
      ['chat/completions', { model: MODEL, messages, max_tokens: 8, seed: 5, stream: true, stream_options: { include_usage: true } }, 'usage'],
      ['completions', { model: MODEL, prompt: 'once upon', max_tokens: 8, stream: true }, 'finish'],
      ['completions', { model: MODEL, prompt: 'once upon', max_tokens: 8, stream: true, stream_options: { include_usage: true } }, 'usage'],
      ['responses', { model: MODEL, input: 'hello', max_output_tokens: 8, stream: true }, 'response'],
    ] as const) {
      const what = `${endpoint} ${closing}`;
      const r = await fetch(`${gw.url}/${endpoint}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      expect(r.status, what).toBe(200);
      const text = await r.text();
      const datas = text.split('\n\n').filter(Boolean).map((ev) => ev.split('\n').find((l) => l.startsWith('data: '))!.slice(6));
      const json = datas.filter((d) => d !== '[DONE]').map((d) => JSON.parse(d) as Record<string, any>);
      const withService = json.filter((j) => (j.response ?? j).service?.receipt !== undefined);
      expect(withService, what).toHaveLength(1);
      const last = json.at(-1)!;
      expect(withService[0], what).toBe(last);
      if (closing === 'usage') expect(last.usage, what).toBeDefined();
      if (closing === 'finish') expect(last.choices[0].finish_reason, what).toMatch(/^(stop|length)$/);
      const service = (last.response ?? last).service as { request_id: string; receipt: DsseEnvelope };
      expect(service.request_id, what).toBe(r.headers.get('x-request-id'));
      const p = verified(service.receipt);
      expect(p.request_id, what).toBe(service.request_id);
      const nodeBytes = text.replace(`,"receipt":${JSON.stringify(service.receipt)}`, '');
      expect(nodeBytes.length, what).toBeLessThan(text.length);
      expect(sha256Hex(Buffer.from(nodeBytes)), what).toBe(p.response_sha256);
      if (endpoint !== 'responses') expect(datas.at(-1), what).toBe('[DONE]');
    }
  });

  test('embeddings: one vector per input, billed for input tokens only', async () => {
    const input = ['hello world', 'the cat sat'];
    const res = (await client.embeddings.create({ model: MODEL, input })) as OpenAI.CreateEmbeddingResponse & { usage: { cost: string }; service: { request_id: string; receipt: unknown } };
    expect(res.data).toHaveLength(2);
    expect(res.data[0]!.embedding.length).toBeGreaterThan(0);
    const counts = (await Promise.all(input.map((prompt) => countTokens({ prompt })))).reduce((a, b) => a + b, 0);
    expect(res.usage.prompt_tokens).toBe(counts);
    expect(res.usage.cost).toBe(costUsd(counts, 0));
    const p = verified(res.service.receipt);
    expect(p).toMatchObject({ endpoint: 'embeddings', status: 'completed', usage: { input_tokens: counts, output_tokens: 0 } });
    expect((await record(res.service.request_id)).status).toBe('completed');
    // The openai client asks for encoding_format "base64" unless told otherwise, and decodes it:
    // the same vectors as "float" gives, to the last bit of their float32 values.
    const raw = async (encoding_format: string) => {
      const r = await fetch(`${gw.url}/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, input, encoding_format }) });
      expect(r.status).toBe(200);
      return ((await r.json()) as { data: { embedding: unknown }[] }).data.map((d) => d.embedding);
    };
    const floats = (await raw('float')) as number[][];
    const b64 = (await raw('base64')) as string[];
    expect(b64.every((e) => typeof e === 'string')).toBe(true);
    const decoded = b64.map((e) => { const b = Buffer.from(e, 'base64'); return Array.from({ length: b.length / 4 }, (_, i) => b.readFloatLE(i * 4)); });
    expect(decoded).toEqual(floats);
    expect(res.data.map((d) => d.embedding)).toEqual(floats);
  });

  test('embeddings: a batch holding more tokens than one context is served (the hold covers the whole batch)', async () => {
    const one = 'the quick brown fox jumps over the lazy dog '.repeat(Math.ceil(CONTEXT / 20)).slice(0, CONTEXT * 2);
    const perInput = await countTokens({ prompt: one });
    // Over 5 contexts in all, each input within one: more than the market's default hold (one
    // context at the higher of the two rates, 4× the input rate here) would cover.
    const n = Math.ceil((5 * CONTEXT) / perInput) + 1;
    expect(perInput).toBeLessThanOrEqual(CONTEXT);
    const res = (await client.embeddings.create({ model: MODEL, input: Array.from({ length: n }, () => one) })) as OpenAI.CreateEmbeddingResponse & { service: { receipt: unknown } };
    expect(res.data).toHaveLength(n);
    const p = verified(res.service.receipt);
    expect(p.usage.input_tokens).toBe(n * perInput);
    expect(p.usage.input_tokens).toBeGreaterThan(5 * CONTEXT);
    expect(BigInt(p.cost_micro_usd) <= BigInt(p.hold_micro_usd)).toBe(true);
  });

  test('an estimate for a hedged request with one provider for its model holds one run\'s worst case (no second to race: it runs once)', async () => {
    const messages = [{ role: 'user' as const, content: 'hello world' }];
    const body = { model: MODEL, messages, max_tokens: 20, seed: 3 };
    const headers = { 'content-type': 'application/json', 'x-service-hedge': '1' };
    const r = await fetch(`${gw.url}/estimates`, { method: 'POST', headers, body: JSON.stringify({ endpoint: 'CHAT', body }) });
    expect(r.status).toBe(200);
    const est = (await r.json()) as { estimate_id: string; input_tokens: number; max_hold: string; expected_cost: string };
    expect(est.expected_cost).toBe(costUsd(est.input_tokens, 20));
    expect(est.max_hold).toBe(est.expected_cost);
    // Executed under it: run once, with the whole hold.
    const run = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { ...headers, 'x-service-estimate': est.estimate_id }, body: JSON.stringify(body) });
    expect(run.status).toBe(200);
    const p = verified(((await run.json()) as { service: { receipt: DsseEnvelope } }).service.receipt);
    expect(formatUsd(BigInt(p.hold_micro_usd))).toBe(est.max_hold);
  });

  test('X-Service-Hedge with no second provider runs once, holding the whole cap', async () => {
    const messages = [{ role: 'user' as const, content: 'hello there, how are you doing today' }];
    const count = await countTokens({ messages });
    const cap = costUsd(count, 1); // the input and one output token: half of it would pay for neither
    const res = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-hedge': '1', 'x-service-max-cost-usd': cap }, body: JSON.stringify({ model: MODEL, messages, max_tokens: 1 }) });
    expect(res.status).toBe(200);
    const p = verified(((await res.json()) as { service: { receipt: DsseEnvelope } }).service.receipt);
    expect(formatUsd(BigInt(p.hold_micro_usd))).toBe(cap);
  });

  test('tokenize: the tokenization object, no ticket, no receipt', async () => {
    const receiptsBefore = ((await (await fetch(`${marketUrl}/v1/receipts`)).json()) as unknown[]).length;
    const r = await fetch(`${gw.url}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: 'hello world', return_tokens: true }) });
    expect(r.status).toBe(200);
    expect(r.headers.get('x-request-id')).toMatch(/^req-/);
    const t = (await r.json()) as { object: string; model: string; count: number; tokens: number[]; max_model_len: number; provider: string };
    expect(t).toMatchObject({ object: 'tokenization', model: MODEL, max_model_len: CONTEXT, provider: node.providerId });
    expect(t.tokens).toHaveLength(t.count);
    expect(t.count).toBeGreaterThan(0);
    const plain = (await (await fetch(`${gw.url}/tokenize`, { method: 'POST', body: JSON.stringify({ model: MODEL, messages }) })).json()) as { tokens: unknown; count: number };
    expect(plain.tokens).toBeNull();
    expect(plain.count).toBe(await countTokens({ messages }));
    expect(((await (await fetch(`${marketUrl}/v1/receipts`)).json()) as unknown[]).length).toBe(receiptsBefore);
  });

  test('a buyer who aborts mid-stream leaves a cancelled, verified, settled receipt at GET /v1/requests/{id}', async () => {
    const ac = new AbortController();
    const { data: stream, response } = await client.chat.completions
      .create({ model: MODEL, messages, max_tokens: 900, seed: 7, stream: true }, { signal: ac.signal })
      .withResponse();
    const id = response.headers.get('x-request-id')!;
    let chunks = 0;
    // The client ends the iteration quietly on its own abort.
    for await (const _ of stream) {
      if (++chunks === 3) ac.abort();
    }
    expect(chunks).toBeLessThan(10);
    const rec = await waitFor('the cancelled receipt', async () => {
      const r = await record(id);
      return r.status === 'in_progress' ? undefined : r;
    });
    expect(rec.status).toBe('cancelled');
    expect(rec.settled).toBe(true);
    const p = verified(rec.receipt);
    expect(p).toMatchObject({ status: 'cancelled', request_id: id, provider: node.providerId });
    expect(p.usage.output_tokens).toBeGreaterThanOrEqual(1);
    expect(p.usage.output_tokens).toBeLessThan(900);
    expect(rec.cost).toBe(costUsd(p.usage.input_tokens, p.usage.output_tokens));
    expect((await marketReceipt(id)).status).toBe('cancelled');
  });

  test('an Idempotency-Key retry is answered with the first receipt, billed once', async () => {
    const key = `idem-${crypto.randomUUID()}`;
    const ask = async () => (await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, seed: 8 }, { headers: { 'Idempotency-Key': key } })) as OpenAI.ChatCompletion & { service: { request_id: string; receipt: unknown } };
    const first = await ask();
    const second = await ask();
    expect(second.service.receipt).toEqual(first.service.receipt);
    expect(second.service.request_id).toBe(first.service.request_id);
    expect(second.choices[0]!.message.content).toBe(first.choices[0]!.message.content);
  });

  test("gateways of two buyers (--account) keep their Idempotency-Keys apart: the same key and body run and bill for each, and the market holds both receipts", async () => {
    const other = await createGateway({ market: marketUrl, port: 0, account: 'buyer-b' });
    try {
      const key = `shared-${crypto.randomUUID()}`;
      const ask = async (url: string) => {
        const r = await fetch(`${url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: JSON.stringify({ model: MODEL, messages, max_tokens: 4, seed: 4 }) });
        expect(r.status).toBe(200);
        return ((await r.json()) as { service: { request_id: string } }).service.request_id;
      };
      const a = await ask(gw.url); // (the market's default account, dev)
      const b = await ask(other.url);
      expect(b).not.toBe(a); // run again for the other buyer, not the first buyer's answer and receipt
      expect(await ask(other.url)).toBe(b); // each buyer's own retry is still answered from its record
      // Both billed: each receipt settled with the market.
      expect((await settledRecord(gw.url, a)).receipt).not.toBeNull();
      expect((await settledRecord(other.url, b)).receipt).not.toBeNull();
      expect(verified(JSON.parse((await marketReceipt(a)).receipt)).request_id).toBe(a);
      expect(verified(JSON.parse((await marketReceipt(b)).receipt)).request_id).toBe(b);
    } finally {
      await other.close(1000);
    }
  });

  test('malformed X-Service-* headers are 400 invalid_request naming the header, before any ticket', async () => {
    const cases: [string, string][] = [
      ['X-Service-Min-Att-Tier', 'T5'],
      ['X-Service-Min-Ctx', '0'],
      ['X-Service-Quant', '_bad'],
      ['X-Service-Prefer-Providers', 'abc'],
      ['X-Service-Hedge', '2'],
      ['X-Service-Min-Tok-S', '-1'],
      ['X-Service-Max-Wait-Ms', '60001'],
      ['X-Service-Max-Cost-Usd', '0.1234567'],
      ['X-Service-Max-Input-Price-Per-Million-Usd', '1e3'],
      ['X-Service-Max-Output-Price-Per-Million-Usd', 'free'],
      ['X-Service-Max-Representative-Request-Price-Usd', '-0.5'],
    ];
    for (const [name, value] of cases) {
      const r = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', [name]: value }, body: JSON.stringify({ model: MODEL, messages }) });
      expect(r.status, name).toBe(400);
      expect(r.headers.get('x-request-id')).toMatch(/^req-/);
      const e = (await r.json()) as { error: { code: string; message: string } };
      expect(e.error.code).toBe('invalid_request');
      expect(e.error.message.startsWith(`${name}:`), e.error.message).toBe(true);
    }
    // Through the openai client too.
    await expect(client.chat.completions.create({ model: MODEL, messages }, { headers: { 'X-Service-Min-Att-Tier': 'T9' } })).rejects.toMatchObject({ status: 400, code: 'invalid_request' });
    // Good headers pass: tier, quantization normalisation, throughput, wait, cost cap, ceilings.
    const ok = await client.chat.completions.create(
      { model: MODEL, messages, max_tokens: 4 },
      { headers: { 'X-Service-Min-Att-Tier': '1', 'X-Service-Quant': 'F32', 'X-Service-Min-Ctx': '512', 'X-Service-Max-Wait-Ms': '2000', 'X-Service-Max-Cost-Usd': '0.01', 'X-Service-Max-Input-Price-Per-Million-Usd': '0.15', 'X-Service-Max-Output-Price-Per-Million-Usd': '0.6' } },
    );
    const p = verified((ok as unknown as { service: { receipt: unknown } }).service.receipt);
    expect(p.hold_micro_usd).toBe('10000');
  });

  test('a routing header sent twice with one value each is 400 naming it (HTTP joins the two with a comma), an Idempotency-Key too; a provider list sent twice is one list', async () => {
    for (const [name, a, b] of [['X-Service-Max-Cost-Usd', '0.01', '0.02'], ['X-Service-Hedge', '1', '1'], ['X-Service-Min-Att-Tier', 'T1', 'T2']] as const) {
      const headers = new Headers({ 'content-type': 'application/json' });
      headers.append(name, a);
      headers.append(name, b);
      const r = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers, body: JSON.stringify({ model: MODEL, messages }) });
      const e = (await r.json()) as { error: { code: string; message: string } };
      expect([r.status, e.error.code], name).toEqual([400, 'invalid_request']);
      expect(e.error.message.startsWith(`${name}:`), e.error.message).toBe(true);
    }
    // Idempotency-Key sent twice (two header lines: Node.js would join them into the one key "a, b"),
    // empty, or too long: 400 naming it, nothing run.
    const raw = (headers: string[]) =>
      new Promise<{ status: number; body: { error: { code: string; message: string } } }>((resolve, reject) => {
        const req = http.request(`${gw.url}/chat/completions`, { method: 'POST', headers: ['host', new URL(gw.url).host, 'content-type', 'application/json', ...headers] }, (res) => {
          let text = '';
          res.on('data', (d: Buffer) => (text += d.toString()));
          res.on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(text) }));
        });
        req.on('error', reject);
        req.end(JSON.stringify({ model: MODEL, messages, max_tokens: 2 }));
      });
    for (const [headers, message] of [
      [['idempotency-key', 'a', 'idempotency-key', 'b'], 'Idempotency-Key: given more than once'],
      [['idempotency-key', ''], 'Idempotency-Key: expected 1 to 256 characters'],
      [['idempotency-key', 'k'.repeat(257)], 'Idempotency-Key: expected 1 to 256 characters'],
    ] as const) {
      expect(await raw([...headers]), message).toEqual({ status: 400, body: { error: { code: 'invalid_request', message } } });
    }
    // X-Service-Prefer-Providers is a comma-separated list, so two headers are the two lists in
    // order: the node is in it whichever header names it (keeping only one header would fail one order).
    for (const [a, b] of [['f'.repeat(64), node.providerId], [node.providerId, 'f'.repeat(64)]]) {
      const headers = new Headers({ 'content-type': 'application/json' });
      headers.append('X-Service-Prefer-Providers', a!);
      headers.append('X-Service-Prefer-Providers', b!);
      const ok = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers, body: JSON.stringify({ model: MODEL, messages, max_tokens: 2 }) });
      expect(ok.status).toBe(200);
      expect(verified(((await ok.json()) as { service: { receipt: DsseEnvelope } }).service.receipt).provider).toBe(node.providerId);
    }
  });

  test('unknown model is 404; unmet routing is 503; node refusals are relayed with their status and code', async () => {
    await expect(client.chat.completions.create({ model: 'nobody/nothing', messages })).rejects.toMatchObject({ status: 404, code: 'model_not_found' });
    // A model id that is a property of every JavaScript object names no model either (it was a 500 for embeddings).
    for (const model of ['constructor', '__proto__', 'toString', 'hasOwnProperty']) {
      await expect(client.embeddings.create({ model, input: 'hello' }), model).rejects.toMatchObject({ status: 404, code: 'model_not_found' });
      await expect(client.chat.completions.create({ model, messages }), model).rejects.toMatchObject({ status: 404, code: 'model_not_found' });
    }
    await expect(client.chat.completions.create({ model: MODEL, messages }, { headers: { 'X-Service-Quant': 'q4_k_m' } })).rejects.toMatchObject({ status: 503, code: 'no_provider' });
    // The market does not check the representative-request ceiling; the node does, before any work.
    await expect(client.chat.completions.create({ model: MODEL, messages, max_tokens: 50 }, { headers: { 'X-Service-Max-Representative-Request-Price-Usd': '0.000001' } })).rejects.toMatchObject({ status: 403, code: 'price_ceiling_exceeded' });
    // A body the node's contract refuses: 400 naming the field, relayed from the node.
    const bad = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: [] }) });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { code: string; message: string } }).error).toMatchObject({ code: 'invalid_request', message: expect.stringMatching(/^messages/) });
    const junk = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{not json' });
    expect(junk.status).toBe(400);
    const missing = await fetch(`${gw.url}/requests/req-does-not-exist`);
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as { error: { code: string } }).error.code).toBe('request_not_found');
  });
  test('a records file that fails mid-life costs the buyer nothing: answers, receipts and GET /v1/requests/{id} go on, the failure is logged', async () => {
    const logged: { obj: Record<string, unknown>; msg?: string }[] = [];
    const infos: Record<string, unknown>[] = [];
    const logger = { info: (obj: object, msg?: string) => void infos.push({ ...obj, msg }), warn: () => {}, error: (obj: object, msg?: string) => logged.push({ obj: obj as Record<string, unknown>, msg }) };
    const g = await createGateway({ market: marketUrl, port: 0, recordsPath: path.join(dir, 'failing-records.db'), logger });
    try {
      g.records.close(); // from here on every write to the file fails, as on a full or broken disk
      const secret = 'a prompt that must never reach a log';
      const r = await fetch(`${g.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: secret }], max_tokens: 5, seed: 4 }) });
      expect(r.status).toBe(200);
      const body = (await r.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
      expect(verified(body.service.receipt).status).toBe('completed');
      const s = await fetch(`${g.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: secret }], max_tokens: 5, seed: 4, stream: true }) });
      expect(s.status).toBe(200);
      expect(await s.text()).toContain('data: [DONE]');
      await g.idle();
      const rec = (await (await fetch(`${g.url}/requests/${body.service.request_id}`)).json()) as RequestRecord;
      expect(rec).toMatchObject({ status: 'completed', settled: true, receipt: body.service.receipt });
      expect(g.records.fileErrors).toBeGreaterThanOrEqual(4);
      // An id the gateway never saw: 404 as always, though the file cannot be read.
      const unknown = await fetch(`${g.url}/requests/req-never-seen`);
      expect(unknown.status).toBe(404);
      expect(((await unknown.json()) as { error: { code: string } }).error.code).toBe('request_not_found');
      expect(logged.some((l) => l.obj.request_id === body.service.request_id && /records file/.test(l.msg ?? ''))).toBe(true);
      expect(JSON.stringify(logged)).not.toContain(secret);
      // One info line a request, streams included: the route and status, never the body.
      const requests = infos.filter((l) => l.msg === 'request');
      expect(requests.find((l) => l.request_id === r.headers.get('x-request-id'))).toMatchObject({ method: 'POST', route: '/v1/chat/completions', status: 200, completed: true, ms: expect.any(Number) });
      expect(requests.find((l) => l.request_id === s.headers.get('x-request-id'))).toMatchObject({ route: '/v1/chat/completions', status: 200, completed: true });
      // Timed: a paid request (a ticket, a libp2p round trip, a run, a receipt) takes more than a millisecond.
      for (const res of [r, s]) expect(requests.find((l) => l.request_id === res.headers.get('x-request-id'))!.ms as number).toBeGreaterThan(0);
      // A buyer who leaves before any answer: no status (not the 200 a response starts with), not completed.
      const http = await import('node:http');
      const u = new URL(`${g.url}/chat/completions`);
      const leaving = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json', 'content-length': '1000' } });
      leaving.on('error', () => undefined);
      leaving.write('{"model":');
      const before = requests.length;
      await new Promise((r) => setTimeout(r, 100));
      leaving.destroy();
      await waitFor('the line of the request whose buyer left', () => (infos.filter((l) => l.msg === 'request').length > before ? true : undefined));
      expect(infos.filter((l) => l.msg === 'request').at(-1)).toMatchObject({ method: 'POST', route: '/v1/chat/completions', status: null, completed: false });
      expect(requests.find((l) => l.request_id === unknown.headers.get('x-request-id'))).toMatchObject({ method: 'GET', route: '/v1/requests/:id', status: 404 });
      expect(JSON.stringify(infos)).not.toContain(secret);
    } finally {
      await g.close();
    }
  });
  test('with a records file, GET /v1/requests/{id} answers after the gateway restarts', async () => {
    const file = path.join(dir, 'gateway-records.db');
    const first = await createGateway({ market: marketUrl, port: 0, recordsPath: file });
    let id: string;
    let before: RequestRecord;
    try {
      const r = await fetch(`${first.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello' }], max_tokens: 5, seed: 2 }) });
      expect(r.status).toBe(200);
      id = ((await r.json()) as { service: { request_id: string } }).service.request_id;
      await first.idle();
      before = (await (await fetch(`${first.url}/requests/${id}`)).json()) as RequestRecord;
      expect(before.status).toBe('completed');
    } finally {
      await first.close();
    }
    const second = await createGateway({ market: marketUrl, port: 0, recordsPath: file });
    try {
      const after = await fetch(`${second.url}/requests/${id}`);
      expect(after.status).toBe(200);
      expect(await after.json()).toEqual(before);
      expect(verifyReceipt((before.receipt as DsseEnvelope), { provider: node.providerId }).ok).toBe(true);
    } finally {
      await second.close();
    }
  });
});
