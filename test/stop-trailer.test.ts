// A request answered as the node stops reaches its buyer whole, trailer and receipt included, even
// when the buyer opens another stream on the same connection just then. The node used to close its
// connections within milliseconds of the last answer: the buyer's write on the new stream met a
// closed socket, its libp2p reset the whole connection, and the trailer it had received but not
// yet read went with it (s22 h4: a `completed`, billed request read as failed by the gateway).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, expect, test, vi } from 'vitest';
import { utf8 } from '../attestation/bytes.ts';
import { sha256Hex } from '../attestation/hash.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { createHost, type Host } from '../src/p2p/host.ts';
import { INFER_PROTOCOL } from '../src/p2p/infer-protocol.ts';
import { LOG_PROTOCOL } from '../src/p2p/log-protocol.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { StreamResponseWriter } from '../src/p2p/response-writer.ts';
import type { JsonObject } from '../src/p2p/frames.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { startTinyNode } from './helpers/node-config.ts';

const market = testKey();
let dir: string;
let buyer: Host;
beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'stop-trailer-'));
  buyer = await createHost({ seed: testKey().seed, listen: [] });
});
afterAll(async () => {
  await buyer?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});
afterEach(() => vi.restoreAllMocks());

test.each([
  [false, 'log'],
  [true, 'log'],
  [false, 'infer'],
  [true, 'infer'],
] as const)('stopped as its trailer leaves, another stream opened on its connection a moment later (stream: %s, then a %s request): the buyer reads the trailer and its receipt', async (stream, kind) => {
  const node = await startTinyNode(path.join(dir, `node-${stream}-${kind}`), { publicKey: market.id, logLevel: 'fatal' });
  const addr = node.addresses[0]!;
  const body = utf8(JSON.stringify({ model: 'tiny/llama', prompt: 'hello world', max_tokens: 20, seed: 1, stream }));
  const t = ticketPayload(node.providerId, { endpoint: 'completions', price_version: node.priceVersion, body_sha256: sha256Hex(body) });
  // As the node writes this request's trailer: the stop, and the buyer's next stream (a log query, as a gateway's receipt fetch).
  let stopping: Promise<void> | undefined;
  let next: Promise<unknown> | undefined;
  const trailer = StreamResponseWriter.prototype.trailer;
  vi.spyOn(StreamResponseWriter.prototype, 'trailer').mockImplementation(function (this: StreamResponseWriter, value: JsonObject) {
    const sent = trailer.call(this, value);
    if (value.request_id === t.request_id && !stopping) {
      stopping = node.stop(10_000);
      next = new Promise((r) => setTimeout(r, 0)).then(() => request(buyer, addr, kind === 'log' ? LOG_PROTOCOL : INFER_PROTOCOL, kind === 'log' ? { op: 'checkpoint' } : { endpoint: 'completions', ticket: signTicket(market, ticketPayload(node.providerId, { endpoint: 'completions', price_version: node.priceVersion, body_sha256: sha256Hex(body) })) }, kind === 'log' ? undefined : body)).then(readResponse).catch((e: unknown) => e);
    }
    return sent;
  });
  const answer = await readResponse(await request(buyer, addr, INFER_PROTOCOL, { endpoint: 'completions', ticket: signTicket(market, t) }, body)).catch((e: unknown) => e as Error);
  await stopping;
  await next;
  expect(answer).not.toBeInstanceOf(Error);
  const { head, trailer: got } = answer as Awaited<ReturnType<typeof readResponse>>;
  expect(head.status).toBe(200);
  const v = verifyReceipt(got.receipt as never, { provider: node.providerId });
  expect(v.ok && v.value.payload).toMatchObject({ request_id: t.request_id, status: 'completed' });
}, 60_000);
