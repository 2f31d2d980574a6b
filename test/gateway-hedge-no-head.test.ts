// A hedged request where neither half's HEAD reaches the gateway, though both nodes made a
// `completed` receipt durable: the buyer gets a 502 and nothing, so neither receipt is settled
// (s24 hA: the half that lost the race was settled as a hedge loser, billed in full for a 502).
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { serializeEnvelope } from '../attestation/dsse.ts';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { MarketProxy, ScriptedNode } from './helpers/misbehaving-node.ts';
import { waitFor, waitForListed } from './helpers/wait.ts';
import { gatewayRecord, marketHas } from './helpers/gateway-reads.ts';

let dir: string;
let market: Market;
let marketUrl: string;
let proxy: MarketProxy;
const nodes: ScriptedNode[] = [];
let gw: Gateway;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hedge-no-head-'));
  market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)), heartbeatIntervalMs: 60_000 });
  marketUrl = (await market.listen()).url;
  proxy = await MarketProxy.start(marketUrl);
  for (const n of ['a', 'b']) {
    fs.mkdirSync(path.join(dir, n));
    const s = await ScriptedNode.start(path.join(dir, n));
    await s.register(marketUrl);
    nodes.push(s);
  }
  await waitForListed(marketUrl, nodes.map((n) => n.providerId));
  gw = await createGateway({ market: proxy.url, port: 0, receiptFetchMs: 800 });
});
afterAll(async () => {
  await gw?.close(1000);
  for (const n of nodes) await n.stop();
  await proxy?.close();
  await market?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a hedge whose halves both break off before their HEAD: 502, and neither half\'s completed receipt is settled', async () => {
  const logged = new Map<string, string>();
  for (const n of nodes) {
    n.behaviour = async (ex) => {
      await new Promise((r) => setTimeout(r, n === nodes[0] ? 50 : 250)); // (one breaks first: the other is then the "loser")
      logged.set(ex.ticket.request_id, await ex.logReceipt());
      ex.reset();
    };
  }
  proxy.reset();
  const res = await fetch(`${gw.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-service-hedge': '1' },
    body: JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hedged, both lost' }], max_tokens: 8 }),
  });
  expect(res.status).toBe(502);
  await res.text();
  const id = res.headers.get('x-request-id')!;
  const other = id.endsWith('-hedge') ? id.slice(0, -'-hedge'.length) : `${id}-hedge`;
  expect(new Set(logged.keys())).toEqual(new Set([id, other]));
  for (const half of [id, other]) {
    const rec = await waitFor(`half ${half} recorded with its receipt`, async () => {
      const r = await gatewayRecord(gw.url, half);
      return r.receipt ? r : undefined;
    });
    expect(rec).toMatchObject({ status: 'failed', settled: false, cost: null, error: { code: 'answer_not_delivered' } });
    expect(serializeEnvelope(rec.receipt!)).toBe(logged.get(half));
    expect(await marketHas(marketUrl, half)).toBe(false);
  }
  expect(proxy.receiptPosts).toBe(0);
});
