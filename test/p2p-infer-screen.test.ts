// A request's HEAD is screened before its body is read (s25 review: four throwaway peer ids, no
// ticket, filled the 256 MiB body budget for a minute and paying buyers got 503). A request whose
// ticket verifies takes from the paid budget; any other takes from a small open one and may send
// only what is read without a ticket, refused as soon as it sends more.
import crypto from 'node:crypto';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { createHost, type Host } from '../src/p2p/host.ts';
import { INFER_PROTOCOL, serveInfer } from '../src/p2p/infer-protocol.ts';
import { RequestBytesBudget } from '../src/p2p/request-server.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { PARSED_BEFORE_TICKET } from '../src/serve/infer-service.ts';
import { signTicket, testKey, ticketPayload } from './helpers/receipts.ts';
import { startServing, type Serving } from './helpers/serving.ts';
import { until } from './helpers/wait.ts';

const market = testKey();
const nodeKey = testKey();
const paid = new RequestBytesBudget(2 << 20, 2 << 20);
const open = new RequestBytesBudget(1 << 20, 1 << 20);
let serving: Serving;
let node: Host;
let addr: string;
const hosts: Host[] = [];
let release!: () => void;
const released = new Promise<void>((r) => (release = r));

beforeAll(async () => {
  serving = await startServing({ nodeSeed: nodeKey.seed, nodeId: nodeKey.id, marketId: market.id, slots: 2 });
  node = await createHost({ seed: nodeKey.seed, listen: ['/ip4/127.0.0.1/tcp/0'] });
  await serveInfer(node, serving.service, { budget: paid, openBudget: open });
  addr = node.getMultiaddrs()[0]!.toString();
});
afterAll(async () => {
  release();
  for (const h of hosts) await h.stop();
  await node?.stop();
  await serving?.close();
});

async function peer(): Promise<Host> {
  const h = await createHost({ seed: testKey().seed, listen: [] });
  hosts.push(h);
  return h;
}

/** `first` bytes of body, then nothing until the test ends. */
async function* stalled(first: number): AsyncIterable<Uint8Array> {
  yield new Uint8Array(first).fill(0x20);
  await released;
}

function paidAsk(body: object) {
  const bytes = bigBytes(body);
  const payload = ticketPayload(nodeKey.id, { endpoint: 'chat/completions', model: 'tiny/llama', price_version: 'p1', body_sha256: toHex(crypto.createHash('sha256').update(bytes).digest()), max_cost_micro_usd: '100000' });
  return { head: { endpoint: 'chat/completions', ticket: signTicket(market, payload) }, bytes, payload };
}

// A large paid body: a small chat request and 300 KiB of JSON whitespace.
const big = { model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 4, seed: 1 };
const bigBytes = (body: object) => utf8(JSON.stringify(body) + ' '.repeat(300 << 10));

describe('the infer protocol screens each HEAD', () => {
  test('without a ticket (or with a forged one) a body is refused with the ticket\'s code as soon as it passes what is read unpaid, while it is still being sent', async () => {
    const p = await peer();
    const noTicket = await readResponse(await request(p, addr, INFER_PROTOCOL, { endpoint: 'chat/completions' }, stalled(PARSED_BEFORE_TICKET + 1)));
    expect(noTicket.head.status).toBe(401);
    expect(noTicket.trailer).toMatchObject({ error: { code: 'ticket_invalid', message: 'head.ticket is missing' } });
    const { head } = paidAsk(big);
    const forgedTicket = signTicket(testKey(), (head.ticket as unknown as { payload: string }) && paidAsk(big).payload);
    const forged = await readResponse(await request(p, addr, INFER_PROTOCOL, { endpoint: 'chat/completions', ticket: forgedTicket }, stalled(PARSED_BEFORE_TICKET + 1)));
    expect(forged.head.status).toBe(401);
    expect(forged.trailer).toMatchObject({ error: { code: 'ticket_invalid' } });
    await until('the refused streams give back what they held', () => open.inUse === 0 && paid.inUse === 0);
  });

  test('peers without tickets fill only the open budget: a paying buyer\'s large body still gets in and is answered with a receipt', async () => {
    // Three throwaway peers, each with many streams holding just under what is read unpaid.
    const attackers = [await peer(), await peer(), await peer()];
    const held: Promise<unknown>[] = [];
    for (const a of attackers) {
      for (let i = 0; i < 8; i++) held.push(request(a, addr, INFER_PROTOCOL, { endpoint: 'chat/completions' }, stalled(PARSED_BEFORE_TICKET - 1024)).then((r) => readResponse(r)).catch(() => undefined));
    }
    await until('the open budget is full', () => open.inUse > (1 << 20) - PARSED_BEFORE_TICKET, 15_000);
    // One more without a ticket: no room.
    const more = await readResponse(await request(await peer(), addr, INFER_PROTOCOL, { endpoint: 'chat/completions' }, new Uint8Array(32 << 10)));
    expect(more.trailer).toMatchObject({ error: { code: 'no_capacity' } });
    expect(paid.inUse).toBe(0);
    // The paying buyer: in.
    const { head, bytes, payload } = paidAsk(big);
    const res = await readResponse(await request(await peer(), addr, INFER_PROTOCOL, head, bytes));
    expect(res.head.status).toBe(200);
    const v = verifyReceipt(res.trailer.receipt as string, { provider: nodeKey.id });
    expect(v.ok && v.value.payload.request_id).toBe(payload.request_id);
    expect(open.inUse).toBeGreaterThan(0); // (the attackers still hold theirs)
  });

  test('one ticket vouches for one body at a time: a second stream under it that sends more than is read unpaid is refused as a replay', async () => {
    const { head } = paidAsk(big);
    // (peers already connected where there are: libp2p takes only so many new connections a second from one address)
    const p = hosts[0] ?? (await peer());
    const first = request(p, addr, INFER_PROTOCOL, head, stalled(PARSED_BEFORE_TICKET * 2)).then((r) => readResponse(r)).catch(() => undefined);
    await until('the first body is being received under the ticket', () => paid.heldBy(p.peerId.toString()) >= PARSED_BEFORE_TICKET * 2);
    const second = await readResponse(await request(hosts[1] ?? (await peer()), addr, INFER_PROTOCOL, head, new Uint8Array(PARSED_BEFORE_TICKET * 2)));
    expect(second.head.status).toBe(409);
    expect(second.trailer).toMatchObject({ error: { code: 'ticket_replayed' } });
    void first;
  });
});
