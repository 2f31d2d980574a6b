// X-Service-Hedge through the gateway: two providers race, the winner answers, the loser is
// cancelled at its node and settled for the work it did — never billed as the answer.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { serializeEnvelope, type DsseEnvelope } from '../attestation/dsse.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { parseConfig } from '../src/config.ts';
import { createGateway, type Gateway } from '../src/gateway/gateway.ts';
import type { RequestRecord } from '../src/gateway/records.ts';
import { createKeyFile } from '../src/identity.ts';
import { createMarket, type Market } from '../src/market/market.ts';
import { startNode, type RunningNode } from '../src/node.ts';

const MODEL = 'tiny/llama';
let dir: string;
let market: Market;
let marketUrl: string;
const nodes: RunningNode[] = [];
let gw: Gateway;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-hedge-'));
  market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)), heartbeatIntervalMs: 1000 });
  marketUrl = (await market.listen()).url;
  writeTinyLlama(path.join(dir, 'tiny.gguf'));
  for (const name of ['a', 'b']) {
    fs.mkdirSync(path.join(dir, name));
    createKeyFile(path.join(dir, name, 'node.key'));
    const yaml = [
      'key: ./node.key',
      'data_dir: ./data',
      'listen: [/ip4/127.0.0.1/tcp/0]',
      `marketplace: { url: "${marketUrl}", public_keys: ["${market.publicKey}"] }`,
      `models: [{ id: ${MODEL}, adapter: llama-embedded, path: ../tiny.gguf, context: 1024, slots: 2, prices: { input_per_mtok_usd: "0.15", output_per_mtok_usd: "0.60" } }]`,
      'ops: { http: "127.0.0.1:0" }',
      'receipts: { signer_threads: 1, checkpoint_interval_ms: 0 }',
      'log_level: error',
    ].join('\n');
    nodes.push(await startNode(parseConfig(yaml, path.join(dir, name))));
  }
  for (let i = 0; i < 200; i++) {
    const list = (await (await fetch(`${marketUrl}/v1/providers`)).json()) as { provider: string }[];
    if (nodes.every((n) => list.some((p) => p.provider === n.providerId))) break;
    await sleep(50);
  }
  gw = await createGateway({ market: marketUrl, port: 0 });
});
afterAll(async () => {
  await gw?.close(1000);
  for (const n of nodes) await n.stop(1000);
  await market?.close();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

async function record(id: string): Promise<RequestRecord> {
  for (let i = 0; i < 100; i++) {
    const r = (await (await fetch(`${gw.url}/requests/${id}`)).json()) as RequestRecord;
    if (r.status !== 'in_progress') return r;
    await sleep(50);
  }
  throw new Error(`request ${id} never settled`);
}

describe('hedged dispatch', () => {
  test('the winner answers and is billed; the loser is cancelled and settled for its own work', async () => {
    const res = await fetch(`${gw.url}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-service-hedge': '1' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hello world' }], max_tokens: 300, seed: 5 }),
    });
    expect(res.status).toBe(200);
    const winnerId = res.headers.get('x-request-id')!;
    const body = (await res.json()) as { service: { request_id: string; receipt: DsseEnvelope } };
    expect(body.service.request_id).toBe(winnerId);
    const providers = nodes.map((n) => n.providerId);
    const winner = verifyReceipt(serializeEnvelope(body.service.receipt), { provider: JSON.parse(Buffer.from(body.service.receipt.payload, 'base64').toString()).provider });
    expect(winner.ok && winner.value.payload.status).toBe('completed');
    if (!winner.ok) return;
    expect(providers).toContain(winner.value.payload.provider);

    // The loser ran under the other request id, at the other provider.
    const loserId = winnerId.endsWith('-hedge') ? winnerId.slice(0, -'-hedge'.length) : `${winnerId}-hedge`;
    const loser = await record(loserId);
    expect(loser.provider).not.toBe(winner.value.payload.provider);
    if (loser.receipt) {
      const v = verifyReceipt(serializeEnvelope(loser.receipt), { provider: loser.provider! });
      expect(v.ok).toBe(true);
      // Cancelled while running (or finished just before the cancel arrived): billed for its work only.
      expect(['cancelled', 'completed']).toContain(v.ok && v.value.payload.status);
      expect(loser.settled).toBe(true);
    } else {
      expect(loser.error?.code).toBe('request_abandoned'); // cancelled before it did any work
    }
  });

  test('without the header a request runs once', async () => {
    const before = ((await (await fetch(`${marketUrl}/v1/totals`)).json()) as { receipts: number }).receipts;
    const res = await fetch(`${gw.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 }) });
    expect(res.status).toBe(200);
    await res.json();
    const after = ((await (await fetch(`${marketUrl}/v1/totals`)).json()) as { receipts: number }).receipts;
    expect(after).toBe(before + 1);
  });
});
