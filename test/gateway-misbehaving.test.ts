// The gateway against parties that misbehave, on real transports: a scripted provider node (real
// libp2p on loopback, a real receipt log served over /service/log) and a market proxy in front of
// a real development market (it can rewrite the ticket the market grants and fail the receipt
// POST). A real node on the tiny model answers the good request after every case, through the
// same gateway: a misbehaving party costs one request, never the gateway.
//
//   provider: receipts that do not verify or are another request's → 502 bad_provider_response,
//             recorded, never settled; a stream closed or reset without a TRAILER → 502 (or an SSE
//             error event), settled from the node's log when it has a receipt, else
//             `provider_failed`; an HTTP status without an error envelope → 502.
//   market:   a ticket that does not verify, is another request's or holds more than
//             X-Service-Max-Cost-Usd → 502 bad_market_response, no record, nothing charged, the
//             provider never dialled; POST /v1/receipts failing (5xx, dropped) is retried (3 tries
//             in all), refused (4xx, ok:false) is not, and the record says which; a valid ticket
//             for a provider outside X-Service-Prefer-Providers is 503 no_provider, never used.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { toBase64, utf8 } from '../attestation/bytes.ts';
import { canonicalize } from '../attestation/canonical-json.ts';
import { sha256Hex } from '../attestation/hash.ts';
import { parseEnvelope, serializeEnvelope, type DsseEnvelope } from '../attestation/dsse.ts';
import { computeCost, formatUsd, parseUsd, type Usage } from '../attestation/money.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { ratesToWire } from '../attestation/receipt.ts';
import { peekPayload } from '../attestation/signed-payload.ts';
import { signTicket, type TicketPayload } from '../attestation/ticket.ts';
import { parseConfig } from '../src/config.ts';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import type { RequestRecord } from '../src/gateway/records.ts';
import { createKeyFile } from '../src/identity.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { startNode, type RunningNode } from '../src/node.ts';
import type { JsonObject } from '../src/p2p/frames.ts';
import { settledWithin } from '../src/settled-within.ts';
import { Exchange, MarketProxy, SCRIPTED_RATES, SCRIPTED_USAGE, ScriptedNode, type Behaviour, type TicketGrant } from './helpers/misbehaving-node.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { until, waitFor, waitForListed } from './helpers/wait.ts';
import { endedRecord, errorOf, gatewayRecord, marketHas as marketHasReceipt, settledRecord, sseData } from './helpers/gateway-reads.ts';

const MODEL = 'tiny/llama';
const RECEIPT_FETCH_MS = 800;

let dir: string;
let marketSeed: Uint8Array;
let market: Market;
let marketUrl: string;
let proxy: MarketProxy;
let node: RunningNode;
let scripted: ScriptedNode;
let gw: Gateway;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-misbehaving-'));
  marketSeed = new Uint8Array(crypto.randomBytes(32));
  // A long heartbeat interval keeps the scripted node (which never heartbeats) live for the run.
  market = createMarket({ seed: marketSeed, heartbeatIntervalMs: 60_000 });
  marketUrl = (await market.listen()).url;
  proxy = await MarketProxy.start(marketUrl);
  writeTinyLlama(path.join(dir, 'tiny.gguf'));
  createKeyFile(path.join(dir, 'node.key'));
  const yaml = tinyNodeConfigYaml({ publicKey: market.publicKey, marketUrl, slots: 2, receipts: '{ signer_threads: 1, checkpoint_interval_ms: 0 }', logLevel: 'error' });
  node = await startNode(parseConfig(yaml, dir));
  scripted = await ScriptedNode.start(dir);
  scripted.behaviour = honest;
  await scripted.register(marketUrl);
  await waitForListed(marketUrl, [node.providerId, scripted.providerId]);
  gw = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: RECEIPT_FETCH_MS });
});

afterAll(async () => {
  await gw?.close(1000);
  await scripted?.stop();
  await node?.stop(1000);
  await proxy?.close();
  await market?.close();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

// Every case starts with a market that passes everything through and a fresh count of receipt POSTs.
beforeEach(() => proxy.reset());

// After every case the same gateway answers a good request at the real node, settled as usual.
afterEach(async () => {
  proxy.reset();
  scripted.behaviour = honest;
  expect(scripted.errors.splice(0).map((e) => e.message), 'the scripted node\'s own failures').toEqual([]);
  const res = await post(chatBody('are you still there?'), toNode());
  expect(res.status).toBe(200);
  const id = res.headers.get('x-request-id')!;
  const body = (await res.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
  expect(body.service.request_id).toBe(id);
  expect(verifyReceipt(body.service.receipt, { provider: node.providerId }).ok).toBe(true);
  expect(await record(id)).toMatchObject({ status: 'completed', settled: true, provider: node.providerId });
  expect(await marketHas(id)).toBe(true);
});

// ---- helpers -----------------------------------------------------------------------------------

const toScripted = (): Record<string, string> => ({ 'x-service-prefer-providers': scripted.providerId });
const toNode = (): Record<string, string> => ({ 'x-service-prefer-providers': node.providerId });

function chatBody(content = 'hello', extra: object = {}): string {
  return JSON.stringify({ model: MODEL, messages: [{ role: 'user', content }], max_tokens: 8, seed: 1, ...extra });
}

function post(body: string, headers: Record<string, string> = {}, endpoint = 'chat/completions'): Promise<Response> {
  return fetch(`${gw.url}/${endpoint}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
}

const record = (id: string): Promise<RequestRecord> => gatewayRecord(gw.url, id);
const marketHas = (id: string): Promise<boolean> => marketHasReceipt(marketUrl, id);

async function marketReceipts(): Promise<number> {
  return ((await (await fetch(`${marketUrl}/v1/totals`)).json()) as { receipts: number }).receipts;
}

/** A response in the spec's error envelope: exactly {error: {code, message}}, JSON, with an x-request-id. */
async function expectError(res: Response, status: number, code: string, message?: RegExp): Promise<{ id: string; message: string; body: Record<string, unknown> }> {
  const body = (await res.json()) as Record<string, unknown> & { error: { code: string; message: string } };
  expect([res.status, body.error?.code], JSON.stringify(body)).toEqual([status, code]);
  expect(res.headers.get('content-type')).toMatch(/^application\/json/);
  expect(typeof body.error.message).toBe('string');
  expect(body.error.message.length).toBeGreaterThan(0);
  if (message) expect(body.error.message).toMatch(message);
  const id = res.headers.get('x-request-id');
  expect(id).toMatch(/^req-/);
  return { id: id!, message: body.error.message, body };
}


/** Two streamed events and a `cancelled` receipt for them in the node's log, then `end` (a reset, silence). */
function twoEventsCancelledThen(end: (ex: Exchange) => unknown): { behaviour: Behaviour; logged: string } {
  const run = {
    logged: '',
    behaviour: (async (ex) => {
      await ex.head(SSE_HEAD);
      await ex.data(chunk('a'));
      await ex.data(chunk('b'));
      run.logged = await ex.logReceipt({ status: 'cancelled', usage: { input_tokens: 7, output_tokens: 2 } });
      await end(ex);
    }) as Behaviour,
  };
  return run;
}

/** A relayed stream's answer: 200 and an event stream, its request id and its events' data lines. */
async function streamed(res: Response): Promise<{ id: string; events: string[] }> {
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
  return { id: res.headers.get('x-request-id')!, events: sseData(await res.text()) };
}

const JSON_HEAD = { status: 200, headers: { 'content-type': 'application/json' } };
const SSE_HEAD = { status: 200, headers: { 'content-type': 'text/event-stream', 'x-service-stream-mode': 'live' } };

/** A chat completion body whose usage (and usage.cost) is `usage`'s. */
function completion(usage: Usage = SCRIPTED_USAGE): string {
  return JSON.stringify({
    id: 'chatcmpl-scripted',
    object: 'chat.completion',
    created: 1,
    model: MODEL,
    choices: [{ index: 0, message: { role: 'assistant', content: 'scripted' }, finish_reason: 'stop' }],
    usage: { prompt_tokens: usage.input_tokens, completion_tokens: usage.output_tokens, total_tokens: usage.input_tokens + usage.output_tokens, cost: formatUsd(computeCost(usage, SCRIPTED_RATES)) },
  });
}

const chunk = (content: string): string => `data: ${JSON.stringify({ id: 'chatcmpl-scripted', object: 'chat.completion.chunk', created: 1, model: MODEL, choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;

/** What a correct node does: HEAD, the body, a durable receipt for exactly that, the TRAILER. */
const honest: Behaviour = async (ex) => {
  await ex.head(JSON_HEAD);
  await ex.data(completion());
  await ex.trailer(Exchange.receiptTrailer(await ex.logReceipt()));
};

/** HEAD, an honest body, then the TRAILER carrying whatever `receipt` makes of the exchange. */
function answersWith(receipt: (ex: Exchange) => string | undefined | Promise<string | undefined>, body: string = completion()): Behaviour {
  return async (ex) => {
    await ex.head(JSON_HEAD);
    await ex.data(body);
    const line = await receipt(ex);
    await ex.trailer(line === undefined ? {} : Exchange.receiptTrailer(line));
  };
}

const other = sha256Hex; // the hash of something else

/** What a run of the scripted node must leave behind when the gateway refused its answer. */
async function expectRefusedAnswer(res: Response, message: RegExp, before: { receipts: number; requests: number }): Promise<RequestRecord> {
  const e = await expectError(res, 502, 'bad_provider_response', message);
  expect(scripted.requests).toBe(before.requests + 1);
  const rec = await record(e.id);
  expect(rec).toMatchObject({ request_id: e.id, status: 'bad_provider_response', provider: scripted.providerId, settled: false, receipt: null, cost: null, usage: null });
  expect(rec.error).toEqual({ code: 'bad_provider_response', message: e.message });
  expect(await marketHas(e.id)).toBe(false);
  await expectNothingSettled(before);
  return rec;
}

/** One case of a provider whose answer the gateway must refuse: 502 bad_provider_response, recorded, nothing settled. */
async function refusedAnswerCase(name: string, behaviour: Behaviour, message: RegExp): Promise<void> {
  scripted.behaviour = behaviour;
  const before = await snapshot();
  await expectRefusedAnswer(await post(chatBody(name), toScripted()), message, before);
}

/** No settlement was even attempted, and the market counts no new receipt. */
async function expectNothingSettled(before: { receipts: number }): Promise<void> {
  expect(proxy.receiptPosts).toBe(0);
  expect(await marketReceipts()).toBe(before.receipts);
}

async function snapshot(): Promise<{ receipts: number; requests: number }> {
  return { receipts: await marketReceipts(), requests: scripted.requests };
}

// ---- the provider -------------------------------------------------------------------------------

describe('a provider whose receipt does not check out: 502 bad_provider_response, recorded, never settled', () => {
  test('control: the scripted node answering honestly is relayed, verified and settled', async () => {
    const before = await snapshot();
    const res = await post(chatBody('honest'), toScripted());
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    const body = (await res.json()) as { usage: { cost: string }; service: { request_id: string; receipt: DsseEnvelope } };
    const v = verifyReceipt(body.service.receipt, { provider: scripted.providerId });
    expect(v.ok && v.value.payload).toMatchObject({ request_id: id, status: 'completed', usage: SCRIPTED_USAGE });
    expect(await record(id)).toMatchObject({ status: 'completed', settled: true, provider: scripted.providerId, cost: body.usage.cost });
    expect(proxy.receiptPosts).toBe(1);
    expect(await marketReceipts()).toBe(before.receipts + 1);
    expect(scripted.requests).toBe(before.requests + 1);
  });

  const forger = new Uint8Array(crypto.randomBytes(32));
  const cases: [string, Behaviour, RegExp][] = [
    ['a forged signature (another key under the provider\'s key id)', answersWith((ex) => ex.signedReceipt({}, forger)), /does not verify: signature_invalid/],
    ['a receipt for another request_id', answersWith((ex) => ex.logReceipt({ request_id: 'req-someone-else' })), /request_id is req-someone-else/],
    ['a receipt for another ticket', answersWith((ex) => ex.logReceipt({ ticket_id: 'tkt-another-ticket' })), /ticket_id is tkt-another-ticket/],
    ['a receipt for another request body', answersWith((ex) => ex.logReceipt({ request_sha256: other('another body') })), /request_sha256/],
    ['a receipt for another response (response_sha256 is not the bytes relayed)', answersWith((ex) => ex.logReceipt({ response_sha256: other('another answer') })), /response_sha256/],
    ['a receipt with another hold than the ticket\'s', answersWith((ex) => ex.logReceipt({ hold_micro_usd: String(BigInt(ex.ticket.max_cost_micro_usd) + 1n) })), /hold_micro_usd/],
    ['a receipt whose cost is not its usage at its rates', answersWith((ex) => ex.signedReceipt({ cost_micro_usd: '1' })), /does not verify: cost_mismatch/],
    ['a receipt signed by another key under its own key id', answersWith((ex) => ex.signedReceipt({}, forger).replace(`"keyid":"${scripted.providerId}"`, `"keyid":"${'ab'.repeat(32)}"`)), /does not verify: unknown_key/],
    ['a receipt under another price version', answersWith((ex) => ex.logReceipt({ price: { version: 'p-made-up', rates: ratesToWire(SCRIPTED_RATES) } })), /price\.version is p-made-up/],
    [
      'a receipt at made-up rates under the ticket\'s price version (its arithmetic right)',
      answersWith((ex) => {
        const rates = { ...SCRIPTED_RATES, output_per_mtok: SCRIPTED_RATES.output_per_mtok * 100n };
        return ex.logReceipt({ price: { version: ex.ticket.price_version, rates: ratesToWire(rates) }, cost_micro_usd: computeCost(SCRIPTED_USAGE, rates).toString() });
      }),
      /rates .* are not price version/,
    ],
    ['no receipt at all', answersWith(() => undefined), /carries no receipt/],
    ['a body whose usage is not the receipt\'s', answersWith((ex) => ex.logReceipt(), completion({ input_tokens: 7, output_tokens: 4 })), /usage\.completion_tokens is 4, the receipt says 3/],
    ['a body that is not JSON', answersWith((ex) => ex.logReceipt(), 'not json at all'), /not a JSON object/],
    ['a body whose prompt_tokens are not the receipt\'s', answersWith((ex) => ex.logReceipt(), completion({ input_tokens: 8, output_tokens: 3 })), /usage\.prompt_tokens is 8, the receipt says 7/],
    ['a body whose usage.cost is not the receipt\'s', answersWith((ex) => ex.logReceipt(), JSON.stringify({ ...JSON.parse(completion()), usage: { ...JSON.parse(completion()).usage, cost: '9.999999' } })), /usage\.cost is 9\.999999/],
    ['a responses-style body whose usage.input_tokens is not the receipt\'s', answersWith((ex) => ex.logReceipt(), JSON.stringify({ object: 'response', usage: { input_tokens: 8, output_tokens: 3, total_tokens: 11 } })), /usage\.input_tokens is 8/],
  ];
  test.each(cases)('%s', refusedAnswerCase);

  test('rates the market misstated (the provider\'s signed price list has its receipt\'s): 502 bad_market_response, not the provider\'s fault; the answer withheld, never settled', async () => {
    // The market's grant states other rates for the ticket's price version; the node bills its own, signed ones.
    proxy.ticket = (g) => ({ ...g, rates: { ...(g as { rates: object }).rates, output_per_mtok: '1' } });
    const before = await snapshot();
    const e = await expectError(await post(chatBody('misstated rates'), toScripted()), 502, 'bad_market_response', /the marketplace stated price version p-[0-9a-f]{32}'s rates for tiny\/llama as .*"output_per_mtok":"1".*, but the provider's signed price list has .*, as its receipt bills/);
    expect(await record(e.id)).toMatchObject({ status: 'failed', error: { code: 'bad_market_response' }, settled: false, receipt: null });
    await expectNothingSettled(before);
  });

  test('the same misstated rates on a receipt found in the node\'s log (the stream broke off before its TRAILER): recorded bad_market_response too, never settled', async () => {
    proxy.ticket = (g) => ({ ...g, rates: { ...(g as { rates: object }).rates, output_per_mtok: '1' } });
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data('{"id":"chatcmpl-scripted","object":"chat.comp');
      await ex.logReceipt({ status: 'failed', usage: { input_tokens: 7, output_tokens: 1 } });
      ex.reset();
    };
    const before = await snapshot();
    const e = await expectError(await post(chatBody('misstated, broke off'), toScripted()), 502, 'bad_provider_response', /broke off/);
    const rec = await waitFor('the record of the receipt from the log', async () => {
      const r = await record(e.id);
      return r.error?.code === 'bad_market_response' ? r : undefined;
    });
    expect(rec).toMatchObject({ status: 'failed', settled: false, receipt: null, error: { message: expect.stringMatching(/the marketplace stated price version p-[0-9a-f]{32}'s rates/) } });
    await expectNothingSettled(before);
  });

  test('streamed: [DONE] is held until the receipt verifies; a bad one ends the stream with a bad_provider_response event instead; recorded, never settled', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head(SSE_HEAD);
      await ex.data(chunk('one'));
      await ex.data(chunk('two'));
      await ex.data('data: [DONE]\n\n');
      await ex.trailer(Exchange.receiptTrailer(await ex.logReceipt({ request_id: 'req-someone-else' })));
    };
    const before = await snapshot();
    const res = await post(chatBody('stream', { stream: true }), toScripted());
    const { id, events } = await streamed(res);
    expect(events.slice(0, 2).map((d) => (JSON.parse(d) as { choices: { delta: { content: string } }[] }).choices[0]!.delta.content)).toEqual(['one', 'two']);
    expect(events).toHaveLength(3); // no [DONE]: a client stops reading there, and would never see the error
    const err = JSON.parse(events[2]!) as { error: { code: string; message: string } };
    expect(err.error).toMatchObject({ code: 'bad_provider_response', message: expect.stringMatching(/request_id is req-someone-else/) });
    expect(await record(id)).toMatchObject({ status: 'bad_provider_response', error: err.error, settled: false, receipt: null });
    await expectNothingSettled(before);
  });
  test('streamed: a usage chunk that disagrees with the receipt (1 token and $0.000001 told, 3 billed) ends the stream with bad_provider_response instead of the closing events; recorded, never settled (s28 review); an honest one is relayed and settled', async () => {
    const usageChunk = (u: Usage, requestId: string) => `data: ${JSON.stringify({ id: 'chatcmpl-scripted', object: 'chat.completion.chunk', created: 1, model: MODEL, choices: [], usage: { prompt_tokens: u.input_tokens, completion_tokens: u.output_tokens, total_tokens: u.input_tokens + u.output_tokens, cost: formatUsd(computeCost(u, SCRIPTED_RATES)) }, service: { request_id: requestId } })}\n\n`;
    const streaming = (told: Usage): Behaviour => async (ex) => {
      await ex.head(SSE_HEAD);
      await ex.data(chunk('one'));
      await ex.data(chunk('two'));
      await ex.data(`data: ${JSON.stringify({ id: 'chatcmpl-scripted', object: 'chat.completion.chunk', created: 1, model: MODEL, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\n`);
      await ex.data(usageChunk(told, ex.ticket.request_id));
      await ex.data('data: [DONE]\n\n');
      await ex.trailer(Exchange.receiptTrailer(await ex.logReceipt()));
    };
    const body = chatBody('stream', { stream: true, stream_options: { include_usage: true } });
    scripted.behaviour = streaming({ input_tokens: SCRIPTED_USAGE.input_tokens, output_tokens: 1 });
    const before = await snapshot();
    const { id, events } = await streamed(await post(body, toScripted()));
    expect(events.some((d) => d.includes('"usage"'))).toBe(false); // (the buyer is never told the lie)
    expect(events.includes('[DONE]')).toBe(false);
    const err = JSON.parse(events.at(-1)!) as { error: { code: string; message: string } };
    expect(err.error).toMatchObject({ code: 'bad_provider_response', message: 'usage.completion_tokens is 1, the receipt says 3' });
    expect(await record(id)).toMatchObject({ status: 'bad_provider_response', settled: false });
    await expectNothingSettled(before);
    // Control: the same stream telling the receipt's usage.
    scripted.behaviour = streaming(SCRIPTED_USAGE);
    const ok = await streamed(await post(body, toScripted()));
    expect(ok.events.at(-1)).toBe('[DONE]');
    const told = JSON.parse(ok.events.at(-2)!) as { usage: { completion_tokens: number; cost: string }; service: { receipt: unknown } };
    expect(told.usage).toMatchObject({ completion_tokens: 3, cost: formatUsd(computeCost(SCRIPTED_USAGE, SCRIPTED_RATES)) });
    expect(told.service.receipt).toBeDefined();
    await until('settled', async () => (await record(ok.id)).settled === true);
  });

  test('streamed responses: a closing response.usage that disagrees with the receipt ends the stream with the protocol\'s error event instead of response.completed; recorded, never settled; an honest one is relayed and settled', async () => {
    const ev = (name: string, data: object): string => `event: ${name}\ndata: ${JSON.stringify({ type: name, ...data })}\n\n`;
    const streaming = (told: Usage): Behaviour => async (ex) => {
      await ex.head(SSE_HEAD);
      await ex.data(ev('response.created', { sequence_number: 0, response: { id: 'resp_x', object: 'response', status: 'in_progress' } }));
      await ex.data(ev('response.output_text.delta', { sequence_number: 1, item_id: 'msg_x', output_index: 0, content_index: 0, delta: 'one two' }));
      const usage = { input_tokens: told.input_tokens, output_tokens: told.output_tokens, total_tokens: told.input_tokens + told.output_tokens, cost: formatUsd(computeCost(told, SCRIPTED_RATES)) };
      await ex.data(ev('response.completed', { sequence_number: 2, response: { id: 'resp_x', object: 'response', status: 'completed', usage, service: { request_id: ex.ticket.request_id } } }));
      await ex.trailer(Exchange.receiptTrailer(await ex.logReceipt()));
    };
    const body = JSON.stringify({ model: MODEL, input: 'hello', max_output_tokens: 8, stream: true });
    scripted.behaviour = streaming({ input_tokens: SCRIPTED_USAGE.input_tokens, output_tokens: 1 });
    const before = await snapshot();
    const { id, events } = await streamed(await post(body, toScripted(), 'responses'));
    expect(events).toHaveLength(3);
    expect(events.some((d) => d.includes('"usage"'))).toBe(false); // (the buyer is never told the lie)
    const err = JSON.parse(events[2]!) as { type: string; code: string; message: string; sequence_number: number };
    expect(err).toMatchObject({ type: 'error', code: 'bad_provider_response', message: 'usage.output_tokens is 1, the receipt says 3', sequence_number: 2 });
    expect(await record(id)).toMatchObject({ status: 'bad_provider_response', settled: false });
    await expectNothingSettled(before);
    // Control: the same stream telling the receipt's usage.
    scripted.behaviour = streaming(SCRIPTED_USAGE);
    const ok = await streamed(await post(body, toScripted(), 'responses'));
    const done = JSON.parse(ok.events.at(-1)!) as { type: string; response: { usage: { output_tokens: number; cost: string }; service: { receipt: unknown } } };
    expect(done.type).toBe('response.completed');
    expect(done.response.usage).toMatchObject({ output_tokens: 3, cost: formatUsd(computeCost(SCRIPTED_USAGE, SCRIPTED_RATES)) });
    expect(done.response.service.receipt).toBeDefined();
    await until('settled', async () => (await record(ok.id)).settled === true);
  });
});

describe('a provider that breaks off without a TRAILER: 502, settled from the node\'s log when it has a receipt', () => {
  test('closes the stream without answering, no receipt at the node → 502; record failed/provider_failed', async () => {
    scripted.behaviour = (ex) => ex.close();
    const before = await snapshot();
    const e = await expectError(await post(chatBody('silent'), toScripted()), 502, 'bad_provider_response', /did not answer/);
    const rec = await record(e.id);
    expect(rec).toMatchObject({ status: 'failed', error: { code: 'provider_failed' }, settled: false, receipt: null, cost: null });
    await expectNothingSettled(before);
  });

  test('resets mid-body after logging a `failed` receipt → 502; that receipt is fetched, verified and recorded, never settled: the buyer got none of the body (s23 h1)', async () => {
    let logged = '';
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data('{"id":"chatcmpl-scripted","object":"chat.comp');
      logged = await ex.logReceipt({ status: 'failed', usage: { input_tokens: 7, output_tokens: 1 } });
      ex.reset();
    };
    const before = await snapshot();
    const e = await expectError(await post(chatBody('reset'), toScripted()), 502, 'bad_provider_response', /broke off/);
    const rec = await record(e.id);
    const env = parseEnvelope(logged);
    if (!env.ok) throw new Error('the logged line is not an envelope');
    expect(rec).toMatchObject({ status: 'failed', settled: false, provider: scripted.providerId, usage: { prompt_tokens: 7, completion_tokens: 1, total_tokens: 8 }, cost: null, error: { code: 'answer_not_delivered', message: expect.stringMatching(/^the provider's answer broke off before the gateway had it whole, and the buyer got none of it: its failed receipt \(seq \d+, 0\.\d{6} USD\) is not settled$/) } });
    expect(rec.receipt).toEqual(env.value);
    expect(proxy.receiptPosts).toBe(0);
    expect(await marketReceipts()).toBe(before.receipts);
    expect((await fetch(`${marketUrl}/v1/receipts/${e.id}`)).status).toBe(404);
    expect(gw.records.hasJob(e.id)).toBe(false); // (nothing left to look for: its hold is gone)
  });

  test('a node that dies after its `completed` receipt is durable, with the whole body sent but not its trailer → 502, and the receipt is not settled (s23 h1: billed in full for a 502)', async () => {
    let logged = '';
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data(completion());
      logged = await ex.logReceipt();
      ex.reset();
    };
    const before = await snapshot();
    const e = await expectError(await post(chatBody('die at the trailer'), toScripted()), 502, 'bad_provider_response', /broke off/);
    const rec = await record(e.id);
    expect(rec).toMatchObject({ status: 'failed', settled: false, cost: null, error: { code: 'answer_not_delivered' } });
    expect(serializeEnvelope(rec.receipt!)).toBe(logged);
    expect(proxy.receiptPosts).toBe(0);
    expect(await marketReceipts()).toBe(before.receipts);
  });

  test('a node whose `completed` receipt is durable but whose HEAD never reached the gateway → 502, and the receipt is not settled (s23 h5: billed in full for a 502)', async () => {
    let logged = '';
    scripted.behaviour = async (ex) => {
      logged = await ex.logReceipt(); // what a node whose HEAD and body were lost on the way has
      ex.reset();
    };
    const before = await snapshot();
    const e = await expectError(await post(chatBody('lost before the head'), toScripted()), 502, 'bad_provider_response', /did not answer/);
    const rec = await record(e.id);
    expect(rec).toMatchObject({ status: 'failed', settled: false, cost: null, error: { code: 'answer_not_delivered' } });
    expect(serializeEnvelope(rec.receipt!)).toBe(logged);
    expect(proxy.receiptPosts).toBe(0);
    expect(await marketReceipts()).toBe(before.receipts);
  });

  test('a whole answer whose trailer was lost (its receipt withheld), relayed whole to the buyer by an Idempotency-Key retry from the node\'s record → the receipt is settled, once (s23 h5: never paid)', async () => {
    let logged = '';
    let firstId = '';
    scripted.behaviour = async (ex) => {
      firstId = ex.ticket.request_id;
      await ex.head(JSON_HEAD);
      await ex.data(completion());
      logged = await ex.logReceipt();
      ex.reset();
    };
    // The node is restarting: the gateway's own look for the receipt finds nothing.
    await scripted.answerLogWith({ status: 503, body: '{"error":{"code":"no_capacity","message":"restarting"}}' });
    const key = { 'idempotency-key': `lost-trailer-${Date.now()}` };
    const before = await snapshot();
    try {
      await expectError(await post(chatBody('lost trailer, retried'), { ...toScripted(), ...key }), 502, 'bad_provider_response', /broke off/);
      await new Promise((r) => setTimeout(r, RECEIPT_FETCH_MS + 400)); // the gateway's look is over
      expect(gw.records.isUndelivered(firstId)).toBe(true);
      // The retry: the node answers from its record (the first request's answer and receipt).
      scripted.behaviour = async (ex) => {
        await ex.head({ status: 200, headers: { 'content-type': 'application/json', 'x-request-id': firstId } });
        await ex.data(completion());
        await ex.trailer(Exchange.receiptTrailer(logged));
      };
      const retry = await post(chatBody('lost trailer, retried'), { ...toScripted(), ...key });
      expect(retry.status).toBe(200);
      expect(retry.headers.get('x-request-id')).toBe(firstId);
      await retry.text();
      await settledRecord(gw.url, firstId);
    } finally {
      await scripted.answerLogWith();
    }
    const rec = await record(firstId);
    expect(rec).toMatchObject({ status: 'completed', settled: true });
    expect(rec.error ?? null).toBeNull();
    expect(serializeEnvelope(rec.receipt!)).toBe(logged);
    expect(await marketHas(firstId)).toBe(true);
    expect(await marketReceipts()).toBe(before.receipts + 1);
    expect(gw.records.hasJob(firstId)).toBe(false);
    // The reconciler's later looks do not take it back.
    await new Promise((r) => setTimeout(r, 1500));
    expect(await record(firstId)).toMatchObject({ status: 'completed', settled: true });
  });

  test('closes cleanly mid-body, no receipt at the node → 502; record failed/provider_failed, nothing settled', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data('{"id":"chatcmpl-scripted"');
      await ex.close();
    };
    const before = await snapshot();
    const e = await expectError(await post(chatBody('truncated'), toScripted()), 502, 'bad_provider_response', /broke off: the stream ended before the TRAILER/);
    expect(await record(e.id)).toMatchObject({ status: 'failed', error: { code: 'provider_failed' }, settled: false, receipt: null });
    await expectNothingSettled(before);
  });

  test('the node\'s log answers 200 with a body that is not its JSON → looked for until the fetch window ends, record failed/provider_failed; entries that are not receipts → bad_provider_response; nothing settled, the gateway up', async () => {
    for (const body of ['not json', '{"receipts": "none"}', '[1, 2]', '{"receipts": [42, null, "x"]}']) {
      await scripted.answerLogWith({ status: 200, body });
      try {
        scripted.behaviour = (ex) => ex.close();
        const before = await snapshot();
        const e = await expectError(await post(chatBody(`log says ${body}`), toScripted()), 502, 'bad_provider_response', /did not answer/);
        const rec = await record(e.id);
        expect(rec, body).toMatchObject({ status: body.includes('[42') ? 'bad_provider_response' : 'failed', settled: false, receipt: null });
        if (!body.includes('[42')) expect(rec.error?.code).toBe('provider_failed');
        await expectNothingSettled(before);
      } finally {
        await scripted.answerLogWith();
      }
    }
  });

  test('the node\'s log has a receipt for the request, but not for this ticket → recorded bad_provider_response, not settled', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data('{"id":');
      await ex.logReceipt({ ticket_id: 'tkt-not-the-one-sent', status: 'failed', usage: { input_tokens: 7, output_tokens: 0 } });
      ex.reset();
    };
    const before = await snapshot();
    const e = await expectError(await post(chatBody('wrong log'), toScripted()), 502, 'bad_provider_response', /broke off/);
    expect(await record(e.id)).toMatchObject({ status: 'bad_provider_response', error: { code: 'bad_provider_response', message: expect.stringMatching(/ticket_id is tkt-not-the-one-sent/) }, settled: false, receipt: null });
    await expectNothingSettled(before);
  });

  test('streamed, reset after two events with a `cancelled` receipt logged → the events, then an SSE error event; settled from the log', async () => {
    const run = twoEventsCancelledThen((ex) => ex.reset());
    scripted.behaviour = run.behaviour;
    const before = await snapshot();
    const res = await post(chatBody('stream reset', { stream: true }), toScripted());
    const { id, events } = await streamed(res);
    expect(events).toHaveLength(3);
    expect(JSON.parse(events[2]!)).toEqual({ error: { code: 'bad_provider_response', message: expect.stringMatching(/stream broke off/) } });
    const rec = await record(id);
    expect(rec).toMatchObject({ status: 'cancelled', settled: true, usage: { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 } });
    expect(serializeEnvelope(rec.receipt!)).toBe(run.logged);
    expect(await marketReceipts()).toBe(before.receipts + 1);
  });

  test('streamed, reset after two events with a receipt that bills a third the gateway never received (lost in flight) → the events, an SSE error event; recorded, never settled (s24 hD: a paused gateway\'s buyer billed 1,398 tokens for 382)', async () => {
    let logged = '';
    scripted.behaviour = async (ex) => {
      await ex.head(SSE_HEAD);
      await ex.data(chunk('a'));
      await ex.data(chunk('b'));
      // What the node counted as sent: three events, the last lost with the connection.
      logged = await ex.logReceipt({ status: 'cancelled', usage: { input_tokens: 7, output_tokens: 3 }, response_sha256: sha256Hex(chunk('a') + chunk('b') + chunk('c')) });
      ex.reset();
    };
    const before = await snapshot();
    const res = await post(chatBody('stream lost in flight', { stream: true }), toScripted());
    const { id, events } = await streamed(res);
    expect(events).toHaveLength(3);
    expect(JSON.parse(events[2]!)).toEqual({ error: { code: 'bad_provider_response', message: expect.stringMatching(/stream broke off/) } });
    const rec = await waitFor('the receipt recorded', async () => {
      const r = await record(id);
      return r.receipt ? r : undefined;
    });
    expect(rec).toMatchObject({ status: 'failed', settled: false, cost: null, error: { code: 'answer_not_delivered', message: expect.stringMatching(/^the provider's stream broke off, and its receipt bills bytes the gateway never received/) } });
    expect(serializeEnvelope(rec.receipt!)).toBe(logged);
    expect(proxy.receiptPosts).toBe(0);
    expect(await marketReceipts()).toBe(before.receipts);
    expect(gw.records.hasJob(id)).toBe(false);
  });

  test('streamed, closed cleanly after [DONE] without a TRAILER, no receipt → the held [DONE] is replaced by an SSE error event; record failed/provider_failed', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head(SSE_HEAD);
      await ex.data(chunk('x'));
      await ex.data('data: [DONE]\n\n');
      await ex.close();
    };
    const before = await snapshot();
    const res = await post(chatBody('stream close', { stream: true }), toScripted());
    const { id, events } = await streamed(res);
    expect(events).toHaveLength(2);
    expect(JSON.parse(events[1]!)).toEqual({ error: { code: 'bad_provider_response', message: expect.stringMatching(/stream broke off: the stream ended before the TRAILER/) } });
    expect(await record(id)).toMatchObject({ status: 'failed', error: { code: 'provider_failed' }, settled: false, receipt: null });
    await expectNothingSettled(before);
  });

  test('streamed, a TRAILER with a verified `failed` receipt and the node\'s error → the events, then a provider_failed event (no [DONE]); settled', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head(SSE_HEAD);
      await ex.data(chunk('partial'));
      const line = await ex.logReceipt({ status: 'failed', usage: { input_tokens: 7, output_tokens: 1 } });
      await ex.trailer({ ...Exchange.receiptTrailer(line, 'failed'), error: { code: 'runtime_failed', message: 'the run failed: out of memory' } });
    };
    const before = await snapshot();
    const res = await post(chatBody('stream fail', { stream: true }), toScripted());
    const { id, events } = await streamed(res);
    expect(events).toHaveLength(2);
    expect(JSON.parse(events[1]!)).toEqual({ error: { code: 'provider_failed', message: expect.stringMatching(/ended failed: the run failed: out of memory/) } });
    expect(await record(id)).toMatchObject({ status: 'failed', settled: true, usage: { prompt_tokens: 7, completion_tokens: 1 } });
    expect(await marketReceipts()).toBe(before.receipts + 1);
  });

  test('a TRAILER with a verified `failed` receipt → 502 provider_failed carrying the receipt; settled for what it billed', async () => {
    const partial = '{"id":"chatcmpl-scripted","obj';
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data(partial);
      await ex.trailer(Exchange.receiptTrailer(await ex.logReceipt({ status: 'failed', usage: { input_tokens: 7, output_tokens: 0 } }), 'failed'));
    };
    const before = await snapshot();
    const res = await post(chatBody('failed run'), toScripted());
    const e = await expectError(res, 502, 'provider_failed', /ended failed/);
    const service = e.body.service as { request_id: string; receipt: DsseEnvelope };
    expect(service.request_id).toBe(e.id);
    const v = verifyReceipt(service.receipt, { provider: scripted.providerId });
    expect(v.ok && v.value.payload).toMatchObject({ status: 'failed', request_id: e.id });
    expect(await record(e.id)).toMatchObject({ status: 'failed', settled: true, receipt: service.receipt });
    expect(await marketReceipts()).toBe(before.receipts + 1);
  });
});

describe('a provider that goes silent is cut off after providerIdleMs; what it did is settled from its log', () => {
  const IDLE_MS = 600;
  const KEEPALIVE_MAX_MS = 2400;
  let quick: Gateway;
  let release: () => void = () => undefined;
  /** Holds the scripted node's handler until the test releases it (the gateway has reset the stream by then). */
  const silence = (): Promise<void> => new Promise<void>((r) => (release = r));
  const postQuick = (body: string): Promise<Response> => fetch(`${quick.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toScripted() }, body });
  beforeAll(async () => {
    quick = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: RECEIPT_FETCH_MS, providerIdleMs: IDLE_MS, providerKeepaliveMaxMs: KEEPALIVE_MAX_MS });
  });
  afterAll(async () => {
    await quick?.close(1000);
  });
  afterEach(() => release());

  test('no HEAD at all → 504 provider_timeout; record failed/provider_failed, nothing settled', async () => {
    scripted.behaviour = () => silence();
    const before = await snapshot();
    const e = await expectError(await postQuick(chatBody('say nothing')), 504, 'provider_timeout', new RegExp(`within ${IDLE_MS} ms`));
    const rec = await endedRecord(quick.url, e.id);
    expect(rec).toMatchObject({ status: 'failed', error: { code: 'provider_failed' }, settled: false, receipt: null, cost: null });
    await expectNothingSettled(before);
  });

  test('no HEAD from the first of the preferred providers (frozen) → the next one answers; the silent attempt is recorded, nothing charged for it (s24 hD: 504 while the next was idle)', async () => {
    scripted.behaviour = () => silence();
    const before = await snapshot();
    const res = await fetch(`${quick.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-prefer-providers': `${scripted.providerId},${node.providerId}` }, body: chatBody('frozen first') });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    expect(id).toMatch(/-f1$/);
    const body = (await res.json()) as { service: { receipt: DsseEnvelope } };
    expect(verifyReceipt(body.service.receipt, { provider: node.providerId }).ok).toBe(true);
    const first = await endedRecord(quick.url, id.replace(/-f1$/, ''));
    expect(first).toMatchObject({ status: 'failed', provider: scripted.providerId, error: { code: 'provider_failed' }, settled: false, cost: null }); // (what its node's log then said: no receipt)
    expect(await settledRecord(quick.url, id)).toMatchObject({ status: 'completed', provider: node.providerId });
    expect(await marketReceipts()).toBe(before.receipts + 1);
  });

  test('silent mid-body → 502 provider_timeout', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data('{"id":"chatcmpl-scripted"');
      await silence();
    };
    await expectError(await postQuick(chatBody('then nothing')), 502, 'provider_timeout', new RegExp(`sent nothing for ${IDLE_MS} ms`));
  });

  test('streamed, silent after two events with a `cancelled` receipt logged → the events, a provider_timeout event; settled from the log', async () => {
    const run = twoEventsCancelledThen(() => silence());
    scripted.behaviour = run.behaviour;
    const before = await snapshot();
    const res = await postQuick(chatBody('stall', { stream: true }));
    const { id, events } = await streamed(res);
    expect(events).toHaveLength(3);
    expect(JSON.parse(events[2]!)).toEqual({ error: { code: 'provider_timeout', message: expect.stringMatching(new RegExp(`sent nothing for ${IDLE_MS} ms`)) } });
    const rec = await settledRecord(quick.url, id);
    expect(rec).toMatchObject({ status: 'cancelled', usage: { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 } });
    expect(serializeEnvelope(rec.receipt!)).toBe(run.logged);
    expect(await marketReceipts()).toBe(before.receipts + 1);
  });

  test('a responses stream cut off ends with the responses protocol\'s error event, numbered after the last one relayed (s23 h2)', async () => {
    const ev = (name: string, data: object): string => `event: ${name}\ndata: ${JSON.stringify({ type: name, ...data })}\n\n`;
    scripted.behaviour = async (ex) => {
      await ex.head(SSE_HEAD);
      await ex.data(ev('response.created', { sequence_number: 0, response: { id: 'resp_x', status: 'in_progress' } }) + ev('response.output_text.delta', { sequence_number: 1, item_id: 'msg_x', output_index: 0, content_index: 0, delta: 'hi' }));
      await silence();
    };
    const res = await fetch(`${quick.url}/responses`, { method: 'POST', headers: { 'content-type': 'application/json', ...toScripted() }, body: JSON.stringify({ model: MODEL, input: 'stall', stream: true }) });
    expect(res.status).toBe(200);
    const events = (await res.text()).split('\n\n').filter(Boolean);
    expect(events).toHaveLength(3);
    const [head, data] = events[2]!.split('\n');
    expect(head).toBe('event: error');
    const err = JSON.parse(data!.slice('data: '.length));
    expect(err).toEqual({ type: 'error', code: 'provider_timeout', message: expect.stringMatching(new RegExp(`sent nothing for ${IDLE_MS} ms`)), param: null, sequence_number: 2, error: { code: 'provider_timeout', message: err.message } });
  });

  test('a provider that works in silence but sends keepalives (empty DATA frames) is never cut off: before its HEAD, and mid-body', async () => {
    /** Keepalives every 150 ms for `ms` (over twice IDLE_MS): a node in its queue, or computing a whole body. */
    const keepalives = async (ex: Exchange, ms: number): Promise<void> => {
      for (let t = 0; t < ms; t += 150) {
        await ex.data('');
        await new Promise((r) => setTimeout(r, 150));
      }
    };
    scripted.behaviour = async (ex) => {
      await keepalives(ex, 1500);
      await ex.head(JSON_HEAD);
      await keepalives(ex, 1500);
      await ex.data(completion());
      await ex.trailer(Exchange.receiptTrailer(await ex.logReceipt()));
    };
    const res = await postQuick(chatBody('think a long time'));
    expect(res.status).toBe(200);
    const body = (await res.json()) as { choices: { message: { content: string } }[]; service: { request_id: string; receipt: DsseEnvelope } };
    expect(body.choices[0]!.message.content).toBe('scripted');
    expect(verifyReceipt(body.service.receipt, { provider: scripted.providerId }).ok).toBe(true);
    expect(await settledRecord(quick.url, body.service.request_id)).toMatchObject({ status: 'completed' });
  });

  test('a provider that sends keepalives and nothing else is cut off once they have kept it the keepalive limit: before its HEAD (504) and mid-body (502); nothing settled (s23 h5: a stuck handler held the buyer for ever)', async () => {
    let stopped = false;
    const forever = async (ex: Exchange): Promise<void> => {
      while (!stopped) {
        try {
          await ex.data('');
        } catch {
          return;
        }
        await new Promise((r) => setTimeout(r, 150));
      }
    };
    try {
      scripted.behaviour = (ex) => forever(ex);
      let before = await snapshot();
      let started = Date.now();
      const e = await expectError(await postQuick(chatBody('stuck before the head')), 504, 'provider_timeout', new RegExp(`^the provider sent no answer, only keepalives, for ${KEEPALIVE_MAX_MS} ms$`));
      expect(Date.now() - started).toBeGreaterThanOrEqual(KEEPALIVE_MAX_MS - 50); // (they did keep it past IDLE_MS)
      expect(await endedRecord(quick.url, e.id)).toMatchObject({ status: 'failed', error: { code: 'provider_failed' }, settled: false, cost: null });
      await expectNothingSettled(before);

      scripted.behaviour = async (ex) => {
        await ex.head(JSON_HEAD);
        await ex.data('{"id":"chatcmpl-scripted",');
        await forever(ex);
      };
      before = await snapshot();
      started = Date.now();
      const mid = await expectError(await postQuick(chatBody('stuck mid-body')), 502, 'provider_timeout', new RegExp(`^the provider sent only keepalives for ${KEEPALIVE_MAX_MS} ms and was cut off$`));
      expect(Date.now() - started).toBeGreaterThanOrEqual(KEEPALIVE_MAX_MS - 50);
      expect(await endedRecord(quick.url, mid.id)).toMatchObject({ status: 'failed', settled: false, cost: null });
      await expectNothingSettled(before);
    } finally {
      stopped = true;
    }
  });

  test('a provider that keeps sending is never cut off, however long the answer takes in all', async () => {
    // Its own gateway with a roomier limit: the gaps must never come near it, whatever the load.
    const steady = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: RECEIPT_FETCH_MS, providerIdleMs: 2_000 });
    try {
      scripted.behaviour = async (ex) => {
        await ex.head(SSE_HEAD);
        // Nine gaps of 250 ms: the whole answer (2.25 s) takes longer than the limit, no gap comes close.
        for (let i = 0; i < 9; i++) {
          await ex.data(chunk(String(i)));
          await new Promise((r) => setTimeout(r, 250));
        }
        await ex.data('data: [DONE]\n\n');
        await ex.trailer(Exchange.receiptTrailer(await ex.logReceipt()));
      };
      const res = await fetch(`${steady.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toScripted() }, body: chatBody('slow but steady', { stream: true }) });
      const events = sseData(await res.text());
      expect(events.at(-1)).toBe('[DONE]');
      expect(events).toHaveLength(10);
    } finally {
      await steady.close(1000);
    }
  });
});

describe('the buyer leaves before the provider answers: what the node did is settled from its log, nothing else', () => {
  let release: () => void = () => undefined;
  afterEach(() => release());

  /** The request's record settles with the `cancelled` receipt the scripted node logged, and the market has it. */
  async function expectSettledFromLog(id: string, logged: string, usage: { prompt_tokens: number; completion_tokens: number }): Promise<void> {
    const rec = await settledRecord(gw.url, id);
    expect(rec).toMatchObject({ request_id: id, status: 'cancelled', provider: scripted.providerId, usage });
    expect(serializeEnvelope(rec.receipt!)).toBe(logged);
    expect(await marketHas(id)).toBe(true);
  }

  /** Posts to the scripted node, waits until its handler has done `behaviour` (and holds), then leaves; the request's id. */
  async function leaveAfter(behaviour: (ex: Exchange) => Promise<void>): Promise<string> {
    let id: string | undefined;
    const held = new Promise<void>((r) => (release = r));
    scripted.behaviour = async (ex) => {
      await behaviour(ex);
      id = ex.ticket.request_id;
      await held;
    };
    const ac = new AbortController();
    const res = fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toScripted() }, body: chatBody('wait for me'), signal: ac.signal });
    const gotIt = await waitFor('the scripted node to hold the request', async () => id);
    ac.abort();
    await expect(res).rejects.toThrow();
    return gotIt;
  }

  test('no work done: recorded abandoned / request_abandoned, nothing charged', async () => {
    const before = await snapshot();
    const id = await leaveAfter(async () => undefined);
    const rec = await endedRecord(gw.url, id);
    expect(rec).toMatchObject({ request_id: id, status: 'abandoned', provider: scripted.providerId, error: { code: 'request_abandoned' }, receipt: null, cost: null, settled: false });
    expect(await marketHas(id)).toBe(false);
    await expectNothingSettled(before);
  });

  test.each([false, true])('a buyer gone while the market was still granting the ticket (stream: %s): the provider is never asked, nothing charged', async (stream) => {
    const before = await snapshot();
    let id: string | undefined;
    let grant: () => void = () => undefined;
    const granted = new Promise<void>((r) => (grant = r));
    release = grant;
    proxy.ticket = async (g) => {
      id = g.request_id;
      await granted; // (the market is slow to answer)
      return g;
    };
    const ac = new AbortController();
    const res = fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toScripted() }, body: chatBody('never mind', { stream }), signal: ac.signal });
    const asked = await waitFor('the gateway to ask for a ticket', () => id);
    ac.abort();
    await expect(res).rejects.toThrow();
    await new Promise((r) => setTimeout(r, 300)); // (the gateway sees its buyer's socket close)
    grant();
    await waitFor('the gateway to record the request', async () => ((await fetch(`${gw.url}/requests/${asked}`)).status === 200 ? true : undefined));
    const rec = await endedRecord(gw.url, asked);
    expect(rec).toMatchObject({ request_id: asked, status: 'abandoned', error: { code: 'request_abandoned' }, receipt: null, cost: null, settled: false });
    // Its request never left the gateway: nothing is left to look for (a spend limit's hold goes at once).
    expect(gw.records.hasJob(asked)).toBe(false);
    expect(scripted.requests).toBe(before.requests);
    expect(await marketHas(asked)).toBe(false);
    await expectNothingSettled(before);
  });

  test('work done before the buyer left (a `cancelled` receipt in the node\'s log): that receipt is fetched, verified and settled', async () => {
    let logged = '';
    const id = await leaveAfter(async (ex) => {
      logged = await ex.logReceipt({ status: 'cancelled', usage: { input_tokens: 7, output_tokens: 0 } });
    });
    await expectSettledFromLog(id, logged, { prompt_tokens: 7, completion_tokens: 0 });
  });

  test('the buyer leaves during a JSON body, after the HEAD: the node\'s `cancelled` receipt is fetched, verified and settled', async () => {
    let logged = '';
    const gotIt = await leaveAfter(async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data('{"id":"chatcmpl-scripted","object":"chat.completion",');
      logged = await ex.logReceipt({ status: 'cancelled', usage: { input_tokens: 7, output_tokens: 2 } });
    });
    await expectSettledFromLog(gotIt, logged, { prompt_tokens: 7, completion_tokens: 2 });
  });
});

describe('failover: a provider that cannot start the request (503 no_capacity) hands it to the next', () => {
  const busy: Behaviour = async (ex) => {
    await ex.head({ status: 503, headers: { 'content-type': 'application/json' } });
    await ex.trailer({ error: { code: 'no_capacity', message: 'all 1 slots are busy' } });
  };

  test('X-Service-Prefer-Providers: the next in order answers; the refused attempt is recorded, nothing charged for it', async () => {
    scripted.behaviour = busy;
    const before = await snapshot();
    const waits: unknown[] = [];
    proxy.ticket = (g) => (waits.push((peekPayload(g.ticket as DsseEnvelope) as unknown as TicketPayload).routing.max_wait_ms), g);
    const res = await post(chatBody('fail over'), { 'x-service-prefer-providers': `${scripted.providerId},${node.providerId}`, 'x-service-max-wait-ms': '2500' });
    expect(res.status).toBe(200);
    // The busy provider had the buyer's wait: the next starts at once or refuses.
    expect(waits).toEqual([2500, 0]);
    const id = res.headers.get('x-request-id')!;
    expect(id).toMatch(/-f1$/); // the second attempt answered
    const body = (await res.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
    expect(body.service.request_id).toBe(id);
    expect(verifyReceipt(body.service.receipt, { provider: node.providerId }).ok).toBe(true);
    expect(scripted.requests).toBe(before.requests + 1);
    expect(await record(id)).toMatchObject({ status: 'completed', provider: node.providerId, settled: true });
    const first = await record(id.replace(/-f1$/, ''));
    expect(first).toMatchObject({ status: 'refused', provider: scripted.providerId, error: { code: 'no_capacity' }, receipt: null });
    expect(await marketReceipts()).toBe(before.receipts + 1);
  });

  test('a node that fails before any work (500 internal_error, no receipt) hands the request to the next provider; nothing charged for it', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head({ status: 500, headers: { 'content-type': 'application/json' } });
      await ex.trailer({ error: { code: 'internal_error', message: 'the node failed before doing any work' } });
    };
    const before = await snapshot();
    const res = await post(chatBody('node trouble'), { 'x-service-prefer-providers': `${scripted.providerId},${node.providerId}` });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    expect(id).toMatch(/-f1$/);
    expect(await record(id.replace(/-f1$/, ''))).toMatchObject({ status: 'refused', provider: scripted.providerId, error: { code: 'internal_error' }, receipt: null });
    expect(await marketReceipts()).toBe(before.receipts + 1);
  });

  test('a node that refuses the market\'s ticket (it trusts another market key) hands the request to the next provider; nothing charged for it', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head({ status: 401, headers: { 'content-type': 'application/json' } });
      await ex.trailer({ error: { code: 'ticket_invalid', message: 'this node trusts no marketplace key' } });
    };
    const before = await snapshot();
    const waits: unknown[] = [];
    proxy.ticket = (g) => (waits.push((peekPayload(g.ticket as DsseEnvelope) as unknown as TicketPayload).routing.max_wait_ms), g);
    const res = await post(chatBody('which market?'), { 'x-service-prefer-providers': `${scripted.providerId},${node.providerId}`, 'x-service-max-wait-ms': '2500' });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    expect(id).toMatch(/-f1$/);
    // The refusal came at once: the next provider keeps the buyer's whole wait.
    expect(waits).toEqual([2500, 2500]);
    expect(await record(id.replace(/-f1$/, ''))).toMatchObject({ status: 'refused', provider: scripted.providerId, error: { code: 'ticket_invalid' }, receipt: null });
    expect(await marketReceipts()).toBe(before.receipts + 1);
    // Alone, it is still 502 with the provider's code (never the buyer's 401).
    const alone = await post(chatBody('which market?'), toScripted());
    expect([alone.status, ((await alone.json()) as { error: { code: string } }).error.code]).toEqual([502, 'ticket_invalid']);
  });

  test('a provider whose node does not take the infer protocol (it answers the optimistic selection "na") is unreachable: the next one serves, nothing charged for the first', async () => {
    await scripted.speakInfer(false);
    try {
      const before = await snapshot();
      const waits: unknown[] = [];
      proxy.ticket = (g) => (waits.push((peekPayload(g.ticket as DsseEnvelope) as unknown as TicketPayload).routing.max_wait_ms), g);
      const outstanding = market.store.outstandingTickets(Date.now());
      const res = await post(chatBody('anyone there?'), { 'x-service-prefer-providers': `${scripted.providerId},${node.providerId}`, 'x-service-max-wait-ms': '2500' });
      expect(res.status).toBe(200);
      // No node queued it: the next provider keeps the buyer's whole wait (s23 h1).
      expect(waits).toEqual([2500, 2500]);
      // Its ticket never reached the provider: released at the market, not outstanding until it
      // expires (the second attempt's is settled): nothing of this request is outstanding.
      await waitFor('the unreached attempt\'s ticket released', () => (market.store.outstandingTickets(Date.now()) === outstanding ? true : undefined));
      const id = res.headers.get('x-request-id')!;
      expect(id).toMatch(/-f1$/);
      expect(scripted.requests).toBe(before.requests);
      const first = await record(id.replace(/-f1$/, ''));
      expect(first).toMatchObject({ status: 'failed', provider: scripted.providerId, error: { code: 'provider_unreachable', message: expect.stringContaining('/service/infer/1.0.0') }, receipt: null });
      expect(await marketReceipts()).toBe(before.receipts + 1);
      // Alone, it is 503 provider_unreachable in the error envelope.
      const alone = await post(chatBody('anyone?'), toScripted());
      expect([alone.status, ((await alone.json()) as { error: { code: string } }).error.code]).toEqual([503, 'provider_unreachable']);
    } finally {
      await scripted.speakInfer(true);
    }
  });

  test('a token count that is not a count → 502 bad_provider_response; nothing recorded, the gateway still counts at a good node', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data(JSON.stringify({ model: MODEL, count: -1 }));
      await ex.trailer({});
    };
    const before = await snapshot();
    const records = gw.records.size;
    await expectError(await post(JSON.stringify({ model: MODEL, prompt: 'hi' }), toScripted(), 'count_tokens'), 502, 'bad_provider_response', /tokenization is malformed/);
    expect(scripted.requests).toBe(before.requests + 1);
    expect(gw.records.size).toBe(records);
    const good = await post(JSON.stringify({ model: MODEL, prompt: 'hi' }), toNode(), 'count_tokens');
    expect(good.status).toBe(200);
    expect(((await good.json()) as { count: number }).count).toBeGreaterThan(0);
  });

  test('never outside the set: with only the busy provider preferred, its 503 is the answer', async () => {
    scripted.behaviour = busy;
    const before = await snapshot();
    const res = await post(chatBody('nowhere else'), toScripted());
    await expectError(res, 503, 'no_capacity');
    expect(scripted.requests).toBe(before.requests + 1);
    expect(await marketReceipts()).toBe(before.receipts);
  });
});

describe('hedges, estimates and long streams around misbehaving providers', () => {
  /** Busy for inference, but it answers token counts (an estimate asks the first candidate). */
  const busyButCounts: Behaviour = async (ex) => {
    if (ex.requestHead.endpoint === 'count_tokens' || ex.requestHead.endpoint === 'tokenize') {
      await ex.head(JSON_HEAD);
      await ex.data(JSON.stringify({ model: MODEL, count: 200 })); // more than the real node counts: its estimate covers the request there
      await ex.trailer({});
      return;
    }
    await ex.head({ status: 503, headers: { 'content-type': 'application/json' } });
    await ex.trailer({ error: { code: 'no_capacity', message: 'all 1 slots are busy' } });
  };

  test('a request made under X-Service-Estimate fails over like any other', async () => {
    scripted.behaviour = busyButCounts;
    const prefer = { 'x-service-prefer-providers': `${scripted.providerId},${node.providerId}` };
    const body = chatBody('estimate, then fail over');
    const er = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json', ...prefer }, body: JSON.stringify({ endpoint: 'CHAT', body: JSON.parse(body) }) });
    expect(er.status).toBe(200);
    const est = (await er.json()) as { estimate_id: string };
    const res = await post(body, { ...prefer, 'x-service-estimate': est.estimate_id });
    expect(res.status).toBe(200);
    const r = (await res.json()) as { service: { receipt: DsseEnvelope } };
    expect(verifyReceipt(r.service.receipt, { provider: node.providerId }).ok).toBe(true);
  });

  test('an estimate at a provider that cannot be reached is made at the next one', async () => {
    scripted.behaviour = async (ex) => ex.reset();
    const prefer = { 'x-service-prefer-providers': `${scripted.providerId},${node.providerId}` };
    const messages = [{ role: 'user', content: 'count me elsewhere' }];
    const er = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json', ...prefer }, body: JSON.stringify({ endpoint: 'CHAT', body: { model: MODEL, messages, max_tokens: 5 } }) });
    expect(er.status).toBe(200);
    const est = (await er.json()) as { input_tokens: number; can_start: { provider: string } };
    expect(est.can_start.provider).toBe(node.providerId);
    const counted = ((await (await post(JSON.stringify({ model: MODEL, messages }), toNode(), 'count_tokens')).json()) as { count: number }).count;
    expect(est.input_tokens).toBe(counted);
    // With only the unreachable provider allowed, the estimate fails as the provider did.
    const alone = await fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-prefer-providers': scripted.providerId }, body: JSON.stringify({ endpoint: 'CHAT', body: { model: MODEL, messages, max_tokens: 5 } }) });
    expect([alone.status, ((await alone.json()) as { error: { code: string } }).error.code]).toEqual([503, 'provider_unreachable']);
  });

  test('a hedged estimate where two providers price the model holds twice one run\'s worst case, or once when the key\'s cost cap or spend limit leaves less (execution then runs it once)', async () => {
    scripted.behaviour = busyButCounts;
    const body = JSON.stringify({ endpoint: 'CHAT', body: { model: MODEL, messages: [{ role: 'user', content: 'hedge me' }], max_tokens: 5 } });
    const ALL = 'sk-svc-v1-hedged-all-0123456789';
    const TIGHT_CAP = 'sk-svc-v1-tight-cap-0123456789';
    const TIGHT_BUDGET = 'sk-svc-v1-tight-budget-0123456789';
    const keyed = await createGateway({ market: marketUrl, port: 0, apiKeys: [ALL] });
    const estimate = async (key: string, hedge: boolean): Promise<{ max_hold: string; expected_cost: string; can_start: { provider: string } }> => {
      const r = await fetch(`${keyed.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}`, ...(hedge ? { 'x-service-hedge': '1' } : {}) }, body });
      expect([r.status, r.status === 200 ? '' : await r.text()]).toEqual([200, '']);
      return (await r.json()) as { max_hold: string; expected_cost: string; can_start: { provider: string } };
    };
    try {
      const once = await estimate(ALL, false);
      const worst = parseUsd(once.max_hold)!;
      const hedged = await estimate(ALL, true);
      expect(hedged.can_start.provider).toBe(once.can_start.provider);
      expect(hedged.max_hold).toBe(formatUsd(2n * worst));
      expect(hedged.expected_cost).toBe(once.expected_cost);
      keyed.setApiKeys([ALL, { key: TIGHT_CAP, maxCostMicroUsd: 2n * worst - 1n }, { key: TIGHT_BUDGET, spendLimitMicroUsd: worst }]);
      for (const key of [TIGHT_CAP, TIGHT_BUDGET]) expect((await estimate(key, true)).max_hold).toBe(formatUsd(worst));
    } finally {
      await keyed.close(1000);
    }
  });

  test('a hedge whose half caps cannot start it runs once with the whole cap', async () => {
    scripted.behaviour = busyButCounts;
    const messages = [{ role: 'user', content: 'hello there, how are you doing today' }];
    const count = ((await (await post(JSON.stringify({ model: MODEL, messages }), toNode(), 'count_tokens')).json()) as { count: number }).count;
    // The cap pays for the input and one output token; half of it pays for neither.
    const cap = formatUsd(computeCost({ input_tokens: count, output_tokens: 1 }, SCRIPTED_RATES));
    const body = JSON.stringify({ model: MODEL, messages, max_tokens: 1 });
    expect((await post(body, { ...toNode(), 'x-service-max-cost-usd': cap })).status).toBe(200); // control: unhedged, it runs
    const res = await post(body, { 'x-service-hedge': '1', 'x-service-max-cost-usd': cap });
    expect(res.status).toBe(200);
    const r = (await res.json()) as { service: { receipt: DsseEnvelope } };
    const v = verifyReceipt(r.service.receipt, { provider: node.providerId });
    if (!v.ok) throw new Error(v.error.message);
    expect(formatUsd(BigInt(v.value.payload.hold_micro_usd))).toBe(cap);
    // The run with the whole cap is not a failover: its own id (`-whole`), and a failover still
    // left to it (the busy scripted node may take its ticket first: then `-whole-f1` answers).
    const id = res.headers.get('x-request-id')!;
    expect(id).toMatch(/-whole(-f1)?$/);
    const base = id.replace(/-whole(-f1)?$/, '');
    // The hedged pair: both halves were refused before any work (one for its hold, one busy), and
    // each reads refused with its node's own code; neither charged anything.
    const halves = await Promise.all([base, `${base}-hedge`].map((h) => record(h)));
    expect(halves.map((h) => h.status)).toEqual(['refused', 'refused']);
    expect(halves.map((h) => h.error?.code).sort()).toEqual(['no_capacity', 'request_cost_limit_exceeded']);
    for (const h of halves) expect(h.receipt).toBeNull();
  });

  test('a hedge\'s other half still dialling when the winner answered: hedge_cancelled, its job (and any spend hold) gone at once, for its node never saw it', async () => {
    // A provider listed at an address that takes the connection and never answers its handshake.
    const stalled: import('node:net').Socket[] = [];
    const net = await import('node:net');
    const hole = net.createServer((s) => void stalled.push(s));
    await new Promise<void>((r) => hole.listen(0, '127.0.0.1', r));
    fs.mkdirSync(path.join(dir, 'hole'), { recursive: true });
    const silent = await ScriptedNode.start(path.join(dir, 'hole'));
    try {
      await silent.register(marketUrl, [`/ip4/127.0.0.1/tcp/${(hole.address() as import('node:net').AddressInfo).port}/p2p/${silent.host.peerId.toString()}`]);
      await waitForListed(marketUrl, [silent.providerId]);
      await scripted.heartbeat(marketUrl, false); // (the hedge's two: the real node and the silent one)
      const res = await post(chatBody('race a silent one'), { 'x-service-hedge': '1' });
      expect(res.status, await res.clone().text()).toBe(200);
      const winner = res.headers.get('x-request-id')!;
      await res.json();
      expect((await record(winner)).provider).toBe(node.providerId);
      const loser = winner.endsWith('-hedge') ? winner.slice(0, -'-hedge'.length) : `${winner}-hedge`;
      expect(await endedRecord(gw.url, loser)).toMatchObject({ status: 'abandoned', provider: silent.providerId, error: { code: 'hedge_cancelled' }, receipt: null });
      expect(gw.records.hasJob(loser)).toBe(false);
      expect(silent.requests).toBe(0);
    } finally {
      await silent.heartbeat(marketUrl, false); // (listed no more for the tests after this one)
      await scripted.heartbeat(marketUrl, true);
      await silent.stop();
      for (const s of stalled) s.destroy();
      await new Promise((r) => hole.close(r));
    }
  });

  test('a hedge whose other half was refused before the winner answered: that half reads refused with its node\'s code, its trailer read in full (sent a moment after its HEAD)', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head({ status: 503, headers: { 'content-type': 'application/json' } });
      await new Promise((r) => setTimeout(r, 50)); // the refusal's TRAILER comes later than its HEAD
      await ex.trailer({ error: { code: 'no_capacity', message: 'scripted: all slots busy' } });
    };
    const seen: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await post(JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: `race ${i}` }], max_tokens: 8 }), { 'x-service-hedge': '1' });
      expect(res.status).toBe(200);
      const winner = res.headers.get('x-request-id')!;
      const loser = await record(winner.endsWith('-hedge') ? winner.slice(0, -'-hedge'.length) : `${winner}-hedge`);
      expect(loser.provider).toBe(scripted.providerId);
      // Refused, with the node's own code and message; never mistaken for a refusal without its envelope.
      if (loser.status === 'refused') expect(loser.error).toEqual({ code: 'no_capacity', message: 'scripted: all slots busy' });
      else expect(loser).toMatchObject({ status: 'abandoned', error: { code: 'hedge_cancelled' } }); // the winner answered first
      expect(loser.receipt).toBeNull();
      seen.push(loser.status);
    }
    expect(seen).toContain('refused'); // the premise: at least once the refusal came before the winner's answer
  });

  test('an Idempotency-Key retry whose first provider has stopped taking requests is 503 idempotency_provider_unavailable: run nowhere else, billed nowhere; once it takes requests again, the retry goes there', async () => {
    const headers = { 'x-service-prefer-providers': `${scripted.providerId},${node.providerId}`, 'idempotency-key': `idem-moved-${crypto.randomUUID()}` };
    const body = chatBody('moved on');
    const first = await post(body, headers);
    expect(first.status).toBe(200);
    const firstId = first.headers.get('x-request-id')!;
    await first.json();
    expect(await record(firstId)).toMatchObject({ provider: scripted.providerId, settled: true });
    const before = await snapshot();
    await scripted.heartbeat(marketUrl, false);
    try {
      await expectError(await post(body, headers), 503, 'idempotency_provider_unavailable', new RegExp(`answered by provider ${scripted.providerId}, which cannot take the retry now .*retry later, or send the request under a new Idempotency-Key to run it again \\(and be billed again\\)$`));
      expect(scripted.requests).toBe(before.requests); // not dialled
      expect(await marketReceipts()).toBe(before.receipts); // run nowhere else
    } finally {
      await scripted.heartbeat(marketUrl, true);
    }
    // Back: the retry goes there (a real node answers it from its record; this scripted one just answers).
    const again = await post(body, headers);
    expect(again.status).toBe(200);
    const answer = (await again.json()) as { service: { receipt: DsseEnvelope } };
    expect(verifyReceipt(answer.service.receipt, { provider: scripted.providerId }).ok).toBe(true);
    expect(scripted.requests).toBe(before.requests + 1);
  });

  test('a stream under an Idempotency-Key whose HEAD names another provider\'s request, or one this gateway never sent: the header names this request, as its receipt does', async () => {
    // A request the real node answered: its id is one this gateway sent another provider.
    const theirs = await post(chatBody('theirs'), toNode());
    expect(theirs.status).toBe(200);
    const theirId = theirs.headers.get('x-request-id')!;
    await theirs.json();
    for (const named of [theirId, `r-${crypto.randomUUID()}`]) {
      scripted.behaviour = async (ex) => {
        await ex.head({ ...SSE_HEAD, headers: { ...SSE_HEAD.headers, 'x-request-id': named } });
        await ex.data(chunk('mine') + 'data: [DONE]\n\n');
        await ex.trailer(Exchange.receiptTrailer(await ex.logReceipt()));
      };
      const res = await post(chatBody('mine', { stream: true }), { ...toScripted(), 'idempotency-key': `idem-named-${crypto.randomUUID()}` });
      const { id, events } = await streamed(res);
      expect(id).not.toBe(named);
      expect(events.at(-1)).toBe('[DONE]');
      // The header's id is the request the gateway sent, settled with the scripted node's receipt for it.
      expect(await record(id)).toMatchObject({ request_id: id, provider: scripted.providerId, status: 'completed', settled: true });
    }
  });

  test('a second request under an Idempotency-Key whose first is still waiting for its provider is 409 idempotency_in_progress: it runs nowhere, nothing is billed twice', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    scripted.behaviour = async (ex) => {
      await gate; // the first attempt waits at its provider (queued, say) before its HEAD
      await honest(ex);
    };
    const key = `idem-running-${crypto.randomUUID()}`;
    const body = chatBody('only once');
    const before = await snapshot();
    const first = post(body, { ...toScripted(), 'idempotency-key': key });
    await waitFor('the first attempt at the scripted node', () => (scripted.requests > before.requests ? true : undefined));
    try {
      // Without the preference the market would ticket the other provider: it must not run there.
      const chatsAtNode = async (): Promise<number> =>
        [...(await (await fetch(`${node.opsUrl}/metrics`)).text()).matchAll(/^seller_requests_total\{endpoint="chat\/completions",[^}]*\} (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0);
      const chatsBefore = await chatsAtNode();
      for (const headers of [{ 'idempotency-key': key }, { ...toNode(), 'idempotency-key': key }]) {
        await expectError(await post(body, headers), 409, 'idempotency_in_progress', /still running/);
      }
      // The same key on another endpoint too: run at once it was billed twice (one after the other,
      // the provider that answered the first refuses it: idempotency_key_reused).
      const other = await post(JSON.stringify({ model: MODEL, prompt: 'other endpoint', max_tokens: 2 }), { ...toNode(), 'idempotency-key': key }, 'completions');
      await expectError(other, 409, 'idempotency_in_progress', /still running/);
      expect(scripted.requests).toBe(before.requests + 1);
      expect(await chatsAtNode()).toBe(chatsBefore);
    } finally {
      release();
    }
    const answered = await first;
    expect(answered.status).toBe(200);
    const id = answered.headers.get('x-request-id')!;
    await answered.json();
    expect(await record(id)).toMatchObject({ provider: scripted.providerId, status: 'completed', settled: true });
    expect(await marketReceipts()).toBe(before.receipts + 1); // the first: nothing else
  });

  test('hedge + Idempotency-Key: a retry goes to the provider whose answer the buyer got', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    scripted.behaviour = async (ex) => {
      await gate; // the primary (if it is this one) answers only after the hedge has won
      try {
        await honest(ex);
      } catch {
        // cancelled as the hedge's loser: its stream is gone
      }
    };
    const key = `idem-${crypto.randomUUID()}`;
    const body = chatBody('hedged and idempotent');
    const first = await post(body, { 'x-service-hedge': '1', 'idempotency-key': key });
    release();
    expect(first.status).toBe(200);
    expect(first.headers.get('x-request-id')).toMatch(/-hedge$/); // the winner was the hedge, not the first ticket's provider
    const a = (await first.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
    expect(verifyReceipt(a.service.receipt, { provider: node.providerId }).ok).toBe(true); // the real node won
    await record(a.service.request_id);
    const before = await snapshot();
    const retry = await post(body, { 'idempotency-key': key });
    expect(retry.status).toBe(200);
    const b = (await retry.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
    expect(b.service.request_id).toBe(a.service.request_id);
    expect(b.service.receipt).toEqual(a.service.receipt);
    expect(scripted.requests).toBe(before.requests); // the loser was not asked again
    // The same retry still asking for a hedge: answered from the record, nothing raced or billed.
    const receipts = await marketReceipts();
    const again = await post(body, { 'x-service-hedge': '1', 'idempotency-key': key });
    expect(again.status).toBe(200);
    expect(((await again.json()) as { service: { request_id: string } }).service.request_id).toBe(a.service.request_id);
    expect(scripted.requests).toBe(before.requests);
    expect(await marketReceipts()).toBe(receipts);
  });

  test('a hedge is not rerun unhedged when its other half may have started (it broke off before its HEAD, after the other half was refused)', async () => {
    const refusals = async (): Promise<number> => {
      const text = await (await fetch(`${node.opsUrl}/metrics`)).text();
      const m = /^seller_requests_total\{endpoint="chat\/completions",status="403"\} (\d+)/m.exec(text);
      return m ? Number(m[1]) : 0;
    };
    const refusedBefore = await refusals();
    let base = '';
    scripted.behaviour = async (ex) => {
      base = ex.ticket.request_id.replace(/-hedge$/, '');
      await waitFor('the real node to refuse its half', async () => ((await refusals()) > refusedBefore ? true : undefined));
      await ex.logReceipt({ status: 'cancelled', usage: { input_tokens: 7, output_tokens: 1 } });
      ex.reset();
    };
    const messages = [{ role: 'user', content: 'hello there, how are you doing today' }];
    const count = ((await (await post(JSON.stringify({ model: MODEL, messages }), toNode(), 'count_tokens')).json()) as { count: number }).count;
    const cap = formatUsd(computeCost({ input_tokens: count, output_tokens: 1 }, SCRIPTED_RATES));
    const before = await snapshot();
    const res = await post(JSON.stringify({ model: MODEL, messages, max_tokens: 1 }), { 'x-service-hedge': '1', 'x-service-max-cost-usd': cap });
    await res.arrayBuffer();
    expect(res.status).toBe(403);
    expect([base, `${base}-hedge`]).toContain(res.headers.get('x-request-id'));
    expect(scripted.requests).toBe(before.requests + 1);
    expect((await fetch(`${gw.url}/requests/${base}-whole`)).status).toBe(404);
    expect((await fetch(`${gw.url}/requests/${base}-f1`)).status).toBe(404);
    await record(base);
    await record(`${base}-hedge`);
  });

  const badReceiptStream = (frames: string[]): Behaviour => async (ex) => {
    await ex.head(SSE_HEAD);
    for (const f of frames) await ex.data(f);
    await ex.trailer(Exchange.receiptTrailer(ex.signedReceipt({ cost_micro_usd: '1' })));
  };

  test('CRLF-framed events are relayed live (the first reaches the buyer before [DONE] is sent) and their [DONE] is held like any other', async () => {
    let firstSeen!: () => void;
    const seen = new Promise<void>((r) => (firstSeen = r));
    scripted.behaviour = async (ex) => {
      await ex.head(SSE_HEAD);
      await ex.data(`data: ${JSON.stringify({ a: 1 })}\r\n\r\n`);
      await seen;
      await ex.data('data: [DONE]\r\n\r\n');
      await ex.trailer(Exchange.receiptTrailer(ex.signedReceipt({ cost_micro_usd: '1' })));
    };
    const res = await post(chatBody('crlf gated', { stream: true }), toScripted());
    const reader = res.body!.getReader();
    let text = '';
    const dec = new TextDecoder();
    for (let r = await reader.read(); !r.done; r = await reader.read()) {
      text += dec.decode(r.value, { stream: true });
      if (text.includes('\r\n\r\n')) firstSeen();
    }
    expect(text.startsWith('data: {"a":1}\r\n\r\n')).toBe(true);
    expect(text).not.toContain('[DONE]');
    expect(text).toMatch(/data: \{"error":\{"code":"bad_provider_response"/);
  });

  test('[DONE] followed by extra line ends is still the closing event, held', async () => {
    scripted.behaviour = badReceiptStream([chunk('x'), 'data: [DONE]\n\n\n']);
    const text = await (await post(chatBody('done and more', { stream: true }), toScripted())).text();
    expect(text).not.toContain('[DONE]');
    expect(sseData(text).at(-1)).toMatch(/"code":"bad_provider_response"/);
  });

  test('a last event without its blank line: relayed as it is, and the error event still comes on a line of its own', async () => {
    scripted.behaviour = badReceiptStream([chunk('a'), 'data: {"b":2}']); // the last event never finished
    const text = await (await post(chatBody('open event', { stream: true }), toScripted())).text();
    expect(text).toContain('data: {"b":2}\n\ndata: {"error":');
    expect(JSON.parse(sseData(text).at(-1)!)).toMatchObject({ error: { code: 'bad_provider_response' } });
  });

  test('an event larger than the gateway holds (over 4 MiB) is relayed as it comes: the buyer has part of it before its blank line is even sent', async () => {
    const piece = 'y'.repeat(60_000);
    const frames = ['data: ', ...Array.from({ length: 80 }, () => piece)];
    let buyerHasPart!: () => void;
    const partRelayed = new Promise<void>((r) => (buyerHasPart = r));
    scripted.behaviour = async (ex) => {
      await ex.head(SSE_HEAD);
      for (const f of frames) await ex.data(f);
      await partRelayed; // the event ends only once the buyer holds a good part of it
      await ex.data('\n\n');
      await ex.trailer(Exchange.receiptTrailer(await ex.logReceipt()));
    };
    const res = await post(chatBody('huge event, gated', { stream: true }), toScripted());
    const reader = res.body!.getReader();
    const got: Uint8Array[] = [];
    let n = 0;
    for (let r = await reader.read(); !r.done; r = await reader.read()) {
      got.push(r.value);
      n += r.value.length;
      if (n >= 1 << 20) buyerHasPart();
    }
    expect(Buffer.concat(got).toString()).toBe([...frames, '\n\n'].join(''));
    expect((await record(res.headers.get('x-request-id')!)).status).toBe('completed');
  });

  test('responses stream: a closing event larger than a frame is still held, so a bad receipt ends the stream with the error instead', async () => {
    const big = 'x'.repeat(200_000);
    scripted.behaviour = async (ex) => {
      await ex.head({ status: 200, headers: { 'content-type': 'text/event-stream', 'x-service-stream-mode': 'live' } });
      await ex.data(`event: response.output_text.delta\ndata: ${JSON.stringify({ type: 'response.output_text.delta', delta: 'hi' })}\n\n`);
      const closing = `event: response.completed\ndata: ${JSON.stringify({ type: 'response.completed', response: { output: [{ content: [{ text: big }] }] } })}\n\n`;
      // Split across DATA frames, as a node's frame size limit would.
      for (let i = 0; i < closing.length; i += 60_000) await ex.data(closing.slice(i, i + 60_000));
      await ex.trailer(Exchange.receiptTrailer(ex.signedReceipt({ cost_micro_usd: '1' })));
    };
    const res = await post(JSON.stringify({ model: MODEL, input: 'hi', stream: true }), toScripted(), 'responses');
    const text = await res.text();
    expect(text).toMatch(/^event: response\.output_text\.delta\n/);
    expect(text).not.toContain('event: response.completed');
    expect(sseData(text).at(-1)).toMatch(/"code":"bad_provider_response"/);
  });
});

describe('a provider that answers an HTTP status without an error envelope: 502 bad_provider_response', () => {
  /** HEAD `head`, then the TRAILER `trailer` (or, when undefined, a close without one). */
  const answers = (head: JsonObject, trailer?: JsonObject, data?: string): Behaviour => async (ex) => {
    await ex.head(head);
    if (data !== undefined) await ex.data(data);
    await (trailer === undefined ? ex.close() : ex.trailer(trailer));
  };
  const cases: [string, Behaviour, RegExp][] = [
    ['HEAD 500, empty TRAILER', answers({ status: 500 }, {}), /answered HTTP 500 without an error/],
    ['HEAD 503, then the stream closes without a TRAILER', answers({ status: 503, headers: { 'content-type': 'application/json' } }), /answered HTTP 503 without an error/],
    ['HEAD 500, TRAILER whose error is a string', answers({ status: 500 }, { error: 'boom' }), /answered HTTP 500 without an error/],
    ['HEAD 500, TRAILER whose error has no code', answers({ status: 500 }, { error: { message: 'no code' } }), /answered HTTP 500 without an error/],
    ['HEAD 302 with an error envelope (not an error status)', answers({ status: 302 }, { error: { code: 'moved', message: 'elsewhere' } }), /answered HTTP 302 without an error/],
    ['HEAD without a status', answers({ headers: {} }, { error: { code: 'oops', message: 'x' } }), /answered HTTP 0 without an error/],
    ['HEAD status "200" as a string', answers({ status: '200', headers: { 'content-type': 'application/json' } }, {}, completion()), /answered HTTP 0 without an error/],
  ];
  test.each(cases)('%s', refusedAnswerCase);

  test('control: a refusal with its error envelope is relayed with its status and code, recorded `refused`', async () => {
    scripted.behaviour = async (ex) => {
      await ex.head({ status: 429, headers: { 'content-type': 'application/json' } });
      await ex.trailer({ error: { code: 'no_capacity', message: 'scripted: busy' } });
    };
    const e = await expectError(await post(chatBody('busy'), toScripted()), 429, 'no_capacity', /^scripted: busy$/);
    expect(await record(e.id)).toMatchObject({ status: 'refused', error: { code: 'no_capacity', message: 'scripted: busy' }, settled: false });
    expect(proxy.receiptPosts).toBe(0);
  });

  test('tokenize and count_tokens: a refusal is relayed with its status and code; one without an envelope is 502 bad_provider_response; nothing recorded', async () => {
    const records = gw.records.size;
    scripted.behaviour = answers({ status: 400, headers: { 'content-type': 'application/json' } }, { error: { code: 'invalid_request', message: 'scripted: messages: expected an array' } });
    for (const endpoint of ['tokenize', 'count_tokens']) {
      const [status, error] = await errorOf(await post(JSON.stringify({ model: MODEL, prompt: 'hi' }), toScripted(), endpoint));
      expect([status, error]).toEqual([400, { code: 'invalid_request', message: 'scripted: messages: expected an array' }]);
    }
    scripted.behaviour = answers({ status: 500 }, {});
    for (const endpoint of ['tokenize', 'count_tokens']) {
      const [status, error] = await errorOf(await post(JSON.stringify({ model: MODEL, prompt: 'hi' }), toScripted(), endpoint));
      expect([status, error.code, error.message]).toEqual([502, 'bad_provider_response', expect.stringMatching(/answered HTTP 500 without an error/)]);
    }
    expect(gw.records.size).toBe(records);
  });
});

// ---- the market ---------------------------------------------------------------------------------

describe('a market whose ticket is not what was asked for: 502 bad_market_response, nothing recorded or charged', () => {
  const payloadOf = (g: TicketGrant): TicketPayload => peekPayload(g.ticket) as unknown as TicketPayload;
  /** The grant with its ticket changed and signed again by the market's own key (or `seed`). */
  const resigned = (change: (t: TicketPayload, g: TicketGrant) => TicketPayload, seed?: Uint8Array) => (g: TicketGrant) => ({
    ...g,
    ticket: signTicket(change(payloadOf(g), g), { keyid: market.publicKey, seed: seed ?? marketSeed }),
  });
  const otherKey = new Uint8Array(crypto.randomBytes(32));

  const cases: [string, (g: TicketGrant) => unknown, RegExp, Record<string, string>?][] = [
    ['signed by a key that is not the market\'s', resigned((t) => t, otherKey), /does not verify: signature_invalid/],
    ['its payload changed after signing', (g) => ({ ...g, ticket: { ...g.ticket, payload: toBase64(utf8(canonicalize({ ...payloadOf(g), max_cost_micro_usd: '1' }))) } }), /does not verify: signature_invalid/],
    ['for another body', resigned((t) => ({ ...t, body_sha256: other('another body') })), /does not verify: ticket_body_mismatch/],
    ['for another provider than the one to dial', resigned((t) => ({ ...t, provider: node.providerId })), /does not verify: ticket_wrong_provider/],
    ['expired', resigned((t) => ({ ...t, issued_at: Date.now() - 200_000, expires_at: Date.now() - 100_000 })), /does not verify: ticket_expired/],
    ['for another model', resigned((t) => ({ ...t, model: 'other/model' })), /for another request/],
    ['for another endpoint', resigned((t) => ({ ...t, endpoint: 'completions' })), /for another request/],
    ['whose request id is not the grant\'s', (g) => ({ ...g, request_id: `${g.request_id}-x` }), /for another request/],
    ['for another request (ticket and grant agree on an id that is not this request\'s)', (g) => {
      const id = `req-${crypto.randomUUID()}`;
      return { ...resigned((t) => ({ ...t, request_id: id }))(g), request_id: id };
    }, /for another request/],
    ['holding more than X-Service-Max-Cost-Usd', resigned((t) => ({ ...t, max_cost_micro_usd: String(BigInt(t.max_cost_micro_usd) + 1n) })), /holds 101 micro-USD, above X-Service-Max-Cost-Usd/, { 'x-service-max-cost-usd': '0.0001' }],
    ['with a peer id that is not the provider\'s', (g) => ({ ...g, peer_id: node.peerId }), /is not provider/],
    ['malformed (no envelope)', (g) => ({ ...g, ticket: 'not an envelope' }), /ticket is malformed/],
    ['with rates that are not micro-USD decimals', (g) => ({ ...g, rates: { input_per_mtok: '1.5', output_per_mtok: '600000' } }), /ticket rates is malformed/],
    ['with per-unit rates that are not micro-USD decimals', (g) => ({ ...g, rates: { ...g.rates, per_unit: { image: -1 } } }), /ticket rates is malformed/],
    // The node enforces only the routing in the ticket: one that drops or weakens the buyer's controls would have them served past them.
    ['without the price ceiling the buyer asked for', resigned((t) => ({ ...t, routing: {} })), /does not carry the routing asked for \(max_input_price_micro_usd_per_mtok: asked "100000000", the ticket has none\)/, { 'x-service-max-input-price-per-million-usd': '100' }],
    ['with the price ceiling raised', resigned((t) => ({ ...t, routing: { ...t.routing, max_output_price_micro_usd_per_mtok: '900000000' } })), /max_output_price_micro_usd_per_mtok: asked "100000000", the ticket has "900000000"/, { 'x-service-max-output-price-per-million-usd': '100' }],
    ['without the attestation tier asked for', resigned((t) => ({ ...t, routing: {} })), /min_attestation_tier: asked "T1", the ticket has none/, { 'x-service-min-att-tier': '1' }],
    ['with another quantization than asked (compared as its bucket)', resigned((t) => ({ ...t, routing: { ...t.routing, quantization: 'q4-k-m' } })), /quantization: asked "f32", the ticket has "q4-k-m"/, { 'x-service-quant': 'F32' }],
  ];
  test.each(cases)('%s', async (name, rewrite, message, headers) => {
    proxy.ticket = rewrite;
    const before = await snapshot();
    const loggedBefore = scripted.log.size;
    const e = await expectError(await post(chatBody(name), { ...toScripted(), ...headers }), 502, 'bad_market_response', message);
    const missing = await fetch(`${gw.url}/requests/${e.id}`);
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as { error: { code: string } }).error.code).toBe('request_not_found');
    expect(scripted.requests).toBe(before.requests); // the provider was never dialled
    expect(proxy.receiptPosts).toBe(0);
    expect(await marketHas(e.id)).toBe(false);
    expect(await marketReceipts()).toBe(before.receipts);
    expect(scripted.log.size).toBe(loggedBefore);
  });

  test("a gateway with --account refuses a ticket the market issued under another account (Idempotency-Keys are kept per account): 502, nobody dialled", async () => {
    const g = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: RECEIPT_FETCH_MS, account: 'buyer-x' });
    try {
      proxy.ticket = resigned((t) => ({ ...t, account: 'dev' }));
      const before = await snapshot();
      const res = await fetch(`${g.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toScripted() }, body: chatBody('another account') });
      await expectError(res, 502, 'bad_market_response', /the marketplace's ticket is for account "dev", not "buyer-x"/);
      expect(scripted.requests).toBe(before.requests);
      proxy.ticket = undefined; // the market's own ticket, under buyer-x: served
      const ok = await fetch(`${g.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toNode() }, body: chatBody('own account') });
      expect(ok.status).toBe(200);
      await ok.arrayBuffer();
    } finally {
      await g.close(1000);
    }
  });

  test('a valid ticket for a provider outside X-Service-Prefer-Providers is never used: 503 no_provider, nobody dialled, nothing recorded or charged', async () => {
    // The market's own key signs a ticket for the scripted node while the buyer named only the real one.
    proxy.ticket = (g) => ({ ...resigned((t) => ({ ...t, provider: scripted.providerId }))(g), provider: scripted.providerId, peer_id: scripted.host.peerId.toString() });
    const before = await snapshot();
    const e = await expectError(await post(chatBody('outside the set'), toNode()), 503, 'no_provider', /outside X-Service-Prefer-Providers/);
    expect((await fetch(`${gw.url}/requests/${e.id}`)).status).toBe(404);
    expect(scripted.requests).toBe(before.requests);
    expect(proxy.receiptPosts).toBe(0);
    expect(await marketReceipts()).toBe(before.receipts);
  });

  test('a ticket naming an earlier request\'s id is refused, and that request\'s record stays as it was', async () => {
    const first = await post(chatBody('first'), toNode());
    expect(first.status).toBe(200);
    const firstId = first.headers.get('x-request-id')!;
    await first.json();
    const settled = await record(firstId);
    expect(settled).toMatchObject({ status: 'completed', settled: true });
    proxy.ticket = (g) => ({ ...resigned((t) => ({ ...t, request_id: firstId }))(g), request_id: firstId });
    const before = await snapshot();
    await expectError(await post(chatBody('second'), toScripted()), 502, 'bad_market_response', /for another request/);
    expect(scripted.requests).toBe(before.requests);
    expect(await record(firstId)).toEqual(settled);
  });
});

describe('settlement: POST /v1/receipts failing is retried, refused is not, and the record says which', () => {
  async function run(answer: (attempt: number) => 'forward' | 'drop' | { status: number; body?: unknown }): Promise<{ id: string; rec: RequestRecord; receipt: DsseEnvelope }> {
    proxy.receipt = answer;
    const res = await post(chatBody('settle me'), toNode());
    // The buyer has the answer and its verified receipt whatever the market did with it.
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    const body = (await res.json()) as { service: { receipt: DsseEnvelope } };
    expect(verifyReceipt(body.service.receipt, { provider: node.providerId }).ok).toBe(true);
    const rec = await record(id);
    expect(rec).toMatchObject({ status: 'completed', receipt: body.service.receipt });
    return { id, rec, receipt: body.service.receipt };
  }

  test('the buyer\'s answer never waits for the market: body and stream end while the receipt POST is held', async () => {
    for (const stream of [false, true]) {
      let release!: () => void;
      const hold = new Promise<void>((r) => (release = r));
      proxy.reset();
      proxy.receipt = () => ({ hold });
      const res = await post(chatBody(`held settle ${stream}`, stream ? { stream: true } : {}), toNode());
      expect(res.status).toBe(200);
      const id = res.headers.get('x-request-id')!;
      const text = await res.text(); // the whole answer, [DONE] included, while the market has not answered
      if (stream) expect(sseData(text).at(-1)).toBe('[DONE]');
      else expect((JSON.parse(text) as { service: { request_id: string } }).service.request_id).toBe(id);
      await waitFor('the receipt POST to reach the market', async () => (proxy.receiptPosts === 1 ? true : undefined));
      expect(await marketHas(id)).toBe(false);
      release();
      expect(await record(id)).toMatchObject({ status: 'completed', settled: true }); // GET waits for the settlement
      expect(await marketHas(id)).toBe(true);
    }
  });

  test('closing waits for a settlement at most its grace: a held receipt POST cannot keep a gateway from stopping', async () => {
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    proxy.receipt = () => ({ hold });
    const warned: string[] = [];
    const g = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: RECEIPT_FETCH_MS, logger: { info: () => {}, warn: (_o, msg) => warned.push(msg ?? ''), error: () => {} } });
    try {
      const res = await fetch(`${g.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toNode() }, body: chatBody('held while closing') });
      expect(res.status).toBe(200);
      const id = res.headers.get('x-request-id')!;
      await res.arrayBuffer();
      await waitFor('the receipt POST to reach the market', async () => (proxy.receiptPosts === 1 ? true : undefined));
      // Resolves by the grace, not by the market: the POST stays held until after it returns
      // (without the grace this would wait for the release below, forever).
      expect(await settledWithin(g.close(300), 10_000)).toBe(true);
      expect(warned).toContain('settlements still running after the grace period are stopped');
      // Stopping the settlements ends the POST under way (not its own 10 s timeout): none is left running.
      expect(warned).not.toContain('gateway closed with settlements still running');
      expect(warned).toContain('receipt not settled with the marketplace');
      release();
      // The held POST goes through once released: later tests count the market's receipts.
      await waitFor('the released receipt to reach the market', async () => ((await marketHas(id)) ? true : undefined));
    } finally {
      release();
    }
  });

  test('an Idempotency-Key retry answered while the first receipt\'s POST is still held posts nothing of its own: one POST in all', async () => {
    for (const stream of [false, true]) {
      proxy.reset();
      let release!: () => void;
      const hold = new Promise<void>((r) => (release = r));
      proxy.receipt = () => ({ hold });
      const headers = { ...toNode(), 'idempotency-key': `idem-held-${crypto.randomUUID()}` };
      const body = chatBody(`retried while settling ${stream}`, stream ? { stream: true } : {});
      /** Posts the request; its x-request-id and the receipt it was answered with. */
      const ask = async (): Promise<{ id: string; receipt: unknown }> => {
        const res = await post(body, headers);
        expect(res.status).toBe(200);
        const id = res.headers.get('x-request-id')!;
        if (!stream) return { id, receipt: ((await res.json()) as { service: { receipt: unknown } }).service.receipt };
        expect(sseData(await res.text()).at(-1)).toBe('[DONE]');
        return { id, receipt: undefined }; // a stream's receipt is in its record
      };
      try {
        const first = await ask();
        await waitFor('the first receipt POST to reach the market', async () => (proxy.receiptPosts === 1 ? true : undefined));
        // The retry, while that POST is held: answered at once with the first request's receipt.
        const retry = await ask();
        if (!stream) expect(retry.receipt).toEqual(first.receipt); // a stream's: its record, compared below
        release();
        // Each GET waits for its request's settlement, so every POST made is counted by then.
        const settled = await record(first.id);
        expect(settled).toMatchObject({ request_id: first.id, status: 'completed', settled: true });
        expect(await record(retry.id)).toEqual(settled);
        expect(proxy.receiptPosts, `stream: ${stream}`).toBe(1);
        expect(await marketHas(first.id)).toBe(true);
      } finally {
        release();
      }
    }
  });

  test('a 503 with the market\'s envelope, then success: retried once, settled', async () => {
    const { id, rec } = await run((n) => (n === 1 ? { status: 503, body: { error: { code: 'unavailable', message: 'try again' } } } : 'forward'));
    expect(proxy.receiptPosts).toBe(2);
    expect(rec.settled).toBe(true);
    expect(rec.settlement_error).toBeUndefined();
    expect(await marketHas(id)).toBe(true);
  });

  test('the connection dropped on the first POST, then success: retried, settled', async () => {
    const { id, rec } = await run((n) => (n === 1 ? 'drop' : 'forward'));
    expect(proxy.receiptPosts).toBe(2);
    expect(rec.settled).toBe(true);
    expect(await marketHas(id)).toBe(true);
  });

  test('a 500 without an envelope every time: three tries, then recorded unsettled (bad_market_response)', async () => {
    const { id, rec } = await run(() => ({ status: 500, body: 'upstream exploded' }));
    expect(proxy.receiptPosts).toBe(3);
    expect(rec.settled).toBe(false);
    expect(rec.settlement_error).toMatchObject({ code: 'bad_market_response', message: expect.stringMatching(/HTTP 500/) });
    expect(await marketHas(id)).toBe(false);
  });

  test('a 4xx refusal with its code: not retried, recorded unsettled with that code', async () => {
    const { id, rec } = await run(() => ({ status: 400, body: { error: { code: 'receipt_ticket_mismatch', message: 'scripted refusal' } } }));
    expect(proxy.receiptPosts).toBe(1);
    expect(rec.settled).toBe(false);
    expect(rec.settlement_error).toEqual({ code: 'receipt_ticket_mismatch', message: 'scripted refusal' });
    expect(await marketHas(id)).toBe(false);
  });

  test('a 429 (rate limited) or 408 with the market\'s envelope is not a refusal: tried again, and settled once the market takes it', async () => {
    for (const status of [429, 408]) {
      proxy.reset();
      const { id, rec } = await run((n) => (n <= 3 ? { status, body: { error: { code: 'rate_limited', message: 'wait' } } } : 'forward'));
      expect(proxy.receiptPosts, String(status)).toBe(3); // the request's own three tries
      expect(rec.settled).toBe(false);
      expect(rec.settlement_error?.code).toBe('rate_limited');
      // Still watched (a 4xx refusal would have dropped it): the reconciler posts it again later.
      expect(gw.records.hasJob(id), String(status)).toBe(true);
    }
  });

  test('an acknowledgement for another request or another cost is not a settlement: recorded settlement_mismatch', async () => {
    for (const ack of [{ ok: true, request_id: 'req-someone-else' }, { ok: true, cost_micro_usd: '999999999' }]) {
      const { rec } = await run(() => ({ status: 200, body: ack }));
      expect(rec.settled, JSON.stringify(ack)).toBe(false);
      expect(rec.settlement_error).toMatchObject({ code: 'settlement_mismatch', message: expect.stringMatching(/^the marketplace acknowledged (request req-someone-else|a cost of 999999999 micro-USD), not this receipt's/) });
    }
    // An acknowledgement that names this receipt's request and cost settles it.
    const { rec } = await run(() => 'forward');
    expect(rec.settled).toBe(true);
  });

  test('200 without ok: true: not retried, recorded settlement_refused', async () => {
    const { id, rec } = await run(() => ({ status: 200, body: { ok: false } }));
    expect(proxy.receiptPosts).toBe(1);
    expect(rec.settled).toBe(false);
    expect(rec.settlement_error?.code).toBe('settlement_refused');
    expect(await marketHas(id)).toBe(false);
  });
});

describe('reconciliation: a receipt the request itself could not settle is settled later', () => {
  let rg: Gateway;
  const UNIT_MS = 250;
  beforeAll(async () => {
    rg = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: RECEIPT_FETCH_MS, reconcileUnitMs: UNIT_MS });
  });
  afterAll(async () => {
    await rg?.close(1000);
  });
  const rpost = (body: string, headers: Record<string, string>) => fetch(`${rg.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const rrecord = (id: string): Promise<RequestRecord> => gatewayRecord(rg.url, id);

  test("a node that made its receipt durable, then died before the trailer and came back after the gateway stopped asking: the receipt is found and recorded, never settled (the buyer got a 502 and none of the body), also after the gateway's restart", async () => {
    let logged = '';
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data('{"id":"chatcmpl-scripted","object":"chat.comp');
      logged = await ex.logReceipt({ status: 'completed', usage: { input_tokens: 9, output_tokens: 4 } });
      ex.reset();
    };
    // The node's log is out of reach while the request's own path looks for the receipt.
    await scripted.answerLogWith({ status: 503, body: '{"error":{"code":"no_capacity","message":"restarting"}}' });
    let id: string;
    const before = await snapshot();
    try {
      const res = await rpost(chatBody('crash after fsync'), toScripted());
      expect(res.status).toBe(502);
      id = res.headers.get('x-request-id')!;
      expect(await rrecord(id)).toMatchObject({ status: 'failed', error: { code: 'provider_failed' }, settled: false, receipt: null });
      expect(await marketHas(id)).toBe(false);
      expect(rg.records.unsettledCount).toBeGreaterThan(0);
    } finally {
      await scripted.answerLogWith(); // the node is back
    }
    const rec = await waitFor('the reconciled record', async () => {
      const r = await rrecord(id);
      return r.receipt ? r : undefined;
    });
    expect(rec).toMatchObject({ status: 'failed', settled: false, cost: null, provider: scripted.providerId, usage: { prompt_tokens: 9, completion_tokens: 4, total_tokens: 13 }, error: { code: 'answer_not_delivered' } });
    expect(serializeEnvelope(rec.receipt!)).toBe(logged);
    expect(await marketHas(id)).toBe(false);
    expect(await marketReceipts()).toBe(before.receipts);
    await waitFor('the job dropped', () => (rg.records.unsettledCount === 0 ? true : undefined));
  });

  test('a node whose `cancelled` receipt is durable only after the gateway stopped asking (the buyer left; a slow disk): the reconciler finds it and settles it', async () => {
    let id: string | undefined;
    let logged = '';
    let logIt: () => void = () => undefined;
    const late = new Promise<void>((r) => (logIt = r));
    scripted.behaviour = async (ex) => {
      id = ex.ticket.request_id;
      await late;
      logged = await ex.logReceipt({ status: 'cancelled', usage: { input_tokens: 5, output_tokens: 0 } });
    };
    const before = await snapshot();
    const ac = new AbortController();
    const res = fetch(`${rg.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toScripted() }, body: chatBody('a slow receipt'), signal: ac.signal });
    const gotIt = await waitFor('the scripted node to hold the request', async () => id);
    ac.abort();
    await expect(res).rejects.toThrow();
    // The request's own path asked for the whole window and heard "no receipt".
    const ended = await waitFor('the abandoned record', async () => {
      const r = await rrecord(gotIt);
      return r.status === 'abandoned' ? r : undefined;
    });
    expect(ended).toMatchObject({ error: { code: 'request_abandoned' }, receipt: null, settled: false });
    logIt(); // now the receipt is durable at the node
    const rec = await waitFor('the reconciled record', async () => {
      const r = await rrecord(gotIt);
      return r.settled ? r : undefined;
    });
    expect(rec).toMatchObject({ status: 'cancelled', settled: true, provider: scripted.providerId, usage: { prompt_tokens: 5, completion_tokens: 0 } });
    expect(serializeEnvelope(rec.receipt!)).toBe(logged);
    expect(await marketHas(gotIt)).toBe(true);
    expect(await marketReceipts()).toBe(before.receipts + 1);
  });

  test('a receipt the market could not take when the request ended (unreachable) is posted again until it is settled, once', async () => {
    proxy.receipt = () => 'drop';
    const res = await rpost(chatBody('market away'), toNode());
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    const first = await rrecord(id);
    expect(first).toMatchObject({ status: 'completed', settled: false, settlement_error: { code: 'market_unreachable' } });
    const posts = proxy.receiptPosts;
    proxy.receipt = undefined; // the market is back
    const rec = await waitFor('the settled record', async () => {
      const r = await rrecord(id);
      return r.settled ? r : undefined;
    });
    expect(rec.settlement_error).toBeUndefined();
    expect(await marketHas(id)).toBe(true);
    await waitFor('the job dropped', () => (rg.records.unsettledCount === 0 ? true : undefined));
    expect(proxy.receiptPosts).toBe(posts + 1);
  });

  test('a request refused before any work, or settled on its own path, is dropped without a second look at the node or the market', async () => {
    const posts = proxy.receiptPosts;
    const ok = await rpost(chatBody('plain'), toNode());
    expect(ok.status).toBe(200);
    scripted.behaviour = async (ex) => {
      await ex.head({ status: 503, headers: { 'content-type': 'application/json' } });
      await ex.trailer({ error: { code: 'no_capacity', message: 'all 1 slots are busy' } });
    };
    const refused = await rpost(chatBody('refused'), toScripted());
    expect(refused.status).toBe(503);
    await waitFor('every job dropped', () => (rg.records.unsettledCount === 0 ? true : undefined));
    expect(proxy.receiptPosts).toBe(posts + 1); // the one settlement of the plain request
  });
});

describe('reconciliation and close', () => {
  test("a gateway's close is bounded by its grace while the reconciler waits on a market that does not answer; without a records file, what it forgets is said", async () => {
    const warned: { o: Record<string, unknown>; msg: string }[] = [];
    const g = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: RECEIPT_FETCH_MS, reconcileUnitMs: 200, logger: { info: () => {}, warn: (o, msg) => warned.push({ o: o as Record<string, unknown>, msg: msg ?? '' }), error: () => {} } });
    let closed = false;
    try {
      proxy.receipt = () => 'drop';
      const res = await fetch(`${g.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toNode() }, body: chatBody('close while reconciling') });
      expect(res.status).toBe(200);
      const id = res.headers.get('x-request-id')!;
      expect(await gatewayRecord(g.url, id)).toMatchObject({ settled: false, settlement_error: { code: 'market_unreachable' } });
      const never = new Promise<void>(() => {});
      proxy.receipt = () => ({ hold: never }); // the market takes the POST and never answers
      const posts = proxy.receiptPosts;
      await waitFor('the reconciler posting again', () => (proxy.receiptPosts > posts ? true : undefined));
      const t0 = performance.now();
      await g.close(200);
      closed = true;
      expect(performance.now() - t0).toBeLessThan(5000); // (was 30 s: three POSTs of 10 s)
      const forgot = warned.filter((w) => w.msg.includes('forgotten'));
      expect(forgot).toEqual([{ o: { unsettled: 1 }, msg: expect.stringMatching(/^1 paid request not yet settled is forgotten \(no records file\).*--records FILE/) }]);
    } finally {
      if (!closed) await g.close(200);
      proxy.reset();
    }
  });
});

describe('reconciliation across a gateway restart', () => {
  test('a request the gateway was stopped in (interrupted) is settled by the next gateway on the same records file', async () => {
    const file = path.join(dir, 'reconcile-records.db');
    const a = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: 60_000, reconcileUnitMs: 60_000, recordsPath: file });
    let logged = '';
    let startedNow!: () => void;
    const started = { promise: new Promise<void>((r) => (startedNow = r)), resolve: () => startedNow() };
    scripted.behaviour = async (ex) => {
      await ex.head(JSON_HEAD);
      await ex.data('{"id":"chatcmpl-scripted"');
      logged = await ex.logReceipt({ status: 'cancelled', usage: { input_tokens: 5, output_tokens: 2 } });
      started.resolve();
      await new Promise((r) => setTimeout(r, 3_000)); // does not finish before the gateway stops
    };
    await scripted.answerLogWith({ status: 503, body: '{"error":{"code":"no_capacity","message":"busy"}}' });
    let id = '';
    const buyer = fetch(`${a.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...toScripted() }, body: chatBody('interrupt me') })
      .then((r) => {
        id = r.headers.get('x-request-id')!;
        return r.text();
      })
      .catch(() => '');
    await started.promise;
    await a.close(200);
    await buyer;
    scripted.errors.splice(0); // (the behaviour's stream was cut when the gateway stopped)
    await scripted.answerLogWith();
    const peek = new Database(file, { readonly: true });
    const inFlight = peek.prepare<[], { request_id: string }>('SELECT request_id FROM unsettled').all().map((r) => r.request_id);
    peek.close();
    expect(inFlight).toHaveLength(1);
    id ||= inFlight[0]!;
    // The next gateway looks at it at once, not at its reconciler's first tick (5 s at this unit:
    // until then the record read `interrupted`, s23 h1).
    const b = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: RECEIPT_FETCH_MS, reconcileUnitMs: 60_000, recordsPath: file });
    try {
      const rec = await waitFor(
        'the interrupted request settled',
        async () => {
          const r = await gatewayRecord(b.url, id);
          return r.settled ? r : undefined;
        },
        3_000,
      );
      expect(rec).toMatchObject({ status: 'cancelled', settled: true, usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 } });
      expect(serializeEnvelope(rec.receipt!)).toBe(logged);
      expect(await marketHas(id)).toBe(true);
    } finally {
      await b.close(1000);
      scripted.behaviour = honest;
    }
  });
});
