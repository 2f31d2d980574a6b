// The failover bound: a paid request moves on to another provider at most MAX_FAILOVERS (2) times,
// so at most three providers are tried for it. Four providers here are registered and then
// stopped: the market (a long heartbeat interval) still lists them as live, so the gateway is
// ticketed for them and cannot reach them. One more node is really up.
//
//   - With more unreachable providers than the bound, the request ends after the third attempt with
//     503 provider_unreachable in the error envelope, even when a live provider is next in line;
//     each attempt is on record as failed at its own provider, and nothing is billed.
//   - The third provider in line (after exactly two failovers) still serves.
//   - Without X-Service-Prefer-Providers the bound holds too (failover then follows the market's
//     list of live providers).
//   - The gateway goes on serving afterwards.
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
/** Registered, then stopped: listed as live, unreachable. */
const dead: (RunningNode & { crash(): Promise<void> })[] = [];
let live: RunningNode;
let gw: Gateway;

const nodeIn = (name: string, slots: number): Promise<RunningNode> => fx.tinyNode(name, { slots });

const totals = (): Promise<MarketTotals> => marketTotals(marketUrl);

/** Chat completions the live node has answered or refused, from its own metrics. */
async function liveNodeRequests(): Promise<number> {
  const text = await (await fetch(`${live.opsUrl}/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/^seller_requests_total\{endpoint="chat\/completions"[^}]*\} (\d+)/gm)) n += Number(m[1]);
  return n;
}

function chat(headers: Record<string, string>, seed: number): Promise<Response> {
  return fetch(`${gw.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello world' }], max_tokens: 8, seed }),
  });
}

const prefer = (...nodes: RunningNode[]): Record<string, string> => ({ 'x-service-prefer-providers': nodes.map((n) => n.providerId).join(',') });

async function getRecord(id: string): Promise<{ status: number; body: RequestRecord & { error?: { code: string; message: string } } }> {
  const r = await fetch(`${gw.url}/requests/${encodeURIComponent(id)}`);
  return { status: r.status, body: (await r.json()) as RequestRecord };
}

/** A response in the spec's error envelope: exactly {error: {code, message}}, JSON. */
async function expectEnvelope(res: Response, status: number, code: string): Promise<{ code: string; message: string }> {
  const body = (await res.json()) as { error: { code: string; message: string } };
  expect([res.status, body], JSON.stringify(body)).toEqual([status, { error: { code, message: expect.any(String) } }]);
  expect(res.headers.get('content-type')).toMatch(/^application\/json/);
  expect(body.error.message.length).toBeGreaterThan(0);
  return body.error;
}

/** The records of attempts `base`, `base-f1`, … `base-f{n-1}`: each failed, provider_unreachable, charged nothing. */
async function expectUnreachableAttempts(base: string, providers: readonly string[]): Promise<void> {
  for (const [i, provider] of providers.entries()) {
    const id = i === 0 ? base : `${base}-f${i}`;
    const { status, body } = await getRecord(id);
    expect(status, `GET /v1/requests/${id}`).toBe(200);
    expect(body).toMatchObject({ request_id: id, status: 'failed', provider, receipt: null, cost: null, cost_micro_usd: null, usage: null, settled: false, error: { code: 'provider_unreachable' } });
    expect(body.error!.message).toContain(provider);
  }
}

beforeAll(async () => {
  // A long heartbeat interval: a node that stops stays listed as live for minutes.
  fx = await startMarketFixture('gateway-failover-limits-', { heartbeatIntervalMs: 60_000 });
  marketUrl = fx.url;
  // The soon-dead nodes register first (the market lists providers in registration order) and
  // offer more slots than the live one (the market tickets the most free slots first without a
  // preference): so without a preference the market's picks are dead nodes, deterministically.
  for (let i = 0; i < 4; i++) dead.push(await fx.crashableNode(`dead${i}`, { slots: 2 }));
  await waitForListed(marketUrl, dead.map((n) => n.providerId));
  live = await nodeIn('live', 1);
  await waitForListed(marketUrl, [live.providerId]);
  for (const n of dead) await n.crash(); // gone without a word to the market
  gw = await createGateway({ market: marketUrl, port: 0 });
});

afterAll(async () => {
  await gw?.close(1000);
  await fx?.close();
});

describe('a paid request fails over at most twice (MAX_FAILOVERS): three providers tried at most', () => {
  test('the stopped nodes are still listed as live and accepting, after the live one (the premise of every test here)', async () => {
    const list = (await (await fetch(`${marketUrl}/v1/providers`)).json()) as { provider: string; live: boolean; accepting: boolean }[];
    const ids = list.map((p) => p.provider);
    for (const n of dead) expect(list.find((p) => p.provider === n.providerId)).toMatchObject({ live: true, accepting: true });
    expect(list.find((p) => p.provider === live.providerId)).toMatchObject({ live: true, accepting: true });
    expect(ids.indexOf(live.providerId)).toBeGreaterThan(Math.max(...dead.map((n) => ids.indexOf(n.providerId))));
  });

  test('four unreachable providers preferred before a live one: after the third unreachable one, 503 provider_unreachable; the live one is never tried, nothing billed', async () => {
    const before = await totals();
    const liveBefore = await liveNodeRequests();
    const res = await chat(prefer(...dead, live), 1);
    const err = await expectEnvelope(res, 503, 'provider_unreachable');
    // The answer is the last attempt's: the second failover, at the third provider in line.
    const lastId = res.headers.get('x-request-id')!;
    expect(lastId).toMatch(/^req-.+-f2$/);
    expect(err.message).toContain(dead[2]!.providerId);
    const base = lastId.slice(0, -'-f2'.length);
    // Exactly three attempts, each at the next provider in the preferred order.
    await expectUnreachableAttempts(base, [dead[0]!.providerId, dead[1]!.providerId, dead[2]!.providerId]);
    const next = await getRecord(`${base}-f3`);
    expect(next.status).toBe(404);
    expect(next.body).toMatchObject({ error: { code: 'request_not_found' } });
    await gw.idle();
    expect(await totals()).toEqual(before);
    expect(await liveNodeRequests()).toBe(liveBefore);
  });

  test('the boundary: two unreachable providers, then the live one: served after exactly two failovers, only the live one billed', async () => {
    await gw.idle();
    const before = await totals();
    const res = await chat(prefer(dead[0]!, dead[1]!, live), 2);
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    expect(id).toMatch(/^req-.+-f2$/);
    const body = (await res.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
    expect(body.service.request_id).toBe(id);
    const v = verifyReceipt(body.service.receipt, { provider: live.providerId });
    expect(v.ok && v.value.payload).toMatchObject({ request_id: id, status: 'completed', provider: live.providerId });
    await expectUnreachableAttempts(id.slice(0, -'-f2'.length), [dead[0]!.providerId, dead[1]!.providerId]);
    expect(await settledRecord(gw.url, id)).toMatchObject({ status: 'completed', provider: live.providerId });
    await gw.idle();
    const after = await totals();
    expect(after.receipts).toBe(before.receipts + 1);
    expect(after.by_provider[live.providerId]?.receipts).toBe((before.by_provider[live.providerId]?.receipts ?? 0) + 1);
    for (const n of dead) expect(after.by_provider[n.providerId]).toBeUndefined();
  });

  test('without a preference the bound holds too: three unreachable providers tried, 503 provider_unreachable, nothing billed', async () => {
    await gw.idle();
    const before = await totals();
    const liveBefore = await liveNodeRequests();
    const res = await chat({}, 3);
    await expectEnvelope(res, 503, 'provider_unreachable');
    const lastId = res.headers.get('x-request-id')!;
    expect(lastId).toMatch(/^req-.+-f2$/);
    const base = lastId.slice(0, -'-f2'.length);
    const tried: string[] = [];
    for (const id of [base, `${base}-f1`, `${base}-f2`]) {
      const { status, body } = await getRecord(id);
      expect(status).toBe(200);
      expect(body).toMatchObject({ status: 'failed', receipt: null, cost_micro_usd: null, error: { code: 'provider_unreachable' } });
      tried.push(body.provider!);
    }
    // Three different providers, all of them unreachable ones (the market ticketed the stopped
    // nodes first: they offer more free slots and come first in its list).
    expect(new Set(tried).size).toBe(3);
    for (const p of tried) expect(dead.map((n) => n.providerId)).toContain(p);
    expect((await getRecord(`${base}-f3`)).status).toBe(404);
    await gw.idle();
    expect(await totals()).toEqual(before);
    expect(await liveNodeRequests()).toBe(liveBefore);
  });

  test('the gateway still serves afterwards: an untried unreachable provider then the live one, and the live one alone', async () => {
    await gw.idle();
    const before = await totals();
    const res = await chat(prefer(dead[3]!, live), 4);
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    expect(id).toMatch(/-f1$/);
    const body = (await res.json()) as { service: { receipt: DsseEnvelope } };
    expect(verifyReceipt(body.service.receipt, { provider: live.providerId }).ok).toBe(true);
    await expectUnreachableAttempts(id.slice(0, -'-f1'.length), [dead[3]!.providerId]);

    const direct = await chat(prefer(live), 5);
    expect(direct.status).toBe(200);
    const directId = direct.headers.get('x-request-id')!;
    expect(directId).not.toMatch(/-f\d+$/);
    const b = (await direct.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
    expect(b.service.request_id).toBe(directId);
    expect(verifyReceipt(b.service.receipt, { provider: live.providerId }).ok).toBe(true);
    expect(await settledRecord(gw.url, directId)).toMatchObject({ status: 'completed', provider: live.providerId });
    await gw.idle();
    // Billed: the failed-over request and the direct one, both at the live node.
    const after = await totals();
    expect(after.receipts).toBe(before.receipts + 2);
    expect(after.by_provider[live.providerId]?.receipts).toBe((before.by_provider[live.providerId]?.receipts ?? 0) + 2);
    for (const n of dead) expect(after.by_provider[n.providerId]).toBeUndefined();
  });
});
