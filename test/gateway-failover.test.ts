// Failover through the gateway: a provider the marketplace still lists but that cannot be reached
// is skipped. The request runs on the next provider, only that provider bills, and the attempt
// that never reached anyone is recorded as failed with provider_unreachable, charged nothing.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import type { RequestRecord } from '../src/gateway/records.ts';
import type { RunningNode } from '../src/node.ts';
import { startMarketFixture, type MarketFixture } from './helpers/market-fixture.ts';
import { waitForListed } from './helpers/wait.ts';
import { marketTotals, settledRecord, type MarketTotals } from './helpers/gateway-reads.ts';

const MODEL = 'tiny/llama';
let fx: MarketFixture;
let marketUrl: string;
let live: RunningNode;
let gone: RunningNode;
let gw: Gateway;

async function providers(): Promise<{ provider: string; live: boolean }[]> {
  return (await (await fetch(`${marketUrl}/v1/providers`)).json()) as { provider: string; live: boolean }[];
}

const totals = (): Promise<MarketTotals> => marketTotals(marketUrl);

function chat(headers: Record<string, string> = {}, seed = 1): Promise<Response> {
  return fetch(`${gw.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello world' }], max_tokens: 8, seed }),
  });
}

beforeAll(async () => {
  // A long heartbeat interval: a node that stops stays listed as live for minutes, as a node
  // that has just crashed or lost its network is until the marketplace notices.
  fx = await startMarketFixture('gateway-failover-', { heartbeatIntervalMs: 60_000 });
  marketUrl = fx.url;
  live = await fx.tinyNode('live');
  const crashing = await fx.crashableNode('gone');
  gone = crashing;
  await waitForListed(marketUrl, [live.providerId, gone.providerId]);
  await crashing.crash();
  gw = await createGateway({ market: marketUrl, port: 0 });
});
afterAll(async () => {
  await gw?.close(1000);
  await fx?.close();
});

describe('failover past a provider that cannot be reached', () => {
  test('the stopped node is still listed as live (the premise of every test here)', async () => {
    expect((await providers()).find((p) => p.provider === gone.providerId)?.live).toBe(true);
  });

  test('preferred first but unreachable: the next provider serves and bills; the first attempt is failed, charged nothing', async () => {
    const res = await chat({ 'x-service-prefer-providers': `${gone.providerId},${live.providerId}` });
    expect(res.status).toBe(200);
    const finalId = res.headers.get('x-request-id')!;
    const body = (await res.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
    expect(body.service.request_id).toBe(finalId);
    const v = verifyReceipt(body.service.receipt, { provider: live.providerId });
    expect(v.ok && v.value.payload.status).toBe('completed');
    // The first attempt carries the gateway's base id; the failover's id is derived from it.
    expect(finalId).toMatch(/-f1$/);
    const firstId = finalId.replace(/-f1$/, '');
    const first = (await (await fetch(`${gw.url}/requests/${firstId}`)).json()) as RequestRecord;
    expect(first).toMatchObject({ status: 'failed', provider: gone.providerId, receipt: null, cost_micro_usd: null, error: { code: 'provider_unreachable' } });
    const second = await settledRecord(gw.url, finalId);
    expect(second).toMatchObject({ status: 'completed', provider: live.providerId });
    const t = await totals();
    expect(t.by_provider[gone.providerId]).toBeUndefined();
    expect(t.by_provider[live.providerId]?.receipts).toBeGreaterThanOrEqual(1);
  });

  test('without a preference every request is served, whichever provider the marketplace tickets first', async () => {
    let failedOver = 0;
    for (let i = 0; i < 4; i++) {
      const res = await chat({}, 10 + i);
      expect(res.status).toBe(200);
      const body = (await res.json()) as { service: { receipt: DsseEnvelope } };
      expect(verifyReceipt(body.service.receipt, { provider: live.providerId }).ok).toBe(true);
      // Where the marketplace ticketed the stopped node first, that attempt is on record as such.
      const id = res.headers.get('x-request-id')!;
      if (id.endsWith('-f1')) {
        failedOver++;
        expect(((await (await fetch(`${gw.url}/requests/${id.slice(0, -3)}`)).json()) as RequestRecord).error?.code).toBe('provider_unreachable');
      }
    }
    // The market spreads tickets over its live providers, so the stopped one got some of them.
    expect(failedOver).toBeGreaterThan(0);
    expect((await totals()).by_provider[gone.providerId]).toBeUndefined();
  });

  test('tokenize fails over too', async () => {
    const res = await fetch(`${gw.url}/tokenize`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-service-prefer-providers': `${gone.providerId},${live.providerId}` },
      body: JSON.stringify({ model: MODEL, prompt: 'hello world' }),
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { provider: string }).provider).toBe(live.providerId);
  });

  test('when every preferred provider is unreachable: 503 provider_unreachable in the error envelope, nothing billed, the gateway stays up', async () => {
    await gw.idle(); // earlier answers' receipts are posted after their responses end
    const before = await totals();
    const res = await chat({ 'x-service-prefer-providers': gone.providerId });
    expect(res.status).toBe(503);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('provider_unreachable');
    const tok = await fetch(`${gw.url}/tokenize`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-service-prefer-providers': gone.providerId },
      body: JSON.stringify({ model: MODEL, prompt: 'hello' }),
    });
    expect(tok.status).toBe(503);
    expect(((await tok.json()) as { error: { code: string } }).error.code).toBe('provider_unreachable');
    await gw.idle();
    expect(await totals()).toEqual(before);
    expect((await chat({}, 99)).status).toBe(200);
  });
});
