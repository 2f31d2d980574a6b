// X-Service-Hedge through the gateway: two providers race, the winner answers, the loser is
// cancelled at its node and settled for the work it did — never billed as the answer.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { serializeEnvelope, type DsseEnvelope } from '../attestation/dsse.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import type { RequestRecord } from '../src/gateway/records.ts';
import type { RunningNode } from '../src/node.ts';
import { startMarketFixture, type MarketFixture } from './helpers/market-fixture.ts';
import { waitForListed } from './helpers/wait.ts';
import { endedRecord } from './helpers/gateway-reads.ts';

const MODEL = 'tiny/llama';
let fx: MarketFixture;
let marketUrl: string;
const nodes: RunningNode[] = [];
let gw: Gateway;

beforeAll(async () => {
  fx = await startMarketFixture('gateway-hedge-', { heartbeatIntervalMs: 1000 });
  marketUrl = fx.url;
  for (const name of ['a', 'b']) nodes.push(await fx.tinyNode(name));
  await waitForListed(marketUrl, nodes.map((n) => n.providerId));
  gw = await createGateway({ market: marketUrl, port: 0 });
});
afterAll(async () => {
  await gw?.close(1000);
  await fx?.close();
});

const record = (id: string): Promise<RequestRecord> => endedRecord(gw.url, id);

describe('hedged dispatch', () => {
  test('the winner answers and is billed; the loser is cancelled and settled for its own work', async () => {
    const res = await fetch(`${gw.url}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-service-hedge': '1' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello world' }], max_tokens: 300, seed: 5 }),
    });
    expect(res.status).toBe(200);
    const winnerId = res.headers.get('x-request-id')!;
    const body = (await res.json()) as { service: { request_id: string; receipt: DsseEnvelope; hedged_with: string } };
    expect(body.service.request_id).toBe(winnerId);
    const providers = nodes.map((n) => n.providerId);
    const winner = verifyReceipt(serializeEnvelope(body.service.receipt), { provider: JSON.parse(Buffer.from(body.service.receipt.payload, 'base64').toString()).provider });
    expect(winner.ok && winner.value.payload.status).toBe('completed');
    if (!winner.ok) return;
    expect(providers).toContain(winner.value.payload.provider);

    // The loser ran under the other request id, at the other provider.
    const loserId = winnerId.endsWith('-hedge') ? winnerId.slice(0, -'-hedge'.length) : `${winnerId}-hedge`;
    // The answer and both records name the other half: the request's charge is both records' costs.
    expect(body.service.hedged_with).toBe(loserId);
    expect(Object.keys(body.service)).toEqual(['request_id', 'receipt', 'hedged_with']);
    expect((await record(winnerId)).hedged_with).toBe(loserId);
    const loser = await record(loserId);
    expect(loser.hedged_with).toBe(winnerId);
    expect(loser.provider).not.toBe(winner.value.payload.provider);
    expect(providers).toContain(loser.provider);
    if (loser.receipt) {
      const v = verifyReceipt(serializeEnvelope(loser.receipt), { provider: loser.provider! });
      expect(v.ok).toBe(true);
      // Cancelled while running (or finished just before the cancel arrived): billed for its work only.
      expect(['cancelled', 'completed']).toContain(v.ok && v.value.payload.status);
      expect(loser.settled).toBe(true);
    } else {
      expect(loser.error?.code).toBe('hedge_cancelled'); // cancelled before it did any work
    }
  });

  test('streamed, the closing chunk\'s service names the other half too', async () => {
    const res = await fetch(`${gw.url}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-service-hedge': '1' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello world' }], max_tokens: 20, seed: 5, stream: true, stream_options: { include_usage: true } }),
    });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    const events = (await res.text()).split('\n\n').filter((e) => e.startsWith('data: ') && e !== 'data: [DONE]').map((e) => JSON.parse(e.slice(6)) as { service?: { request_id: string; receipt?: unknown; hedged_with?: string } });
    const closing = events.at(-1)!;
    const other = id.endsWith('-hedge') ? id.slice(0, -'-hedge'.length) : `${id}-hedge`;
    expect(closing.service).toMatchObject({ request_id: id, hedged_with: other });
    expect(closing.service!.receipt).toBeDefined();
    expect((await record(other)).hedged_with).toBe(id);
  });

  test('without the header a request runs once', async () => {
    const before = ((await (await fetch(`${marketUrl}/v1/totals`)).json()) as { receipts: number }).receipts;
    const res = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 }) });
    expect(res.status).toBe(200);
    await res.json();
    expect((await record(res.headers.get('x-request-id')!)).settled).toBe(true); // settlement follows the answer
    const after = ((await (await fetch(`${marketUrl}/v1/totals`)).json()) as { receipts: number }).receipts;
    expect(after).toBe(before + 1);
  });

  test('a retry under the same Idempotency-Key goes back to the first provider: the same answer and receipt, billed once', async () => {
    const totals = async () => ((await (await fetch(`${marketUrl}/v1/totals`)).json()) as { receipts: number; cost_micro_usd: string });
    const send = () =>
      fetch(`${gw.url}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'retry-at-the-same-node' },
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'say it once' }], max_tokens: 12, seed: 3 }),
      });
    const before = await totals();
    const first = await send();
    expect(first.status).toBe(200);
    const a = (await first.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
    const firstRecord = await record(a.service.request_id);
    expect(firstRecord.settled).toBe(true);
    // Two providers serve the model and the market alternates between them: every retry still lands where the first ran.
    for (let i = 0; i < 3; i++) {
      const retry = await send();
      expect(retry.status).toBe(200);
      const b = (await retry.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
      expect(b.service.request_id).toBe(a.service.request_id);
      expect(b.service.receipt).toEqual(a.service.receipt);
    }
    await gw.idle(); // a wrong second settlement would have landed by now
    expect((await totals()).receipts).toBe(before.receipts + 1);
    // The first request's record is as it was: a retry only points at it.
    expect(await record(a.service.request_id)).toEqual(firstRecord);
  });

  test('a hedged request retried under its Idempotency-Key: the same answer, its service naming the same other half (whole body and stream)', async () => {
    for (const stream of [false, true]) {
      const send = () =>
        fetch(`${gw.url}/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-service-hedge': '1', 'idempotency-key': `hedged-retry-${stream}` },
          body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'say it twice' }], max_tokens: 12, seed: 4, stream }),
        });
      const service = async (r: Response) => {
        expect(r.status).toBe(200);
        if (!stream) return ((await r.json()) as { service: Record<string, unknown> }).service;
        const events = (await r.text()).split('\n\n').filter((e) => e.startsWith('data: {'));
        return (JSON.parse(events.at(-1)!.slice(6)) as { service: Record<string, unknown> }).service;
      };
      const first = await service(await send());
      expect(first.hedged_with, `stream ${stream}`).toEqual(expect.any(String));
      await gw.idle();
      expect(await service(await send()), `stream ${stream}`).toEqual(first);
    }
  });

  test('with --records, a retry after the gateway restarts still goes back to the first provider: billed once', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'seller-node-idem-restart-'));
    const recordsPath = path.join(dir, 'records.db');
    const totals = async () => ((await (await fetch(`${marketUrl}/v1/totals`)).json()) as { receipts: number }).receipts;
    const send = (g: Gateway) =>
      fetch(`${g.url}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'retry-after-a-restart' },
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'once, across restarts' }], max_tokens: 12, seed: 4 }),
      });
    try {
      const before = await totals();
      const g1 = await createGateway({ market: marketUrl, port: 0, recordsPath });
      const first = await send(g1);
      expect(first.status).toBe(200);
      const a = (await first.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
      await g1.idle();
      await g1.close(1000);
      const g2 = await createGateway({ market: marketUrl, port: 0, recordsPath });
      try {
        // The market alternates between the two providers: without the kept provider a retry would run at the other.
        for (let i = 0; i < 3; i++) {
          const retry = await send(g2);
          expect(retry.status).toBe(200);
          const b = (await retry.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
          expect(b.service.request_id).toBe(a.service.request_id);
          expect(b.service.receipt).toEqual(a.service.receipt);
        }
        await g2.idle();
      } finally {
        await g2.close(1000);
      }
      expect(await totals()).toBe(before + 1);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a hedge under X-Service-Max-Cost-Usd holds half the cap an attempt: both together never spend more than the cap, and an answer is never cut to what half pays for', async () => {
    const payloadOf = (env: DsseEnvelope) => JSON.parse(Buffer.from(env.payload, 'base64').toString()) as { provider: string; hold_micro_usd: string; cost_micro_usd: string; usage: { output_tokens: number } };
    const ask = (maxTokens: number, headers: Record<string, string>) =>
      fetch(`${gw.url}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello world' }], max_tokens: maxTokens, seed: 5, temperature: 0 }),
      });
    for (const maxTokens of [200, 400]) {
      // The answer as asked, neither hedged nor capped (both providers serve the same model file).
      const plain = await ask(maxTokens, {});
      expect(plain.status).toBe(200);
      const asked = payloadOf(((await plain.json()) as { service: { receipt: DsseEnvelope } }).service.receipt).usage.output_tokens;
      // Worst cases ≈ 122 and ≈ 242 micro-USD: both within the cap of 300, so neither is refused.
      const res = await ask(maxTokens, { 'x-service-hedge': '1', 'x-service-max-cost-usd': '0.0003' });
      expect(res.status).toBe(200);
      const id = res.headers.get('x-request-id')!;
      const receipt = ((await res.json()) as { service: { receipt: DsseEnvelope } }).service.receipt;
      const winner = payloadOf(receipt);
      expect(winner.usage.output_tokens).toBe(asked); // never cut short
      if (maxTokens === 200) {
        // Half the cap pays for the worst case: hedged, each attempt holding half the cap.
        expect(winner.hold_micro_usd).toBe('150');
        const otherId = id.endsWith('-hedge') ? id.slice(0, -'-hedge'.length) : `${id}-hedge`;
        const other = await record(otherId);
        // The hedge really ran: the other half went to the other provider.
        expect(nodes.map((n) => n.providerId)).toContain(other.provider);
        expect(other.provider).not.toBe(winner.provider);
        // The loser billed its half at most, or did no work at all.
        if (other.receipt) expect(payloadOf(other.receipt).hold_micro_usd).toBe('150');
        else expect(other.error?.code).toBe('hedge_cancelled');
      } else {
        // Half the cap does not pay for the worst case: both halves refused it before any work
        // (request_cost_limit_exceeded), and it ran once, unhedged, with the whole cap.
        expect(id).toMatch(/-whole$/);
        expect(winner.hold_micro_usd).toBe('300');
        const base = id.slice(0, -'-whole'.length);
        for (const half of [base, `${base}-hedge`]) {
          expect(await record(half)).toMatchObject({ status: 'refused', receipt: null, error: { code: 'request_cost_limit_exceeded' } });
        }
      }
    }
  });
});
