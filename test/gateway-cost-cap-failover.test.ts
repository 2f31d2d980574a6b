// A cost cap that one provider can meet and another cannot (their contexts, so their worst cases,
// differ): the market picks without counting tokens, so a node may refuse the request for its cost
// (403 request_cost_limit_exceeded, before any work); the gateway then tries the next provider, and
// refuses only when none can run it within the cap. Real market, two real tiny nodes.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import type { RequestRecord } from '../src/gateway/records.ts';
import type { RunningNode } from '../src/node.ts';
import { startMarketFixture, type MarketFixture } from './helpers/market-fixture.ts';
import { errorOf, marketTotals, settledRecord } from './helpers/gateway-reads.ts';
import { waitForListed } from './helpers/wait.ts';

const MODEL = 'tiny/llama';
let fx: MarketFixture;
let narrow: RunningNode;
let wide: RunningNode;
let gw: Gateway;

beforeAll(async () => {
  fx = await startMarketFixture('gateway-cost-cap-failover-', { heartbeatIntervalMs: 1000 });
  narrow = await fx.tinyNode('narrow', { context: 512 });
  wide = await fx.tinyNode('wide', { context: 1024 });
  await waitForListed(fx.url, [narrow.providerId, wide.providerId]);
  gw = await createGateway({ market: fx.url, port: 0 });
});
afterAll(async () => {
  await gw?.close(1000);
  await fx?.close();
});

/** No max_tokens: the worst case is the rest of the provider's context (~300 micro-USD at 512, ~600 at 1024). */
const ask = (cap: string, seed: number): Promise<Response> =>
  fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-max-cost-usd': cap }, body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello' }], seed }) });

describe('a cost cap only some providers can meet', () => {
  test('every request runs, on the provider whose worst case fits; an attempt refused for its cost is recorded refused and charged nothing', async () => {
    const before = await marketTotals(fx.url);
    let failedOver = 0;
    for (let i = 0; i < 4; i++) {
      const r = await ask('0.0004', i);
      expect(r.status, await r.clone().text()).toBe(200);
      const id = r.headers.get('x-request-id')!;
      await r.arrayBuffer();
      expect(await settledRecord(gw.url, id)).toMatchObject({ status: 'completed', provider: narrow.providerId });
      if (id.endsWith('-f1')) {
        failedOver++;
        const first = (await (await fetch(`${gw.url}/requests/${id.replace(/-f1$/, '')}`)).json()) as RequestRecord;
        expect(first).toMatchObject({ status: 'refused', provider: wide.providerId, receipt: null, error: { code: 'request_cost_limit_exceeded' } });
      }
    }
    // (the market takes turns between the two: some requests went to the wide one first)
    expect(failedOver).toBeGreaterThan(0);
    const after = await marketTotals(fx.url);
    expect(after.receipts - before.receipts).toBe(4);
    expect(after.by_provider[wide.providerId]?.receipts ?? 0).toBe(before.by_provider[wide.providerId]?.receipts ?? 0);
  });

  test('an estimate finds the provider execution would: past one whose context is too small, or whose worst case is above the cap', async () => {
    const estimate = (body: object, headers: Record<string, string> = {}) =>
      fetch(`${gw.url}/estimates`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ endpoint: 'CHAT', body: { model: MODEL, messages: [{ role: 'user', content: 'hello' }], seed: 1, ...body } }) });
    // 600 tokens out: only the wide node's context holds them, whichever the listing names first.
    for (let i = 0; i < 2; i++) {
      const r = await estimate({ max_tokens: 600 });
      expect(r.status, await r.clone().text()).toBe(200);
      const est = (await r.json()) as { can_start: { provider: string }; estimate_id: string };
      expect(est.can_start.provider).toBe(wide.providerId);
    }
    // Too many tokens for either: refused as execution would be.
    const [status, e] = await errorOf(await estimate({ max_tokens: 5000 }));
    expect([status, e.code]).toEqual([400, 'context_length_exceeded']);
  });

  test('a cap no provider can meet: 403 request_cost_limit_exceeded once both were asked, nothing charged', async () => {
    const before = await marketTotals(fx.url);
    const [status, e] = await errorOf(await ask('0.0001', 9));
    expect([status, e.code]).toEqual([403, 'request_cost_limit_exceeded']);
    expect(await marketTotals(fx.url)).toEqual(before);
  });
});
