// Where a retry under an Idempotency-Key goes, with two real providers: back to the provider that
// answered it, which holds its record. A key reused on another endpoint is refused there (409
// idempotency_key_reused) whichever provider the market would pick; a retry whose provider has
// gone is 503 idempotency_provider_unavailable, run and billed nowhere else.
import crypto from 'node:crypto';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import type { RequestRecord } from '../src/gateway/records.ts';
import type { RunningNode } from '../src/node.ts';
import { startMarketFixture, type MarketFixture } from './helpers/market-fixture.ts';
import { errorOf, marketTotals } from './helpers/gateway-reads.ts';
import { waitFor, waitForListed } from './helpers/wait.ts';

const MODEL = 'tiny/llama';
let fx: MarketFixture;
let a: RunningNode & { crash(): Promise<void> };
let b: RunningNode;
let gw: Gateway;

beforeAll(async () => {
  // A long heartbeat interval: a crashed node stays listed as live, as one that has just gone does.
  fx = await startMarketFixture('gateway-idem-routing-', { heartbeatIntervalMs: 60_000 });
  a = await fx.crashableNode('a');
  b = await fx.tinyNode('b');
  await waitForListed(fx.url, [a.providerId, b.providerId]);
  gw = await createGateway({ market: fx.url, port: 0 });
});
afterAll(async () => {
  await gw?.close(1000);
  await fx?.close();
});

const post = (route: string, body: object, headers: Record<string, string>): Promise<Response> =>
  fetch(`${gw.url}/${route}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ model: MODEL, max_tokens: 4, seed: 1, ...body }) });

async function providerOf(res: Response): Promise<string> {
  const id = res.headers.get('x-request-id')!;
  await res.arrayBuffer();
  return ((await (await fetch(`${gw.url}/requests/${id}`)).json()) as RequestRecord).provider!;
}

describe('retries under an Idempotency-Key with two providers', () => {
  test('a key reused on another endpoint is 409 idempotency_key_reused every time, never run where the market would send it', async () => {
    const before = await marketTotals(fx.url);
    for (let i = 0; i < 4; i++) {
      const key = `reused-${i}-${crypto.randomUUID()}`;
      const first = await post('chat/completions', { messages: [{ role: 'user', content: 'hello' }] }, { 'idempotency-key': key });
      expect(first.status).toBe(200);
      await providerOf(first);
      const [status, e] = await errorOf(await post('completions', { prompt: 'hello' }, { 'idempotency-key': key }));
      expect([status, e.code]).toEqual([409, 'idempotency_key_reused']);
    }
    const after = await marketTotals(fx.url);
    expect(after.receipts - before.receipts).toBe(4); // the four first requests only
  });

  test('a stream\'s retry names the first request in its header as in its body, and is billed nothing more', async () => {
    const key = `stream-${crypto.randomUUID()}`;
    const body = { messages: [{ role: 'user', content: 'hello' }], stream: true, stream_options: { include_usage: true } };
    const closing = (text: string) => JSON.parse(text.split('\n\n').filter((e) => e.startsWith('data: {')).at(-1)!.slice(6)) as { service: { request_id: string; receipt: unknown } };
    const first = await post('chat/completions', body, { 'idempotency-key': key });
    const id = first.headers.get('x-request-id')!;
    const firstText = await first.text();
    await gw.idle();
    const before = await marketTotals(fx.url);
    const retry = await post('chat/completions', body, { 'idempotency-key': key });
    expect(retry.status).toBe(200);
    const text = await retry.text();
    expect(retry.headers.get('x-request-id')).toBe(id);
    expect(closing(text).service).toEqual(closing(firstText).service);
    expect(closing(text).service.request_id).toBe(id);
    await gw.idle();
    expect(await marketTotals(fx.url)).toEqual(before);
  });

  test('the provider that answered has gone: the retry is 503 idempotency_provider_unavailable, and runs and is billed nowhere else', async () => {
    // A request answered by `a` (preferred), then `a` crashes (still listed live: the market has not noticed).
    const key = `gone-${crypto.randomUUID()}`;
    const body = { messages: [{ role: 'user', content: 'hello there' }] };
    const first = await post('chat/completions', body, { 'idempotency-key': key, 'x-service-prefer-providers': `${a.providerId},${b.providerId}` });
    expect(first.status).toBe(200);
    expect(await providerOf(first)).toBe(a.providerId);
    // Another key whose stream at `a` the buyer left: its receipt is `cancelled`, and `a` recorded
    // no answer for it (a node records completed answers only).
    const left = `left-${crypto.randomUUID()}`;
    const long = { messages: [{ role: 'user', content: 'tell me a story' }], max_tokens: 400, stream: true };
    const leaving = new AbortController();
    const started = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': left, 'x-service-prefer-providers': a.providerId }, body: JSON.stringify({ model: MODEL, seed: 1, ...long }), signal: leaving.signal });
    const leftId = started.headers.get('x-request-id')!;
    await started.body!.getReader().read(); // the first events, then the buyer goes
    leaving.abort();
    await waitFor('the cancelled receipt', async () => {
      const r = (await (await fetch(`${gw.url}/requests/${leftId}`)).json()) as RequestRecord;
      return r.status === 'cancelled' && r.settled ? r : undefined;
    });
    // A third key: the buyer leaves a stream at `a` and retries at once; the retry completes at `a`
    // (which recorded its answer) whenever the first attempt's cancelled receipt comes in.
    const raced = `raced-${crypto.randomUUID()}`;
    const racing = new AbortController();
    const firstRun = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': raced, 'x-service-prefer-providers': a.providerId }, body: JSON.stringify({ model: MODEL, seed: 2, ...long }), signal: racing.signal });
    const racedId = firstRun.headers.get('x-request-id')!;
    await firstRun.body!.getReader().read();
    racing.abort();
    const retried = await waitFor('the retry to run', async () => {
      // (pinned to `a`: were the cancelled receipt in first, the market could send it elsewhere)
      const r = await post('chat/completions', { ...long, seed: 2 }, { 'idempotency-key': raced, 'x-service-prefer-providers': a.providerId });
      if (r.status === 409) return void (await r.arrayBuffer()); // (the first still ending at the node)
      return r;
    });
    expect(retried.status).toBe(200);
    await retried.text();
    await waitFor('the first attempt\'s cancelled receipt', async () => {
      const r = (await (await fetch(`${gw.url}/requests/${racedId}`)).json()) as RequestRecord;
      return r.status === 'cancelled' && r.settled ? r : undefined;
    });
    await gw.idle();
    await a.crash();
    // Its retry is no longer `a`'s alone: it runs (and is billed) on the provider that is there
    // (s30 review: it was 503 idempotency_provider_unavailable for as long as the key was kept).
    const again = await post('chat/completions', { ...long, stream: false }, { 'idempotency-key': left });
    expect([again.status, await providerOf(again)]).toEqual([200, b.providerId]);
    // The raced key's answer is `a`'s record: its retry goes there only, never run again elsewhere
    // (s30 review: the late cancelled receipt erased the key, and it ran, and was billed, twice).
    const [racedStatus, racedError] = await errorOf(await post('chat/completions', { ...long, seed: 2 }, { 'idempotency-key': raced }));
    expect([racedStatus, racedError.code]).toEqual([503, 'idempotency_provider_unavailable']);
    const before = await marketTotals(fx.url);
    const [status, e] = await errorOf(await post('chat/completions', body, { 'idempotency-key': key }));
    expect(status).toBe(503);
    expect(e.code).toBe('idempotency_provider_unavailable');
    expect(e.message).toContain(`answered by provider ${a.providerId}, which cannot take the retry now`);
    expect(await marketTotals(fx.url)).toEqual(before);
    // A new key runs it again, on the provider that is there (and bills it).
    const fresh = await post('chat/completions', body, { 'idempotency-key': `${key}-new` });
    expect(fresh.status).toBe(200);
    expect(await providerOf(fresh)).toBe(b.providerId);
  });
});
