// A buyer's request to the node over real libp2p on loopback (TCP + Noise + Yamux): ticket, body,
// streamed answer, trailer with a receipt that verifies; an abandoned stream leaves a cancelled
// receipt; garbage on the protocol gets a code and the node keeps serving.
import crypto from 'node:crypto';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { createHost, type Host } from '../src/p2p/host.ts';
import { INFER_PROTOCOL, serveInfer } from '../src/p2p/infer-protocol.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { startServing, type Serving } from './helpers/serving.ts';

const market = testKey();
const nodeKey = testKey();
let serving: Serving;
let log: ReceiptLog;
let node: Host;
let buyer: Host;
let addr: string;

beforeAll(async () => {
  serving = await startServing({ nodeSeed: nodeKey.seed, nodeId: nodeKey.id, marketId: market.id, slots: 2 });
  log = serving.log;
  node = await createHost({ seed: nodeKey.seed, listen: ['/ip4/127.0.0.1/tcp/0'] });
  buyer = await createHost({ seed: testKey().seed, listen: ['/ip4/127.0.0.1/tcp/0'] });
  await serveInfer(node, serving.service);
  addr = node.getMultiaddrs()[0]!.toString();
});
afterAll(async () => {
  await buyer?.stop();
  await node?.stop();
  await serving?.close();
});

function ask(body: object, ticketOver = {}) {
  const bytes = utf8(JSON.stringify(body));
  const payload = ticketPayload(nodeKey.id, { endpoint: 'chat/completions', model: 'tiny/llama', price_version: 'p1', body_sha256: toHex(crypto.createHash('sha256').update(bytes).digest()), max_cost_micro_usd: '100000', ...ticketOver });
  return { head: { endpoint: 'chat/completions', ticket: signTicket(market, payload) }, bytes, requestId: payload.request_id };
}

const chat = { model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 16, seed: 5 };

describe('/service/infer/1.0.0 over libp2p', () => {
  test('a streamed chat completion and its receipt, authenticated by the node\'s own key', async () => {
    const { head, bytes } = ask({ ...chat, stream: true, stream_options: { include_usage: true } });
    const res = await readResponse(await request(buyer, addr, INFER_PROTOCOL, head, bytes));
    expect(res.head).toMatchObject({ status: 200, headers: { 'content-type': 'text/event-stream', 'x-service-stream-mode': 'live' } });
    const events = Buffer.from(res.body).toString('utf8').split('\n\n').filter(Boolean);
    expect(events.at(-1)).toBe('data: [DONE]');
    const v = verifyReceipt(res.trailer.receipt as string, { provider: nodeKey.id });
    expect(v.ok).toBe(true);
    if (v.ok) expect(v.value.payload.response_sha256).toBe(crypto.createHash('sha256').update(res.body).digest('hex'));
    // The connection's remote key is the receipt's signer: Noise authenticated the provider id.
    expect(buyer.getConnections()[0]!.remotePeer.toString()).toBe(node.peerId.toString());
  });

  test('a stream\'s closing chunks (finish, usage) end with service.request_id and leave with [DONE] in one DATA frame', async () => {
    for (const includeUsage of [true, false]) {
      const { head, bytes, requestId } = ask({ ...chat, stream: true, ...(includeUsage ? { stream_options: { include_usage: true } } : {}) });
      const res = await request(buyer, addr, INFER_PROTOCOL, head, bytes);
      const frames: string[] = [];
      for await (const f of res.frames) if (f.kind === 'data') frames.push(Buffer.from(f.bytes).toString('utf8'));
      const last = frames.at(-1)!.split('\n\n').filter(Boolean);
      expect(last.at(-1)).toBe('data: [DONE]');
      const closing = last.slice(0, -1).map((e) => JSON.parse(e.slice(6)) as { choices: { finish_reason: string | null }[]; usage?: unknown; service?: unknown });
      expect(closing.length, `include_usage ${includeUsage}`).toBe(includeUsage ? 2 : 1);
      expect(closing[0]!.choices[0]!.finish_reason).toMatch(/^(stop|length)$/);
      if (includeUsage) expect(closing[1]).toMatchObject({ choices: [], usage: { cost: expect.any(String) } });
      for (const c of closing) {
        expect(c.service).toEqual({ request_id: requestId });
        expect(Object.keys(c).at(-1)).toBe('service');
      }
      // No token chunk carries it.
      expect(frames.slice(0, -1).join('')).not.toContain('"service"');
    }
  });

  test('closing the stream early cancels the request, stops the runtime and still leaves a receipt', async () => {
    const { head, bytes, requestId } = ask({ ...chat, stream: true, max_tokens: 480 });
    const res = await request(buyer, addr, INFER_PROTOCOL, head, bytes);
    await res.head;
    let frames = 0;
    for await (const f of res.frames) {
      if (f.kind === 'data' && ++frames === 3) break; // leaving the loop resets the stream
    }
    let lines: { line: string }[] = [];
    for (let i = 0; i < 100 && lines.length === 0; i++) {
      await new Promise((r) => setTimeout(r, 20));
      lines = log.byRequestId(requestId);
    }
    expect(lines.length).toBe(1);
    const v = verifyReceipt(lines[0]!.line, { provider: nodeKey.id });
    expect(v.ok && v.value.payload.status).toBe('cancelled');
    if (!v.ok) return;
    const { usage, usage_runtime: runtime } = v.value.payload;
    expect(usage.output_tokens).toBeLessThan(480);
    // The runtime stopped soon after the close: it produced at most what the node had read ahead
    // of the stream and what waited for its next write, not the 480 asked for.
    expect(runtime.completion_tokens).toBeGreaterThanOrEqual(usage.output_tokens);
    expect(runtime.completion_tokens).toBeLessThan(usage.output_tokens + 100);
  });

  test('a forged ticket is refused with a code and nothing is charged', async () => {
    const before = log.size;
    const { head, bytes } = ask(chat);
    const forged = { ...head, ticket: signTicket(testKey(), ticketPayload(nodeKey.id)) };
    const res = await readResponse(await request(buyer, addr, INFER_PROTOCOL, forged, bytes));
    expect([res.head.status, (res.trailer.error as { code: string }).code]).toEqual([401, 'ticket_invalid']);
    expect(log.size).toBe(before);
  });

  test('garbage on the protocol does not disturb the node (the 400 + frame code is in p2p-request-stream tests)', async () => {
    const stream = await buyer.dialProtocol(node.peerId, INFER_PROTOCOL);
    stream.send(Uint8Array.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]));
    await stream.close().catch(() => undefined);
    const { head, bytes } = ask(chat);
    const res = await readResponse(await request(buyer, addr, INFER_PROTOCOL, head, bytes));
    expect(res.head.status).toBe(200);
  });

  test('an unknown protocol is refused by the node, which stays up', async () => {
    await expect(buyer.dialProtocol(node.peerId, '/service/nope/1.0.0')).rejects.toThrow();
    const { head, bytes } = ask(chat);
    expect((await readResponse(await request(buyer, addr, INFER_PROTOCOL, head, bytes))).head.status).toBe(200);
  });
});
