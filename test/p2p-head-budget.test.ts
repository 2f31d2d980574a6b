// What a stream holds before its HEAD is screened (s27 review: five throwaway peer ids on one
// address each opened a stream whose first frame announced a 4 MiB DATA frame, sent most of their
// quarter of the 16 MiB pre-HEAD budget and went silent; the HEAD timer freed the space after 10 s,
// so 1.7 MB/s kept it full, and a paying buyer whose HEAD vouched fine got 503 no_capacity).
// A request's first frame must be a HEAD: anything else is refused at its kind byte, a length
// longer than a HEAD may be as soon as it is read; and the pre-HEAD budget's quarters are per
// address group, so ids made on one address share one quarter.
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { createHost, type Host } from '../src/p2p/host.ts';
import { DEFAULT_FRAME_LIMITS, type Frame } from '../src/p2p/frames.ts';
import { FrameReader, writeBytes } from '../src/p2p/frame-io.ts';
import { handleRequests, addressPart, OPEN_REQUEST_BYTES_BUDGET, RequestBytesBudget, type HandleRequestsOptions } from '../src/p2p/request-server.ts';
import { CAPACITY_PROTOCOL, serveCapacity } from '../src/p2p/capacity-protocol.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { testKey } from './helpers/receipts.ts';
import { varint } from './helpers/frame-bytes.ts';
import { until } from './helpers/wait.ts';
import type { Stream } from '@libp2p/interface';
import type { Multiaddr } from '@multiformats/multiaddr';

const MiB = 1024 * 1024;
let node: Host;
let v4: Multiaddr;
let v6: Multiaddr;
const hosts: Host[] = [];
let protoCounter = 0;

beforeAll(async () => {
  // (many peers from one address, as the attack makes: past the node's per-address limits here)
  node = await createHost({ seed: testKey().seed, listen: ['/ip4/127.0.0.1/tcp/0', '/ip6/::1/tcp/0'], maxConnectionsPerIp: 64, newConnectionsPerIpPerSecond: 1000 });
  v4 = node.getMultiaddrs().find((a) => a.toString().startsWith('/ip4/'))!;
  v6 = node.getMultiaddrs().find((a) => a.toString().startsWith('/ip6/'))!;
});
afterAll(async () => {
  for (const h of hosts) await h.stop();
  await node?.stop();
});

async function peer(): Promise<Host> {
  const h = await createHost({ seed: testKey().seed, listen: [] });
  hosts.push(h);
  return h;
}

interface Served {
  proto: string;
  head: RequestBytesBudget;
  paid: RequestBytesBudget;
  refusals: { remotePeer: string; status: number; code: string }[];
  handled: { peer: string; bytes: number }[];
}

/**
 * A screened protocol as /service/infer is: a HEAD with `ticket: 'paid'` is vouched for, any other
 * may send 64 KiB. Budgets of the process's sizes, its own. The HEAD timer is long: nothing here
 * is refused for taking time.
 */
async function serve(extra: HandleRequestsOptions = {}): Promise<Served> {
  const s: Served = {
    proto: `/test/head-budget/${++protoCounter}/1.0.0`,
    head: new RequestBytesBudget(16 * MiB, 4 * MiB, 'address'),
    paid: new RequestBytesBudget(256 * MiB),
    refusals: [],
    handled: [],
  };
  await handleRequests(
    node,
    s.proto,
    async (req, res) => {
      s.handled.push({ peer: req.remotePeer, bytes: req.body.length });
      await res.head({ status: 200, headers: {} });
      await res.trailer({ bytes: req.body.length });
    },
    {
      screen: (head) => (head.ticket === 'paid' ? { vouched: true } : { vouched: false, maxBody: 64 * 1024, refusal: { status: 401, code: 'ticket_invalid', message: 'no ticket' } }),
      budget: s.paid,
      openBudget: new RequestBytesBudget(32 * MiB, 8 * MiB, 'address'),
      headBudget: s.head,
      headTimeoutMs: 120_000,
      readTimeoutMs: 120_000,
      onRefused: (r) => s.refusals.push(r),
      ...extra,
    },
  );
  return s;
}

/**
 * `ids` new peers on 127.0.0.1 open `each` streams of `proto`, one after the other; each sends a
 * HEAD of 1 MiB announced, 1 MiB of bytes in all (one short of whole), then falls silent. `settled`
 * (if given) is waited for after each stream, with the number opened so far.
 */
async function unfinishedHeads(proto: string, ids: number, each: number, settled?: (opened: number) => boolean): Promise<Stream[]> {
  const streams: Stream[] = [];
  for (let i = 0; i < ids; i++) {
    const p = await peer();
    for (let j = 0; j < each; j++) {
      const stream = await p.dialProtocol(v4, proto);
      streams.push(stream);
      void answerOf(stream).catch(() => undefined);
      await writeBytes(stream, new Uint8Array([...varint(MiB), 0x01, ...new Uint8Array(MiB - 4).fill(0x20)])).catch(() => undefined);
      if (settled) await until(`stream ${streams.length} holds its bytes or is refused`, () => settled(streams.length), 30_000);
    }
  }
  return streams;
}

/** The frames the node answers on a raw stream (its HEAD and TRAILER), or what it did to the stream. */
async function answerOf(stream: Stream): Promise<Frame[]> {
  const reader = new FrameReader(stream);
  const frames: Frame[] = [];
  for (;;) {
    const f = await reader.next();
    if (!f) return frames;
    frames.push(f);
    if (f.kind === 'trailer') return frames;
  }
}

describe('before its HEAD a stream holds at most one HEAD', () => {
  test('a first frame of kind DATA is refused (400 frame_malformed) as soon as its kind byte arrives, and the stream is closed', async () => {
    const s = await serve({ lingerMs: 100 });
    const stream = await (await peer()).dialProtocol(v4, s.proto);
    // A DATA frame of 512 KiB announced (within a HEAD's limit), 1 KiB of it sent; the stream left open.
    await writeBytes(stream, new Uint8Array([...varint(512 * 1024), 0x02, ...new Uint8Array(1024)]));
    const answer = await answerOf(stream);
    expect(answer[0]).toEqual({ kind: 'head', value: { status: 400 } });
    expect(answer[1]).toEqual({ kind: 'trailer', value: { error: { code: 'frame_malformed', message: 'expected a HEAD frame first, got DATA' } } });
    expect(s.refusals).toEqual([expect.objectContaining({ status: 400, code: 'frame_malformed' })]);
    await until('the stream is closed and holds nothing', () => stream.status !== 'open' && s.head.inUse === 0);
    // A TRAILER first too.
    const t = await (await peer()).dialProtocol(v4, s.proto);
    await writeBytes(t, new Uint8Array([...varint(100), 0x03]));
    expect((await answerOf(t))[1]).toEqual({ kind: 'trailer', value: { error: { code: 'frame_malformed', message: 'expected a HEAD frame first, got TRAILER' } } });
  });

  test('a first frame announced longer than a HEAD may be (1 MiB) is refused (400 frame_too_large) as soon as its length arrives, before its kind byte', async () => {
    const s = await serve({ lingerMs: 100 });
    const p = await peer();
    const over = await p.dialProtocol(v4, s.proto);
    await writeBytes(over, new Uint8Array(varint(DEFAULT_FRAME_LIMITS.maxJsonBytes + 1))); // (no kind byte, nothing more)
    const answer = await answerOf(over);
    expect(answer[0]).toEqual({ kind: 'head', value: { status: 400 } });
    expect(answer[1]).toMatchObject({ kind: 'trailer', value: { error: { code: 'frame_too_large' } } });
    // The repro's first frame: a 4 MiB DATA frame announced.
    const data = await p.dialProtocol(v4, s.proto);
    await writeBytes(data, new Uint8Array([...varint(4 * MiB), 0x02, ...new Uint8Array(4096)]));
    expect((await answerOf(data))[1]).toMatchObject({ kind: 'trailer', value: { error: { code: 'frame_too_large' } } });
    expect(s.refusals.map((r) => r.code)).toEqual(['frame_too_large', 'frame_too_large']);
    // A HEAD of the largest size allowed is held whole while it arrives (and then screened).
    const big = await p.dialProtocol(v4, s.proto);
    await writeBytes(big, new Uint8Array([...varint(MiB), 0x01, ...new Uint8Array(MiB - 1).fill(0x20)]));
    await until('the HEAD\'s bytes so far are held', () => s.head.inUse === 3 + 1 + MiB - 1);
    expect(s.refusals.length).toBe(2);
    big.abort(new Error('done'));
    await until('the aborted stream gives its bytes back', () => s.head.inUse === 0);
  });

  test('the reviewer\'s attack: five ids on one address, each a 4 MiB DATA frame announced and most of a quarter of the budget sent, no longer keep a paying buyer\'s large body out', async () => {
    const s = await serve({ lingerMs: 100 });
    const share = s.head.perPeerLimit;
    // One attacker after the other, each once the one before holds what it sent (as it did before
    // the fix) or has been refused (and, its linger over, holds nothing).
    const sent = new Map<string, number>();
    const held = (): number => [...sent].filter(([id]) => !s.refusals.some((r) => r.remotePeer === id)).reduce((n, [, b]) => n + b, 0);
    for (let i = 0; i < 5; i++) {
      const p = await peer();
      const stream = await p.dialProtocol(v4, s.proto);
      void answerOf(stream).catch(() => undefined);
      sent.set(p.peerId.toString(), i < 4 ? share - 64 : 256);
      await writeBytes(stream, new Uint8Array([...varint(4 * MiB), 0x02])).catch(() => undefined);
      await writeBytes(stream, new Uint8Array(sent.get(p.peerId.toString())! - 5)).catch(() => undefined);
      await until(`attacker ${i + 1} holds what it sent or is refused`, () => s.head.inUse === held(), 30_000);
    }
    // The buyer, on the attackers' own address.
    const res = await readResponse(await request(await peer(), v4, s.proto, { ticket: 'paid' }, new Uint8Array(300_000)));
    expect(res.trailer).toEqual({ bytes: 300_000 });
    expect(res.head.status).toBe(200);
    expect(s.handled.map((h) => h.bytes)).toEqual([300_000]);
    expect(s.refusals.map((r) => [r.status, r.code])).toEqual(Array(5).fill([400, 'frame_too_large']));
  });

  test('partial HEADs from many ids on one address hold that address\'s quarter at most: a paying buyer on another address gets its large body in', async () => {
    const s = await serve({ lingerMs: 100 });
    // Five ids on 127.0.0.1, four streams each; each stream a HEAD of 1 MiB announced, 1 MiB of
    // bytes sent in all (a HEAD one short of whole), then silence: 20 MiB offered, 16 MiB budget.
    // One stream after the other, each once the one before holds its bytes or has been refused (and,
    // its linger over, holds nothing).
    const refused = (): number => s.refusals.filter((r) => r.code === 'no_capacity').length;
    const streams = await unfinishedHeads(s.proto, 5, 4, (opened) => s.head.inUse === (opened - refused()) * MiB);
    expect(s.refusals.every((r) => r.code === 'no_capacity')).toBe(true);
    // A paying buyer from ::1: its HEAD and the first of its 300 KB body fit in what is left.
    const buyer = await peer();
    const res = await readResponse(await request(buyer, v6, s.proto, { ticket: 'paid' }, new Uint8Array(300_000)));
    expect(res.trailer).toEqual({ bytes: 300_000 });
    expect(res.head.status).toBe(200);
    expect(s.handled).toEqual([{ peer: buyer.peerId.toString(), bytes: 300_000 }]);
    // (the attackers' address holds its quarter, no more)
    expect(s.head.heldBy(addressPart({ remoteAddr: v4, remotePeer: node.peerId }))).toBeLessThanOrEqual(s.head.perPeerLimit);
    expect(s.head.inUse).toBeLessThanOrEqual(s.head.perPeerLimit);
    for (const st of streams) st.abort(new Error('done'));
  });
});

describe('the open budget (requests nobody paid for, protocols without tickets) is shared per address too', () => {
  test('partial HEADs from many ids on one address to a protocol without tickets hold that address\'s quarter at most: a client on another address still gets its request in', async () => {
    const open = new RequestBytesBudget(32 * MiB, 8 * MiB, 'address');
    const proto = `/test/open-budget/${++protoCounter}/1.0.0`;
    const refusals: { status: number; code: string }[] = [];
    const handled: number[] = [];
    await handleRequests(
      node,
      proto,
      async (req, res) => {
        handled.push(req.body.length);
        await res.head({ status: 200, headers: {} });
        await res.trailer({ bytes: req.body.length });
      },
      { budget: open, headTimeoutMs: 120_000, readTimeoutMs: 120_000, lingerMs: 100, onRefused: (r) => refusals.push(r) },
    );
    // Five ids on 127.0.0.1, eight streams each, each an unfinished 1 MiB HEAD: 40 MiB offered
    // against 32 MiB (per peer id, four ids would have filled it).
    const refused = (): number => refusals.filter((r) => r.code === 'no_capacity').length;
    const streams = await unfinishedHeads(proto, 5, 8, (opened) => open.inUse === (opened - refused()) * MiB);
    expect(open.inUse).toBeLessThanOrEqual(open.perPeerLimit);
    // A client from ::1 with a 300 KB body: what is left takes it.
    const client = await peer();
    const res = await readResponse(await request(client, v6, proto, {}, new Uint8Array(300_000)));
    expect([res.head.status, res.trailer]).toEqual([200, { bytes: 300_000 }]);
    expect(handled).toEqual([300_000]);
    for (const st of streams) st.abort(new Error('done'));
  }, 120_000);

  test('the capacity protocol takes it so: partial HEADs from many ids on one address are that address\'s bytes, a quarter at most; a client on another address is answered', async () => {
    const key = testKey();
    await serveCapacity(node, { seed: key.seed, providerId: key.id }, () => ({ price_version: 'p1', attestation_tier: 'T1', accepting: true, models: [] }));
    const open = OPEN_REQUEST_BYTES_BUDGET;
    const address = addressPart({ remoteAddr: v4, remotePeer: node.peerId });
    const streams = await unfinishedHeads(CAPACITY_PROTOCOL, 5, 8);
    await until('the attackers hold a quarter of the open budget', () => open.inUse >= open.perPeerLimit - MiB, 30_000);
    expect(open.heldBy(address)).toBe(open.inUse); // (all of it under their address, whichever id sent it)
    expect(open.inUse).toBeLessThanOrEqual(open.perPeerLimit);
    const client = await peer();
    const res = await readResponse(await request(client, v6, CAPACITY_PROTOCOL, {}, new Uint8Array(0)));
    expect(res.head.status).toBe(200);
    for (const st of streams) st.abort(new Error('done'));
  }, 120_000);
});
