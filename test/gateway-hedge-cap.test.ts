// X-Service-Hedge under X-Service-Max-Cost-Usd: how the gateway sets each ticket's hold (the cap
// the node bills within). A hedge asks for two tickets of half the cap each. With no second
// provider whose listing meets the routing controls it runs once with the whole cap; when the
// second is listed but cannot be ticketed, the request runs once and is re-ticketed with the
// whole cap (paidAttempt: `if (halved && !hedged) granted = await ticketFor(…, cap)`). Either way
// the buyer is billed at most the cap in all.
//
// Tickets are observed as the market grants them, through a proxy in front of the market; what was
// billed, through the market's totals and receipts.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import { computeCost, formatUsd, type Rates } from '../attestation/money.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { peekPayload } from '../attestation/signed-payload.ts';
import type { TicketPayload } from '../attestation/ticket.ts';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import type { RequestRecord } from '../src/gateway/records.ts';
import type { RunningNode } from '../src/node.ts';
import { MarketProxy } from './helpers/misbehaving-node.ts';
import { startMarketFixture, type MarketFixture } from './helpers/market-fixture.ts';
import { waitForListed } from './helpers/wait.ts';
import { endedRecord, marketReceipt as marketReceiptAt, marketTotals, type MarketTotals } from './helpers/gateway-reads.ts';

const MODEL = 'tiny/llama';
/** The tiny nodes' prices (node-config.ts): 0.15 and 0.60 USD per million tokens. */
const RATES: Rates = { input_per_mtok: 150_000n, output_per_mtok: 600_000n };
const MESSAGES = [{ role: 'user', content: 'hello world' }];

let fx: MarketFixture;
let marketUrl: string;
let proxy: MarketProxy;
/** Context 1024: meets X-Service-Min-Ctx 1000. */
let wide: RunningNode;
/** Context 512: listed and live, but never ticketed under X-Service-Min-Ctx 1000. */
let narrow: RunningNode;
let gw: Gateway;
/** The tickets the market granted, in order. */
let granted: TicketPayload[] = [];
/** The chat template's input tokens for MESSAGES, as the nodes count them. */
let inputTokens: number;

beforeAll(async () => {
  fx = await startMarketFixture('gateway-hedge-cap-', { heartbeatIntervalMs: 1000 });
  marketUrl = fx.url;
  wide = await fx.tinyNode('wide', { context: 1024 });
  narrow = await fx.tinyNode('narrow', { context: 512 });
  await waitForListed(marketUrl, [wide.providerId, narrow.providerId]);
  proxy = await MarketProxy.start(marketUrl);
  // A hedge's loser that did no work is looked for at its node this long before it is recorded.
  gw = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: 1500 });
  const count = await post('count_tokens', JSON.stringify({ model: MODEL, messages: MESSAGES }), { 'x-service-prefer-providers': wide.providerId });
  expect(count.status).toBe(200);
  inputTokens = ((await count.json()) as { count: number }).count;
});

afterAll(async () => {
  await gw?.close(1000);
  await proxy?.close();
  await fx?.close();
});

beforeEach(() => {
  granted = [];
  proxy.reset();
  proxy.ticket = (g) => {
    granted.push(peekPayload(g.ticket) as unknown as TicketPayload);
    return g;
  };
});

function post(endpoint: string, body: string, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${gw.url}/${endpoint}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
}

const chatBody = (maxTokens: number, seed: number): string => JSON.stringify({ model: MODEL, messages: MESSAGES, max_tokens: maxTokens, seed });

const totals = (): Promise<MarketTotals> => marketTotals(marketUrl);

const marketReceipt = (id: string) => marketReceiptAt(marketUrl, id);

const record = (id: string): Promise<RequestRecord> => endedRecord(gw.url, id);

const payloadOf = (env: DsseEnvelope): { request_id: string; ticket_id: string; provider: string; hold_micro_usd: string; cost_micro_usd: string; status: string; usage: { input_tokens: number; output_tokens: number } } =>
  JSON.parse(Buffer.from(env.payload, 'base64').toString()) as never;

describe('hedged requests under a cost cap', () => {
  // A cap of 300 micro-USD; 400 output tokens make a worst case of about 242 (above half the cap,
  // within the whole cap), 200 tokens about 122 (within half the cap).
  const CAP = 300n;
  const capHeader = formatUsd(CAP);

  test('the premise: the worst cases are where this file needs them; as the buyer\'s cap, half the cap refuses the 400-token request', async () => {
    const worst400 = computeCost({ input_tokens: inputTokens, output_tokens: 400 }, RATES);
    const worst200 = computeCost({ input_tokens: inputTokens, output_tokens: 200 }, RATES);
    expect(worst400 > CAP / 2n && worst400 <= CAP).toBe(true);
    expect(worst200 <= CAP / 2n).toBe(true);
    // Unhedged, under half the cap, the node refuses the 400-token request before any work.
    const res = await post('chat/completions', chatBody(400, 1), { 'x-service-prefer-providers': wide.providerId, 'x-service-max-cost-usd': formatUsd(CAP / 2n) });
    const body = (await res.json()) as { error: { code: string } };
    expect([res.status, body.error?.code]).toEqual([403, 'request_cost_limit_exceeded']);
  });

  test('a second provider whose listing fails the routing controls is no hedge: one ticket with the whole cap, run once', async () => {
    // X-Service-Min-Ctx 1000: the narrow node (context 512) is live and lists the model, but its
    // listing rules it out, so the gateway plans no hedge and asks for no half-cap ticket.
    const res = await post('chat/completions', chatBody(400, 2), { 'x-service-hedge': '1', 'x-service-max-cost-usd': capHeader, 'x-service-min-ctx': '1000' });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    const receipt = payloadOf(((await res.json()) as { service: { receipt: DsseEnvelope } }).service.receipt);
    expect(granted.map((t) => [t.request_id, t.provider, t.max_cost_micro_usd])).toEqual([[id, wide.providerId, CAP.toString()]]);
    expect(receipt).toMatchObject({ request_id: id, provider: wide.providerId, ticket_id: granted[0]!.ticket_id, hold_micro_usd: CAP.toString(), status: 'completed' });
    expect((await fetch(`${gw.url}/requests/${id}-hedge`)).status).toBe(404);
  });

  test('the second provider is listed but its ticket is unusable: the request is re-ticketed with the whole cap, runs once, and is billed within the cap', async () => {
    await gw.idle();
    const before = await totals();
    // Both nodes' listings fit, so the gateway plans a hedge with half caps; the market's grant
    // for the second half comes back for another request, so the hedge has no second route.
    proxy.ticket = (g) => {
      const t = peekPayload(g.ticket) as unknown as TicketPayload;
      granted.push(t);
      return t.request_id.endsWith('-hedge') ? { ...g, request_id: 'req-someone-else' } : g;
    };
    const res = await post('chat/completions', chatBody(400, 2), { 'x-service-hedge': '1', 'x-service-max-cost-usd': capHeader });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    expect(id).not.toMatch(/-hedge$/);
    const body = (await res.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
    expect(body.service.request_id).toBe(id);
    const receipt = payloadOf(body.service.receipt);
    // Three grants: the half-cap ticket of the planned hedge, the unusable half-cap ticket of its
    // second half (at the other node), then the whole-cap ticket the request ran under.
    expect(granted.map((t) => [t.request_id, t.max_cost_micro_usd])).toEqual([
      [id, (CAP / 2n).toString()],
      [`${id}-hedge`, (CAP / 2n).toString()],
      [id, CAP.toString()],
    ]);
    expect(granted[1]!.provider).not.toBe(granted[0]!.provider);
    expect(receipt.ticket_id).toBe(granted[2]!.ticket_id);
    expect(verifyReceipt(body.service.receipt, { provider: granted[2]!.provider }).ok).toBe(true);
    expect(receipt).toMatchObject({ request_id: id, provider: granted[2]!.provider, status: 'completed' });
    // The ticket the node ran under held the whole cap, and the node generated beyond what half
    // the cap pays for (a node caps its generation at what its hold pays for: under a half-cap
    // ticket this answer would have been cut short at `halfPays` tokens).
    expect(receipt.hold_micro_usd).toBe(CAP.toString());
    expect(BigInt(receipt.cost_micro_usd) <= CAP).toBe(true);
    let halfPays = 0;
    while (computeCost({ input_tokens: inputTokens, output_tokens: halfPays + 1 }, RATES) <= CAP / 2n) halfPays++;
    expect(receipt.usage.input_tokens).toBe(inputTokens);
    expect(receipt.usage.output_tokens).toBeGreaterThan(halfPays);
    expect((await fetch(`${gw.url}/requests/${id}-hedge`)).status).toBe(404);

    const rec = await record(id);
    expect(rec).toMatchObject({ status: 'completed', provider: receipt.provider, settled: true, cost_micro_usd: receipt.cost_micro_usd });
    await gw.idle();
    const after = await totals();
    expect(after.receipts).toBe(before.receipts + 1);
    const billed = BigInt(after.cost_micro_usd) - BigInt(before.cost_micro_usd);
    expect(billed).toBe(BigInt(receipt.cost_micro_usd));
    expect(billed <= CAP).toBe(true);
  });

  test('without a cap, a hedge with no second fit provider runs once under the market\'s own hold: one ticket, no re-ticket', async () => {
    const res = await post('chat/completions', chatBody(8, 3), { 'x-service-hedge': '1', 'x-service-min-ctx': '1000' });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    const body = (await res.json()) as { service: { receipt: DsseEnvelope } };
    const receipt = payloadOf(body.service.receipt);
    expect(granted).toHaveLength(1);
    expect(granted[0]).toMatchObject({ request_id: id, provider: wide.providerId });
    expect(receipt).toMatchObject({ request_id: id, ticket_id: granted[0]!.ticket_id, hold_micro_usd: granted[0]!.max_cost_micro_usd });
  });

  test('the hedge runs: each half holds half the cap, at two providers, and the two together are billed at most the cap', async () => {
    await gw.idle();
    const before = await totals();
    const res = await post('chat/completions', chatBody(200, 4), { 'x-service-hedge': '1', 'x-service-max-cost-usd': capHeader });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    const body = (await res.json()) as { service: { receipt: DsseEnvelope } };
    const winner = payloadOf(body.service.receipt);
    expect(winner.hold_micro_usd).toBe((CAP / 2n).toString());
    const base = id.replace(/-hedge$/, '');
    const otherId = id.endsWith('-hedge') ? base : `${base}-hedge`;
    // Two grants: the first ticket and the hedge's, each half the cap, at different providers.
    expect(granted).toHaveLength(2);
    expect(granted.map((t) => [t.request_id, t.max_cost_micro_usd])).toEqual([
      [base, (CAP / 2n).toString()],
      [`${base}-hedge`, (CAP / 2n).toString()],
    ]);
    expect(new Set(granted.map((t) => t.provider))).toEqual(new Set([wide.providerId, narrow.providerId]));

    const loser = await record(otherId);
    expect(loser.provider).toBe(granted.find((t) => t.request_id === otherId)!.provider);
    expect(loser.provider).not.toBe(winner.provider);
    await record(id);
    await gw.idle();
    const after = await totals();
    const billed = BigInt(after.cost_micro_usd) - BigInt(before.cost_micro_usd);
    // What the market billed is exactly the receipts of these two attempts, and within the cap.
    const winnerBilled = await marketReceipt(id);
    const loserBilled = await marketReceipt(otherId);
    expect(winnerBilled?.cost_micro_usd).toBe(winner.cost_micro_usd);
    expect(after.receipts - before.receipts).toBe(1 + (loserBilled ? 1 : 0));
    expect(billed).toBe(BigInt(winner.cost_micro_usd) + BigInt(loserBilled?.cost_micro_usd ?? '0'));
    expect(billed <= CAP).toBe(true);
    if (loser.receipt) expect(payloadOf(loser.receipt).hold_micro_usd).toBe((CAP / 2n).toString());
    else expect(loser.error?.code).toBe('hedge_cancelled');
  });
});

describe('a request whose need only the wider provider can hold (the market picks without counting tokens)', () => {
  test('a provider whose context is too small refuses it before any work and it fails over to one that can hold it, keeping the buyer\'s wait: billed once', async () => {
    granted = [];
    const before = await totals();
    // About 610 tokens of need: more than the narrow node's 512, within the wide node's 1024. The
    // narrow node first (X-Service-Prefer-Providers keeps its order), as the market may pick it.
    const res = await post('chat/completions', chatBody(600, 20), { 'x-service-prefer-providers': `${narrow.providerId},${wide.providerId}` });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    const receipt = payloadOf(((await res.json()) as { service: { receipt: DsseEnvelope } }).service.receipt);
    expect(receipt.provider).toBe(wide.providerId);
    // The narrow node refused at once; the next ticket asked for a context above its 512, with the buyer's wait intact.
    expect(granted.map((t) => [t.provider, t.routing.min_context])).toEqual([[narrow.providerId, undefined], [wide.providerId, 513]]);
    expect(granted[1]!.routing.max_wait_ms).toBeUndefined();
    expect(id).toBe(`${granted[0]!.request_id}-f1`);
    expect(await record(granted[0]!.request_id)).toMatchObject({ status: 'refused', receipt: null, error: { code: 'context_length_exceeded' } });
    await gw.idle();
    const after = await totals();
    expect(after.receipts).toBe(before.receipts + 1);
    expect(BigInt(after.cost_micro_usd) - BigInt(before.cost_micro_usd)).toBe(BigInt(receipt.cost_micro_usd));
  });

  test('without preferences, wherever the market sends it first, it is answered by the provider that can hold it', async () => {
    for (let i = 0; i < 4; i++) {
      const before = await totals();
      const res = await post('chat/completions', chatBody(600, 30 + i));
      expect(res.status).toBe(200);
      expect(payloadOf(((await res.json()) as { service: { receipt: DsseEnvelope } }).service.receipt).provider).toBe(wide.providerId);
      await gw.idle();
      expect((await totals()).receipts).toBe(before.receipts + 1);
    }
  });

  test('a request no provider can hold is 400 context_length_exceeded once every wider provider has refused it, nothing charged', async () => {
    const before = await totals();
    granted = [];
    const res = await post('chat/completions', chatBody(1100, 30));
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect([res.status, body.error.code]).toEqual([400, 'context_length_exceeded']);
    expect(body.error.message).toMatch(/context of 1024/); // the widest provider's refusal
    expect(granted.at(-1)!.provider).toBe(wide.providerId);
    await gw.idle();
    expect((await totals()).receipts).toBe(before.receipts);
  });
});

describe('a body the request contract refuses', () => {
  test('is 400 naming the field at the gateway, before any ticket is taken or provider dialled', async () => {
    granted = [];
    const before = await totals();
    for (const [body, field] of [
      [{ model: MODEL, messages: [] }, 'messages'],
      [{ model: MODEL, messages: MESSAGES, logit_bias: { '1': 5 } }, 'logit_bias'],
      [{ model: MODEL, messages: MESSAGES, n: 2 }, 'n'],
    ] as const) {
      const res = await post('chat/completions', JSON.stringify(body));
      const e = ((await res.json()) as { error: { code: string; message: string } }).error;
      expect([res.status, e.code], field).toEqual([400, 'invalid_request']);
      expect(e.message.startsWith(`${field}: `), e.message).toBe(true);
    }
    expect(granted).toEqual([]);
    expect((await totals()).receipts).toBe(before.receipts);
  });
});
