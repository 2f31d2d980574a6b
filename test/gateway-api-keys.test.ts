// The spec's per-key limits at the gateway (--api-keys-file): a rate limit over an exact sliding
// minute with X-RateLimit-* on every authenticated response (streams too) and 429 + Retry-After
// beyond it; scopes (403 insufficient_scope); a model allowlist (403 model_not_allowed); a cost cap
// that is the stricter of the key's and X-Service-Max-Cost-Usd; expiry (401 api_key_expired).
// Against a real market and a real node on the tiny model: a refused request takes no ticket and
// costs nothing.
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import { formatUsd, parseUsd } from '../attestation/money.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { parseConfig } from '../src/config.ts';
import { readApiKeysFile, type ApiKeySpec } from '../src/gateway/api-keys.ts';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import { SlidingWindow } from '../src/gateway/rate-window.ts';
import { watchApiKeysFile } from '../src/gateway/api-keys-file-watch.ts';
import { createKeyFile } from '../src/identity.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { startNode, type RunningNode } from '../src/node.ts';
import { errorOf, marketTotals } from './helpers/gateway-reads.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { waitForListed } from './helpers/wait.ts';

const MODEL = 'tiny/llama';
const ALL = 'sk-svc-v1-all-0123456789';
const SLOW = 'sk-svc-v1-slow-0123456789';
const EMBED_ONLY = 'sk-svc-v1-embed-0123456789';
const OTHER_MODEL = 'sk-svc-v1-other-0123456789';
const CAPPED = 'sk-svc-v1-capped-0123456789';
const EXPIRING = 'sk-svc-v1-expiring-0123456789';
const SPENDER = 'sk-svc-v1-spender-0123456789';
const RETRIER = 'sk-svc-v1-retrier-0123456789';
const ALL2 = 'sk-svc-v1-all2-0123456789';
const SHORT_BUDGET = 'sk-svc-v1-short-0123456789';
const EXACT = 'sk-svc-v1-exact-0123456789';
const SIDE_BY_SIDE = 'sk-svc-v1-side-0123456789';
const EXPIRES_AT = Date.parse('2030-01-01T00:00:00Z');

let dir: string;
let market: Market;
let marketUrl: string;
let node: RunningNode;
let gw: Gateway;
/** The clocks the gateway's key checks read. */
const clock = { wall: Date.parse('2029-06-01T00:00:00Z'), mono: 1_000_000 };

const KEYS: ApiKeySpec[] = [
  { key: ALL, name: 'all' },
  { key: SLOW, rateLimit: 3 },
  { key: EMBED_ONLY, scopes: ['EMBEDDINGS'] },
  { key: OTHER_MODEL, models: ['acme/other'] },
  { key: CAPPED, maxCostMicroUsd: 1n },
  { key: EXPIRING, expiresAt: EXPIRES_AT },
  { key: SPENDER, spendLimitMicroUsd: 22n, spendInterval: 'daily' },
  { key: RETRIER, spendLimitMicroUsd: 15n },
  { key: ALL2 },
  { key: SHORT_BUDGET, spendLimitMicroUsd: 3n },
  { key: EXACT, spendLimitMicroUsd: 5n },
  // Room for six worst cases of the tiny model at context 512 (512 × 0.60 USD/Mtok: 308 micro-USD each).
  { key: SIDE_BY_SIDE, spendLimitMicroUsd: 2000n },
];

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-keys-'));
  market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)), heartbeatIntervalMs: 1000 });
  marketUrl = (await market.listen()).url;
  writeTinyLlama(path.join(dir, 'tiny.gguf'));
  createKeyFile(path.join(dir, 'node.key'));
  node = await startNode(parseConfig(tinyNodeConfigYaml({ publicKey: market.publicKey, marketUrl, context: 512, slots: 1, receipts: '{ signer_threads: 1, checkpoint_interval_ms: 0 }', logLevel: 'error' }), dir));
  await waitForListed(marketUrl, [node.providerId]);
  gw = await createGateway({ market: marketUrl, port: 0, apiKeys: KEYS, apiKeyClock: { wallMs: () => clock.wall, monotonicMs: () => clock.mono } });
});

afterAll(async () => {
  await gw?.close(1000);
  await node?.stop(1000);
  await market?.close();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

const chatBody = (content = 'hello', extra: object = {}): string => JSON.stringify({ model: MODEL, messages: [{ role: 'user', content }], max_tokens: 4, seed: 1, ...extra });

function post(route: string, key: string | undefined, body: string, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${gw.url}/${route}`, { method: 'POST', headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}), ...headers }, body });
}

describe('per-key limits at the gateway', () => {
  test('every authenticated response says the limit and what is left, a streamed one too; the 401s and the open catalog do not', async () => {
    clock.mono += 120_000; // (a fresh minute)
    const r1 = await post('chat/completions', ALL, chatBody());
    expect(r1.status).toBe(200);
    expect(r1.headers.get('x-ratelimit-limit')).toBe('300');
    expect(r1.headers.get('x-ratelimit-remaining')).toBe('299');
    await r1.json();
    const s = await post('chat/completions', ALL, chatBody('hi', { stream: true }));
    expect(s.status).toBe(200);
    expect(s.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(s.headers.get('x-ratelimit-remaining')).toBe('298');
    expect(await s.text()).toContain('data: [DONE]');
    // Refusals by the request's own fault count as calls and say so too.
    const bad = await post('chat/completions', ALL, '{}');
    expect((await errorOf(bad))[0]).toBe(400);
    expect(bad.headers.get('x-ratelimit-remaining')).toBe('297');
    const r = await fetch(`${gw.url}/requests/req-unknown`, { headers: { 'x-service-api-key': ALL } });
    expect(r.status).toBe(404);
    expect(r.headers.get('x-ratelimit-remaining')).toBe('296');
    const unknown = await post('chat/completions', 'sk-svc-v1-unknown-000000', chatBody());
    expect((await errorOf(unknown))[1].code).toBe('invalid_api_key');
    expect(unknown.headers.get('x-ratelimit-limit')).toBeNull();
    const models = await fetch(`${gw.url}/models`);
    expect(models.status).toBe(200);
    expect(models.headers.get('x-ratelimit-limit')).toBeNull();
  });

  test('beyond the rate limit: 429 with Retry-After until the oldest call leaves the sliding minute; nothing reaches the market', async () => {
    clock.mono += 120_000;
    const t0 = clock.mono;
    const totals = await marketTotals(marketUrl);
    for (let i = 0; i < 3; i++) {
      clock.mono = t0 + i * 10_000; // calls at 0, 10 and 20 s
      const r = await post('tokenize', SLOW, JSON.stringify({ model: MODEL, prompt: 'hi' }));
      expect(r.status).toBe(200);
      expect(r.headers.get('x-ratelimit-remaining')).toBe(String(2 - i));
    }
    clock.mono = t0 + 30_000;
    const refused = await post('chat/completions', SLOW, chatBody());
    expect(await errorOf(refused)).toEqual([429, { code: 'rate_limit_exceeded', message: 'this API key may make 3 requests a minute: try again in 30 s' }]);
    expect(refused.headers.get('retry-after')).toBe('30');
    expect(refused.headers.get('x-ratelimit-limit')).toBe('3');
    expect(refused.headers.get('x-ratelimit-remaining')).toBe('0');
    // A refused call is not counted: one ms before the first call leaves, still refused, then taken.
    clock.mono = t0 + 59_999;
    const still = await post('tokenize', SLOW, JSON.stringify({ model: MODEL, prompt: 'hi' }));
    expect(still.status).toBe(429);
    expect(still.headers.get('retry-after')).toBe('1');
    clock.mono = t0 + 60_000;
    const again = await post('tokenize', SLOW, JSON.stringify({ model: MODEL, prompt: 'hi' }));
    expect(again.status).toBe(200);
    expect(again.headers.get('x-ratelimit-remaining')).toBe('0');
    // Another key has a window of its own.
    expect((await post('tokenize', ALL, JSON.stringify({ model: MODEL, prompt: 'hi' }))).status).toBe(200);
    expect(await marketTotals(marketUrl)).toEqual(totals);
  });

  test('a route outside the key\'s scopes is 403 insufficient_scope before any ticket; its own scope and the unscoped routes are served', async () => {
    const totals = await marketTotals(marketUrl);
    expect(await errorOf(await post('chat/completions', EMBED_ONLY, chatBody()))).toEqual([403, { code: 'insufficient_scope', message: 'this API key lacks the CHAT scope this route needs' }]);
    expect((await errorOf(await post('completions', EMBED_ONLY, JSON.stringify({ model: MODEL, prompt: 'hi' }))))[1].code).toBe('insufficient_scope');
    expect((await errorOf(await fetch(`${gw.url}/requests/req-x`, { headers: { authorization: `Bearer ${EMBED_ONLY}` } })))[1].code).toBe('insufficient_scope');
    expect(await marketTotals(marketUrl)).toEqual(totals);
    const e = await post('embeddings', EMBED_ONLY, JSON.stringify({ model: MODEL, input: 'hi' }));
    expect(e.status).toBe(200);
    // An estimate is judged by the scope of the endpoint it estimates.
    expect(await errorOf(await post('estimates', EMBED_ONLY, JSON.stringify({ endpoint: 'CHAT', body: JSON.parse(chatBody()) })))).toEqual([403, { code: 'insufficient_scope', message: 'this API key lacks the CHAT scope this request needs' }]);
    expect((await post('estimates', EMBED_ONLY, JSON.stringify({ endpoint: 'EMBEDDINGS', body: { model: MODEL, input: 'hi' } }))).status).toBe(200);
    expect((await post('count_tokens', EMBED_ONLY, JSON.stringify({ model: MODEL, prompt: 'hi' }))).status).toBe(200);
  });

  test('a model outside the key\'s allowlist is 403 model_not_allowed on every route that names one, before any ticket', async () => {
    const totals = await marketTotals(marketUrl);
    const refusal = [403, { code: 'model_not_allowed', message: `this API key may not use "${MODEL}" (its model allowlist)` }];
    expect(await errorOf(await post('chat/completions', OTHER_MODEL, chatBody()))).toEqual(refusal);
    expect(await errorOf(await post('chat/completions', OTHER_MODEL, chatBody('hi', { stream: true })))).toEqual(refusal);
    expect(await errorOf(await post('tokenize', OTHER_MODEL, JSON.stringify({ model: MODEL, prompt: 'hi' })))).toEqual(refusal);
    expect(await errorOf(await post('estimates', OTHER_MODEL, JSON.stringify({ endpoint: 'CHAT', body: JSON.parse(chatBody()) })))).toEqual(refusal);
    expect(await marketTotals(marketUrl)).toEqual(totals);
  });

  test('the key\'s cost cap is the hold when it is the stricter: the node refuses what it cannot pay for (403, nothing charged); a lower header cap still applies', async () => {
    const client = new OpenAI({ baseURL: gw.url, apiKey: CAPPED, maxRetries: 0 });
    const totals = await marketTotals(marketUrl);
    const err = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hello there' }], max_tokens: 8 }).then(() => undefined, (e: unknown) => e as { status: number; code: string });
    expect(err).toMatchObject({ status: 403, code: 'request_cost_limit_exceeded' });
    // The same request under a key without a cap is served: the refusal was the key's cap.
    const ok = await post('chat/completions', ALL, JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello there' }], max_tokens: 8 }));
    expect(ok.status).toBe(200);
    const body = (await ok.json()) as { usage: { cost: string } };
    expect(Number(body.usage.cost)).toBeGreaterThan(0.000001);
    // A header cap below what the request needs, under the uncapped key: refused alike.
    expect((await errorOf(await post('chat/completions', ALL, chatBody('hello there'), { 'x-service-max-cost-usd': '0.000001' })))[1].code).toBe('request_cost_limit_exceeded');
    const after = await marketTotals(marketUrl);
    // Only the served request was charged.
    expect(after.receipts - totals.receipts).toBe(1);
    expect(BigInt(after.cost_micro_usd) - BigInt(totals.cost_micro_usd)).toBe(parseUsd(body.usage.cost));
  });

  test('an estimate applies the key\'s limits as execution would (its cost cap, its spend limit), and is bound to the key it was made under', async () => {
    const estimate = (key: string) => post('estimates', key, JSON.stringify({ endpoint: 'CHAT', body: JSON.parse(chatBody('hello there')) }));
    const capped = await errorOf(await estimate(CAPPED));
    expect(capped[0]).toBe(403);
    expect(capped[1].code).toBe('request_cost_limit_exceeded');
    expect(capped[1].message).toMatch(/^the request's worst case \d+ micro-USD is above this API key's cost cap 1$/);
    expect(await errorOf(await estimate(SHORT_BUDGET))).toEqual([403, { code: 'key_spend_limit_exceeded', message: "this API key's spend limit leaves 0.000003 USD, less than this request's worst case" }]);
    // Made under one key, an estimate is not another key's to use.
    const made = await estimate(ALL);
    expect(made.status).toBe(200);
    const id = ((await made.json()) as { estimate_id: string }).estimate_id;
    const totals = await marketTotals(marketUrl);
    expect(await errorOf(await post('chat/completions', ALL2, chatBody('hello there'), { 'x-service-estimate': id }))).toEqual([400, { code: 'invalid_request', message: 'X-Service-Estimate: the estimate was made under another API key' }]);
    expect(await marketTotals(marketUrl)).toEqual(totals);
    expect((await post('chat/completions', ALL, chatBody('hello there'), { 'x-service-estimate': id })).status).toBe(200);
  });

  test('a hedged estimate where one provider prices the model holds one run, and a spend-limited key reserves one run for it (with two providers: test/gateway-misbehaving)', async () => {
    const body = JSON.stringify({ endpoint: 'CHAT', body: JSON.parse(chatBody('hello there')) });
    const once = (await (await post('estimates', ALL, body)).json()) as { max_hold: string };
    expect(((await (await post('estimates', ALL, body, { 'x-service-hedge': '1' })).json()) as { max_hold: string }).max_hold).toBe(once.max_hold);
    // Executed hedged by a spend-limited key: what it reserves, and its one attempt holds, is one
    // context's worst case (512 × 0.60 USD/Mtok: 308 micro-USD), not twice it.
    const ONE_RUN = 'sk-svc-v1-one-run-budget-0123456';
    gw.setApiKeys([...KEYS, { key: ONE_RUN, spendLimitMicroUsd: 1000n }]);
    try {
      const r = await post('chat/completions', ONE_RUN, chatBody('hello there'), { 'x-service-hedge': '1' });
      expect(r.status).toBe(200);
      const p = verifyReceipt(((await r.json()) as { service: { receipt: DsseEnvelope } }).service.receipt, { provider: node.providerId });
      if (!p.ok) throw new Error(p.error.message);
      expect(p.value.payload.hold_micro_usd).toBe('308');
    } finally {
      gw.setApiKeys(KEYS);
    }
  });

  test('an expired key no longer authenticates (401 api_key_expired); before its time it does', async () => {
    clock.wall = EXPIRES_AT - 1;
    expect((await post('tokenize', EXPIRING, JSON.stringify({ model: MODEL, prompt: 'hi' }))).status).toBe(200);
    clock.wall = EXPIRES_AT;
    const r = await post('tokenize', EXPIRING, JSON.stringify({ model: MODEL, prompt: 'hi' }));
    expect(await errorOf(r)).toEqual([401, { code: 'api_key_expired', message: 'the API key expired at 2030-01-01T00:00:00.000Z' }]);
    expect(r.headers.get('www-authenticate')).toBe('Bearer');
  });

  test('a spend limit: requests are served while the day\'s charges leave room for their worst case, then 403 key_spend_limit_exceeded with nothing charged; the next day it resets', async () => {
    clock.wall = Date.parse('2029-06-02T10:00:00Z');
    const before = await marketTotals(marketUrl);
    const ask = () => post('chat/completions', SPENDER, chatBody('hello'));
    const costs: bigint[] = [];
    let refusal: readonly [number, { code: string; message: string }] | undefined;
    for (let i = 0; i < 10 && !refusal; i++) {
      const r = await ask();
      if (r.status === 200) costs.push(parseUsd(((await r.json()) as { usage: { cost: string } }).usage.cost)!);
      else refusal = await errorOf(r);
    }
    const spent = costs.reduce((a, b) => a + b, 0n);
    // The same request costs the same each time; served while its worst case fits what is left.
    expect(costs.length).toBeGreaterThanOrEqual(2);
    expect(new Set(costs).size).toBe(1);
    expect(spent).toBeLessThanOrEqual(22n);
    expect(22n - spent).toBeLessThan(costs[0]!);
    // The budget left was the request's cap: the node refused what it could not pay for, said as the key's limit.
    expect(refusal).toEqual([403, { code: 'key_spend_limit_exceeded', message: `this API key's spend limit leaves ${formatUsd(22n - spent)} USD, less than this request's worst case` }]);
    // Only the served requests were charged, each once.
    const after = await marketTotals(marketUrl);
    expect(after.receipts - before.receipts).toBe(costs.length);
    expect(BigInt(after.cost_micro_usd) - BigInt(before.cost_micro_usd)).toBe(spent);
    // Other keys are not limited by it; the next day the key spends again.
    expect((await ask()).status).toBe(403);
    expect((await post('chat/completions', ALL, chatBody('hello'))).status).toBe(200);
    clock.wall = Date.parse('2029-06-03T00:00:00Z');
    expect((await ask()).status).toBe(200);
  });

  test('a key with a spend limit and no cost cap runs requests side by side: each reserves its worst case at the listed providers, not all that is left', async () => {
    const before = await marketTotals(marketUrl);
    const answers = await Promise.all(Array.from({ length: 4 }, (_, i) => post('chat/completions', SIDE_BY_SIDE, chatBody(`hello ${i}`))));
    expect(answers.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    const bodies = (await Promise.all(answers.map((r) => r.json()))) as { usage: { cost: string }; service: { receipt: { payload: string } } }[];
    // Each ticket held the worst case at the provider's context, never the whole budget.
    for (const b of bodies) expect(JSON.parse(Buffer.from(b.service.receipt.payload, 'base64').toString('utf8')).hold_micro_usd).toBe('308');
    await gw.idle();
    const after = await marketTotals(marketUrl);
    expect(after.receipts - before.receipts).toBe(4);
    expect(BigInt(after.cost_micro_usd) - BigInt(before.cost_micro_usd)).toBe(bodies.reduce((a, b) => a + parseUsd(b.usage.cost)!, 0n));
    // Seven at once: six worst cases fit in the budget (less what the four spent), the rest are refused, nothing charged for them.
    const more = await Promise.all(Array.from({ length: 7 }, (_, i) => post('chat/completions', SIDE_BY_SIDE, chatBody(`again ${i}`))));
    const statuses = more.map((r) => r.status);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThanOrEqual(6);
    for (const r of more) if (r.status !== 200) expect((await errorOf(r))[1].code).toBe('key_spend_limit_exceeded');
  });

  test('a retry under an Idempotency-Key is answered from the record and charged nothing, and what it held is free again at once', async () => {
    const before = await marketTotals(marketUrl);
    const ask = (idem?: string) => post('chat/completions', RETRIER, chatBody('hello'), idem ? { 'idempotency-key': idem } : {});
    const first = await ask('retrier-1');
    expect(first.status).toBe(200);
    const a = (await first.json()) as { usage: { cost: string }; service: { request_id: string } };
    expect(a.usage.cost).toBe('0.000005');
    await gw.idle(); // (settled)
    const retry = await ask('retrier-1');
    expect(retry.status).toBe(200);
    expect(((await retry.json()) as { service: { request_id: string } }).service.request_id).toBe(a.service.request_id);
    // The retry held all that was left (10) while it ran; answered from the record, it holds nothing now:
    // two more requests of 5 fit in the 15.
    expect((await ask()).status).toBe(200);
    expect((await ask()).status).toBe(200);
    expect((await errorOf(await ask()))[1].code).toBe('key_spend_limit_exceeded');
    const after = await marketTotals(marketUrl);
    expect(after.receipts - before.receipts).toBe(3);
    expect(BigInt(after.cost_micro_usd) - BigInt(before.cost_micro_usd)).toBe(15n);
  });

  test('a budget used up to the last micro-USD still answers a retry of its last request (from the node\'s record, free); anything new is refused', async () => {
    const ask = (idem?: string) => post('chat/completions', EXACT, chatBody('hello'), idem ? { 'idempotency-key': idem } : {});
    const first = await ask('exact-1');
    expect(first.status).toBe(200);
    const a = (await first.json()) as { usage: { cost: string }; service: { request_id: string } };
    expect(a.usage.cost).toBe('0.000005'); // (the whole budget)
    await gw.idle();
    const totals = await marketTotals(marketUrl);
    const retry = await ask('exact-1');
    expect(retry.status).toBe(200);
    expect(((await retry.json()) as { service: { request_id: string } }).service.request_id).toBe(a.service.request_id);
    expect(await marketTotals(marketUrl)).toEqual(totals);
    expect((await errorOf(await ask()))[1].code).toBe('key_spend_limit_exceeded');
    expect((await errorOf(await ask('exact-2')))[1].code).toBe('key_spend_limit_exceeded');
  });

  test('a records file whose spend cannot be read stops the gateway at start, naming it, with its file closed and nothing left running', async () => {
    const records = path.join(dir, 'bad-spend-records.db');
    const keys: ApiKeySpec[] = [{ key: SPENDER, spendLimitMicroUsd: 10n }];
    await (await createGateway({ market: marketUrl, port: 0, apiKeys: keys, recordsPath: records })).close(1000);
    const db = new Database(records);
    db.prepare('INSERT INTO key_spend (key_id, win, micro_usd) VALUES (?, ?, ?)').run('k', 'lifetime', 'not a number');
    db.close();
    await expect(createGateway({ market: marketUrl, port: 0, apiKeys: keys, recordsPath: records })).rejects.toThrow(/^request records: the API keys' spend could not be read: /);
    // The file was closed: it can be mended and the gateway started on it.
    const mend = new Database(records);
    mend.prepare('DELETE FROM key_spend WHERE key_id = ?').run('k');
    mend.close();
    const g = await createGateway({ market: marketUrl, port: 0, apiKeys: keys, recordsPath: records });
    try {
      expect((await fetch(`${g.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${SPENDER}` }, body: chatBody('hello') })).status).toBe(200);
    } finally {
      await g.close(1000);
    }
  });

  test('with a records file a lifetime budget outlives the gateway: what was charged before a restart still counts', async () => {
    const records = path.join(dir, 'records.db');
    const keys: ApiKeySpec[] = [{ key: SPENDER, spendLimitMicroUsd: 10n }];
    const open = () => createGateway({ market: marketUrl, port: 0, apiKeys: keys, recordsPath: records });
    const ask = (g: Gateway) => fetch(`${g.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${SPENDER}` }, body: chatBody('hello') });
    let g = await open();
    try {
      const r = await ask(g);
      expect(r.status).toBe(200);
      expect(((await r.json()) as { usage: { cost: string } }).usage.cost).toBe('0.000005');
      await g.idle();
    } finally {
      await g.close(1000);
    }
    g = await open();
    try {
      expect((await ask(g)).status).toBe(200);
      await g.idle();
      expect(await errorOf(await ask(g))).toEqual([403, { code: 'key_spend_limit_exceeded', message: 'this API key has used 0.000010 of its lifetime spend limit of 0.000010 USD (0.000010 charged); it does not reset' }]);
    } finally {
      await g.close(1000);
    }
  });

  test('the request log line names the key by its label, never the key itself', async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = { info: (o: Record<string, unknown>) => lines.push(o), warn: () => {}, error: () => {} };
    const g = await createGateway({ market: marketUrl, port: 0, apiKeys: KEYS, logger });
    try {
      await (await post2(g, ALL)).arrayBuffer();
      await (await post2(g, SLOW)).arrayBuffer();
      await waitLines(lines, 2);
      expect(lines.map((l) => l.api_key)).toEqual(['all', crypto.createHash('sha256').update(SLOW).digest('hex').slice(0, 12)]);
      expect(JSON.stringify(lines)).not.toContain('sk-svc-v1');
    } finally {
      await g.close(1000);
    }
  });
});

function post2(g: Gateway, key: string): Promise<Response> {
  return fetch(`${g.url}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify({ model: MODEL, prompt: 'hi' }) });
}

async function waitLines(lines: unknown[], n: number): Promise<void> {
  for (let i = 0; i < 100 && lines.length < n; i++) await new Promise((r) => setTimeout(r, 10));
}

describe('a changed keys file', () => {
  test('is taken at the next look: a key removed is refused from then on, a key kept keeps its rate window; a file that cannot be used changes nothing', async () => {
    const file = path.join(dir, 'keys-watched');
    const K1 = 'sk-svc-v1-watched-one-0123';
    const K2 = 'sk-svc-v1-watched-two-0123';
    fs.writeFileSync(file, `${K1} rate_limit=10\n${K2}\n`);
    const g = await createGateway({ market: marketUrl, port: 0, apiKeys: readApiKeysFile(file) });
    const lines: { level: string; msg: string }[] = [];
    const watch = watchApiKeysFile(file, (keys) => g.setApiKeys(keys), { info: (_o, msg) => lines.push({ level: 'info', msg }), error: (o, msg) => lines.push({ level: 'error', msg: `${msg} ${JSON.stringify(o)}` }) }, 60_000);
    const ask = (key: string) => fetch(`${g.url}/requests/req-none`, { headers: { authorization: `Bearer ${key}` } });
    try {
      expect((await ask(K1)).headers.get('x-ratelimit-remaining')).toBe('9');
      expect((await ask(K2)).status).toBe(404);
      watch.check();
      expect(lines).toEqual([]); // (unchanged: nothing read, nothing said)
      fs.writeFileSync(file, `${K1} rate_limit=10\n`); // K2 revoked
      watch.check();
      expect(lines).toEqual([{ level: 'info', msg: 'API keys file changed: 1 key accepted from now on' }]);
      expect((await errorOf(await ask(K2)))[1].code).toBe('invalid_api_key');
      expect((await ask(K1)).headers.get('x-ratelimit-remaining')).toBe('8'); // (its window kept)
      // A broken file: said, and the keys in force stay.
      fs.writeFileSync(file, `    name=wrapped-line-0001 rate_limit=5\n`);
      watch.check();
      expect(lines[1]?.level).toBe('error');
      expect(lines[1]?.msg).toMatch(/^API keys file changed but cannot be used: the keys accepted before stay in force until it is fixed .*starts with name=value, not a key/);
      expect((await ask(K1)).status).toBe(404);
      fs.rmSync(file);
      watch.check();
      expect(lines[2]?.msg).toMatch(/cannot read the API keys file .*not found/);
      expect((await ask(K1)).status).toBe(404);
      // A FIFO put in its place is refused at once: never a read that waits for a writer, the
      // gateway's thread held until one comes.
      execFileSync('mkfifo', [file]);
      watch.check();
      expect(lines[3]?.msg).toMatch(/cannot read the API keys file .*it is a FIFO, not a regular file/);
      expect((await ask(K1)).status).toBe(404);
    } finally {
      watch.stop();
      await g.close(1000);
    }
    // A gateway started without keys cannot be given some (it would have served without them).
    const open = await createGateway({ market: marketUrl, port: 0 });
    try {
      expect(() => open.setApiKeys([K1])).toThrow('gateway: started without API keys: restart it with them (--api-keys-file)');
    } finally {
      await open.close(1000);
    }
  });
});

describe('the keys file and the sliding window', () => {
  test('each key optionally followed by its limits; a bad option, scope, amount, interval, time or a key given twice is refused naming the line', () => {
    const d = fs.mkdtempSync(path.join(os.tmpdir(), 'api-keys-'));
    try {
      const f = path.join(d, 'keys');
      fs.writeFileSync(f, `# buyers\n${ALL}\n${SLOW}  name=ci rate_limit=60 scopes=CHAT,EMBEDDINGS models=acme/a,acme/b max_cost_usd=0.25 expires=2027-01-31T00:00:00Z\n`);
      expect(readApiKeysFile(f)).toEqual([{ key: ALL }, { key: SLOW, name: 'ci', rateLimit: 60, scopes: ['CHAT', 'EMBEDDINGS'], models: ['acme/a', 'acme/b'], maxCostMicroUsd: 250_000n, expiresAt: Date.parse('2027-01-31T00:00:00Z') }]);
      const refused = (line: string): string => {
        fs.writeFileSync(f, `${ALL}\n${line}\n`);
        try {
          readApiKeysFile(f);
        } catch (e) {
          return (e as Error).message;
        }
        return 'accepted';
      };
      expect(refused(`${SLOW} rate_limit=0`)).toBe(`${f}:2: rate_limit: expected requests a minute, 1 to 1000000, got "0"`);
      expect(refused(`${SLOW} rate_limit=1.5`)).toMatch(/:2: rate_limit: /);
      expect(refused(`${SLOW} scopes=CHAT,ADMIN`)).toBe(`${f}:2: scopes: unknown scope "ADMIN" (expected * or CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS, DECISIONS, IMAGES, VIDEOS, AUDIO_SPEECH, AUDIO_TRANSCRIPTIONS, AUDIO_GENERATIONS, MUSIC, WORKFLOWS, BILLING_READ, PROFILE)`);
      expect(refused(`${SLOW} scopes=CHAT,,EMBEDDINGS`)).toBe(`${f}:2: scopes: expected a comma-separated list without empty items`);
      expect(refused(`${SLOW} max_cost_usd=0.0000001`)).toMatch(/:2: max_cost_usd: expected a USD amount with at most 6 decimal places/);
      expect(refused(`${SLOW} max_cost_usd=-1`)).toMatch(/:2: max_cost_usd: /);
      expect(refused(`${SLOW} expires=2027-01-31`)).toMatch(/:2: expires: expected an ISO 8601 time with its zone/);
      expect(refused(`${SLOW} expires=2027-02-31T00:00:00Z`)).toMatch(/:2: expires: /);
      expect(refused(`${SLOW} name=a name=b`)).toBe(`${f}:2: name given twice`);
      expect(refused(`${SLOW} name=two words`)).toBe(`${f}:2: expected name=value after the key, got a word without "=" (one key a line)`);
      // Neither a second key on the line nor one ending in "=" is quoted (the message goes to logs).
      expect(refused(`${SLOW} ${ALL}`)).toBe(`${f}:2: expected name=value after the key, got a word without "=" (one key a line)`);
      expect(refused(`${SLOW} ${ALL}=`)).toBe(`${f}:2: unknown option (expected name, rate_limit, scopes, models, max_cost_usd, expires, spend_limit_usd or spend_interval)`);
      // A line of options alone (a long line wrapped) is not taken for a key.
      expect(refused('    name=ci-runner-0001 rate_limit=60 spend_limit_usd=5')).toBe(`${f}:2: starts with name=value, not a key: a key's options follow it on its own line`);
      expect(refused(`${SLOW} name=${'x'.repeat(65)}`)).toMatch(/:2: name: expected 1 to 64 letters/);
      expect(refused(`${SLOW} limit=5`)).toMatch(/:2: unknown option "limit"/);
      expect(refused(ALL)).toBe(`${f}:2: the API key is listed twice`);
      fs.writeFileSync(f, `${SLOW} spend_limit_usd=5 spend_interval=weekly\n${ALL} spend_limit_usd=0.5\n`);
      expect(readApiKeysFile(f)).toEqual([{ key: SLOW, spendLimitMicroUsd: 5_000_000n, spendInterval: 'weekly' }, { key: ALL, spendLimitMicroUsd: 500_000n }]);
      expect(refused(`${SLOW} spend_limit_usd=5 spend_interval=hourly`)).toBe(`${f}:2: spend_interval: expected daily, weekly, monthly (omitted: a lifetime budget), got "hourly"`);
      expect(refused(`${SLOW} spend_limit_usd=1e3`)).toMatch(/:2: spend_limit_usd: expected a USD amount/);
      expect(refused(`${SLOW} spend_interval=daily`)).toBe(`${f}:2: spend_interval: given without spend_limit_usd`);
    } finally {
      fs.rmSync(d, { recursive: true, force: true });
    }
  });

  test('the window is exact: a call leaves it windowMs after it was taken, refused calls are not counted, memory follows the traffic', () => {
    const w = new SlidingWindow(2, 1000);
    expect(w.take(0)).toEqual({ ok: true, remaining: 1 });
    expect(w.take(500)).toEqual({ ok: true, remaining: 0 });
    expect(w.take(999)).toEqual({ ok: false, retryAfterMs: 1 });
    expect(w.take(1000)).toEqual({ ok: true, remaining: 0 });
    expect(w.take(1499)).toEqual({ ok: false, retryAfterMs: 1 });
    expect(w.count(1500)).toBe(1);
    expect(w.count(5000)).toBe(0);
    // Many calls over a long time: the window holds only what is in it.
    const big = new SlidingWindow(1_000_000, 1000);
    for (let t = 0; t < 100_000; t++) big.take(t);
    expect(big.count(99_999)).toBe(1000); // (98,999, 99,999]
    expect((big as unknown as { times: number[] }).times.length).toBeLessThanOrEqual(2000);
    expect(() => new SlidingWindow(0, 1000)).toThrow(RangeError);
  });
});
