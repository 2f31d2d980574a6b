import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import crypto from 'node:crypto';
import type { Multiaddr } from '@multiformats/multiaddr';
import { createHost, hostProviderId, type Host } from '../src/p2p/host.ts';
import { protocolMergeCacheOf } from '../src/p2p/protocol-merge-cache.ts';
import { peerIdFromSeed } from '../src/p2p/peer-id.ts';
import { identityFromSeed } from '../src/identity.ts';
import { FrameDecoder, encodeData, encodeHead, encodeTrailer, type Frame } from '../src/p2p/frames.ts';
import { varint } from './helpers/frame-bytes.ts';
import {
  handleRequests,
  readResponse,
  request,
  StreamError,
  type HandleRequestsOptions,
  type RequestHandler,
  type RequestServer,
} from '../src/p2p/request-stream.ts';

const serverSeed = new Uint8Array(32).fill(11);
const clientSeed = new Uint8Array(32).fill(22);
let server: Host;
let client: Host;
let addr: Multiaddr;
let protoCounter = 0;

function deferred<T>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const sha256 = (b: Uint8Array) => crypto.createHash('sha256').update(b).digest('hex');

beforeAll(async () => {
  server = await createHost({ seed: serverSeed, listen: ['/ip4/127.0.0.1/tcp/0'] });
  client = await createHost({ seed: clientSeed, listen: [] });
  addr = server.getMultiaddrs()[0]!;
});

afterAll(async () => {
  await client?.stop();
  await server?.stop();
});

/** Registers a handler on a fresh protocol id; returns the id and the server handle. */
async function serve(handler: RequestHandler, opts?: HandleRequestsOptions): Promise<{ proto: string; srv: RequestServer }> {
  const proto = `/test/req/${++protoCounter}/1.0.0`;
  const srv = await handleRequests(server, proto, handler, opts);
  return { proto, srv };
}

/** Sends raw bytes on the protocol and decodes whatever frames come back until the server closes. */
async function rawExchange(proto: string, bytes: Uint8Array, closeWrite = true): Promise<Frame[]> {
  const stream = await client.dialProtocol(addr, proto);
  stream.send(bytes);
  if (closeWrite) await stream.close();
  const dec = new FrameDecoder();
  const frames: Frame[] = [];
  for await (const chunk of stream) frames.push(...dec.push(chunk.subarray()));
  dec.end();
  if (!closeWrite) stream.abort(new Error('done'));
  return frames;
}

const echoHandler: RequestHandler = async (req, res) => {
  await res.head({ status: 200, echo: req.head });
  await res.data(req.body);
  await res.trailer({ ok: true });
};

describe('host', () => {
  it('Noise authenticates the seed-derived identities on both sides', async () => {
    expect(server.peerId.equals(peerIdFromSeed(serverSeed))).toBe(true);
    expect(hostProviderId(server)).toBe(identityFromSeed(serverSeed).providerId);
    let seen: { remotePeer: string; remoteProviderId: string | undefined } | undefined;
    const { proto, srv } = await serve(async (req, res) => {
      seen = { remotePeer: req.remotePeer, remoteProviderId: req.remoteProviderId };
      await res.head({ status: 204 });
      await res.trailer({});
    });
    try {
      const r = await readResponse(await request(client, addr, proto, {}));
      expect(r.head).toEqual({ status: 204 });
      expect(seen?.remotePeer).toBe(peerIdFromSeed(clientSeed).toString());
      expect(seen?.remoteProviderId).toBe(identityFromSeed(clientSeed).providerId);
      const conns = client.getConnections(server.peerId);
      expect(conns.length).toBe(1);
      expect(conns[0]!.remotePeer.equals(peerIdFromSeed(serverSeed))).toBe(true);
      // Once connected, the provider id alone is a dial target.
      const again = await readResponse(await request(client, hostProviderId(server), proto, {}));
      expect(again.head).toEqual({ status: 204 });
    } finally {
      await srv.stop();
    }
  });

  it('a burst of requests on a brand-new connection is served whole: streams opened before the connection is set up are kept, not the connection aborted', async () => {
    // yamux's default allows 10 such early streams and aborts the whole connection at the 11th.
    // 120 at once (under STREAMS_PER_PROTOCOL, 128): with yamux's default, 64 failed only 1 run in
    // 7, 120 failed 4 in 6 in review and 3 in 3 here.
    const BURST = 120;
    for (let round = 0; round < 5; round++) {
      const fresh = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: ['/ip4/127.0.0.1/tcp/0'] });
      const buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
      try {
        await handleRequests(fresh, '/test/burst/1.0.0', echoHandler);
        const to = fresh.getMultiaddrs()[0]!;
        const answers = await Promise.allSettled(Array.from({ length: BURST }, (_, i) => request(buyer, to, '/test/burst/1.0.0', { i }).then(readResponse)));
        expect(answers.filter((a) => a.status === 'rejected').map((a) => String((a as PromiseRejectedResult).reason)), `round ${round}`).toEqual([]);
        expect(answers.map((a) => (a.status === 'fulfilled' ? (a.value.head.echo as { i: number }).i : -1))).toEqual(Array.from({ length: BURST }, (_, i) => i));
      } finally {
        await buyer.stop();
        await fresh.stop();
      }
    }
  });

  it('refuses an unknown protocol id without harm', async () => {
    // Selected optimistically (the default), the refusal arrives in place of the HEAD; negotiated
    // first, before the request is sent.
    const optimistic = await request(client, addr, '/test/no-such-protocol/1.0.0', {}, new Uint8Array(10));
    await expect(optimistic.head).rejects.toMatchObject({ name: 'UnsupportedProtocolError', message: expect.stringContaining('/test/no-such-protocol/1.0.0') });
    await expect(request(client, addr, '/test/no-such-protocol/1.0.0', {}, undefined, { negotiate: 'full' })).rejects.toMatchObject({ name: 'UnsupportedProtocolError' });
    const { proto, srv } = await serve(echoHandler);
    try {
      const r = await readResponse(await request(client, addr, proto, { a: 1 }, new Uint8Array([1, 2, 3])));
      expect(r.head).toEqual({ status: 200, echo: { a: 1 } });
      expect([...r.body]).toEqual([1, 2, 3]);
    } finally {
      await srv.stop();
    }
  });
});

describe('drain', () => {
  /** A server whose handler, once entered, waits for `release` before it answers. */
  async function heldServer() {
    const release = deferred<void>();
    const entered = deferred<void>();
    const served = await serve(async (_req, res) => {
      entered.resolve();
      await release.promise;
      await res.head({ status: 200 });
      await res.trailer({ done: true });
    });
    return { release, entered, ...served };
  }

  it('waits for running handlers, reports the ones still running at the deadline, and cancels nothing', async () => {
    const { release, entered, proto, srv } = await heldServer();
    try {
      expect(await srv.drain(1000)).toBe(true); // nothing running
      const pending = request(client, addr, proto, {}).then(readResponse);
      await entered.promise;
      expect(srv.inFlight).toBe(1);
      expect(await srv.drain(30)).toBe(false); // the handler is held: still running at the deadline
      expect(srv.inFlight).toBe(1);
      release.resolve();
      expect(await srv.drain(10_000)).toBe(true);
      expect(srv.inFlight).toBe(0);
      const r = await pending; // drained, not cancelled: the request finished normally
      expect(r.head).toEqual({ status: 200 });
      expect(r.trailer).toEqual({ done: true });
    } finally {
      await srv.stop();
    }
  });
  it('cancel(): a running handler\'s signal aborts with the reason while its response can still be finished; a request still being received is reset', async () => {
    const entered = deferred<void>();
    let reason: unknown;
    const { proto, srv } = await serve(async (req, res) => {
      await res.head({ status: 200 });
      await res.data(new TextEncoder().encode('part'));
      entered.resolve();
      await new Promise<void>((resolve) => req.signal.addEventListener('abort', () => resolve(), { once: true }));
      reason = req.signal.reason;
      // The work stopped; the response still ends, its trailer saying so.
      await res.data(new TextEncoder().encode(' and the rest'));
      await res.trailer({ status: 'cancelled' });
    });
    try {
      const stuck = await client.dialProtocol(addr, proto);
      const ended = new Promise<string>((resolve) => stuck.addEventListener('close', () => resolve(stuck.status), { once: true }));
      stuck.send(encodeHead({ endpoint: 'x', body_length: 100 })); // ... and nothing more
      const running = request(client, addr, proto, {}).then(readResponse);
      await entered.promise;
      const why = new Error('the node is stopping');
      srv.cancel(why);
      const r = await running;
      expect(reason).toBe(why);
      expect([r.head, new TextDecoder().decode(r.body), r.trailer]).toEqual([{ status: 200 }, 'part and the rest', { status: 'cancelled' }]);
      expect(await ended).toBe('reset');
      expect(await srv.idle(5000)).toBe(true);
    } finally {
      await srv.stop();
    }
  });
  it('a request still being received (a HEAD, and its body never sent) does not hold the drain for its whole timeout: it is reset after a moment; a running handler is still waited for', async () => {
    const { release, entered, proto, srv } = await heldServer();
    try {
      const stuck = await client.dialProtocol(addr, proto);
      const ended = new Promise<string>((resolve) => stuck.addEventListener('close', () => resolve(stuck.status), { once: true }));
      stuck.send(encodeHead({ endpoint: 'x', body_length: 100 })); // ... and nothing more, never closing
      const running = request(client, addr, proto, {}).then(readResponse);
      await entered.promise;
      expect(srv.inFlight).toBe(2);
      setTimeout(() => release.resolve(), 1500); // the handler finishes after the reader's moment
      const drained = await Promise.race([srv.drain(60_000), new Promise<string>((r) => setTimeout(() => r('still waiting after 15 s'), 15_000))]);
      expect(drained).toBe(true);
      expect(await ended).toBe('reset');
      expect((await running).trailer).toEqual({ done: true }); // not cancelled
    } finally {
      await srv.stop();
    }
  }, 30_000);
});

describe('request/response', () => {
  it('round-trips a 1 MB body and 1000 data frames back', async () => {
    const { proto, srv } = await serve(async (req, res) => {
      await res.head({ status: 200, bodySha: sha256(req.body), bodyLen: req.body.length });
      for (let i = 0; i < 1000; i++) await res.data(new TextEncoder().encode(`data: ${i}\n\n`));
      await res.trailer({ receipt: { n: 1000 } });
    });
    try {
      const body = crypto.randomBytes(1_000_000);
      const res = await request(client, addr, proto, { endpoint: '/v1/chat/completions' }, new Uint8Array(body), { dataFrameBytes: 64 * 1024 });
      expect(await res.head).toEqual({ status: 200, bodySha: sha256(body), bodyLen: 1_000_000 });
      const data: string[] = [];
      let trailer: unknown;
      for await (const f of res.frames) {
        if (f.kind === 'data') data.push(new TextDecoder().decode(f.bytes));
        else trailer = f.value;
      }
      expect(data.length).toBe(1000);
      expect(data[0]).toBe('data: 0\n\n');
      expect(data[999]).toBe('data: 999\n\n');
      expect(trailer).toEqual({ receipt: { n: 1000 } });
      expect(res.stream.status).toBe('closed');
    } finally {
      await srv.stop();
    }
  });

  it('accepts a streamed (async iterable) body and an empty one', async () => {
    const { proto, srv } = await serve(echoHandler);
    try {
      async function* parts() {
        yield new Uint8Array([1]);
        await sleep(5);
        yield new Uint8Array([2, 3]);
      }
      expect([...(await readResponse(await request(client, addr, proto, {}, parts()))).body]).toEqual([1, 2, 3]);
      expect((await readResponse(await request(client, addr, proto, {}))).body.length).toBe(0);
    } finally {
      await srv.stop();
    }
  });

  it('serves concurrent requests on one connection', async () => {
    const { proto, srv } = await serve(async (req, res) => {
      await sleep(20 + Math.floor(Math.random() * 30));
      await res.head({ status: 200, i: req.head.i });
      await res.data(req.body);
      await res.trailer({ i: req.head.i });
    });
    try {
      const n = 60;
      const results = await Promise.all(
        Array.from({ length: n }, async (_, i) => {
          const body = new TextEncoder().encode(`body-${i}`.repeat(100));
          const r = await readResponse(await request(client, addr, proto, { i }, body));
          expect(r.head).toEqual({ status: 200, i });
          expect(r.trailer).toEqual({ i });
          expect(new TextDecoder().decode(r.body)).toBe(`body-${i}`.repeat(100));
          return i;
        }),
      );
      expect(results.length).toBe(n);
      expect(client.getConnections(server.peerId).length).toBe(1);
      // libp2p's per-stream "peer speaks this protocol" peer-store merges are answered from the
      // cache once recorded, on both sides (src/p2p/protocol-merge-cache.ts).
      // (A fully negotiated stream, as libp2p opens it: an optimistic one merges nothing on the client.)
      await readResponse(await request(client, addr, proto, { i: 0 }, new Uint8Array(1), { negotiate: 'full' }));
      const before = [protocolMergeCacheOf(client)!.skipped, protocolMergeCacheOf(server)!.skipped];
      for (let i = 0; i < 3; i++) await readResponse(await request(client, addr, proto, { i }, new Uint8Array(1), { negotiate: 'full' }));
      expect(protocolMergeCacheOf(client)!.skipped - before[0]!).toBe(3);
      expect(protocolMergeCacheOf(server)!.skipped - before[1]!).toBe(3);
    } finally {
      await srv.stop();
    }
  });

  it('answers a handler that throws with 500 and an error trailer, and finishes a response left open', async () => {
    const { proto, srv } = await serve(async (req, res) => {
      if (req.head.mode === 'throw') throw new Error('boom');
      await res.head({ status: 200 });
      await res.data(new Uint8Array([9]));
    });
    try {
      const a = await readResponse(await request(client, addr, proto, { mode: 'throw' }));
      expect(a.head).toEqual({ status: 500 });
      expect(a.trailer).toMatchObject({ error: { code: 'internal_error' } });
      const b = await readResponse(await request(client, addr, proto, { mode: 'open' }));
      expect(b.head).toEqual({ status: 200 });
      expect([...b.body]).toEqual([9]);
      expect(b.trailer).toMatchObject({ error: { code: 'internal_error' } });
    } finally {
      await srv.stop();
    }
  });

  it('delivers a response that completes while the client is paused, whole', async () => {
    // The server finishes (trailer + close) while the client reader is paused with data still
    // buffered in the stream: the clean close must not cut the response short.
    const payload = crypto.randomBytes(6 * 1024 * 1024);
    const { proto, srv } = await serve(async (_req, res) => {
      await res.head({ status: 200 });
      await res.data(new Uint8Array(payload));
      await res.trailer({ sha: sha256(payload) });
    });
    try {
      for (let round = 0; round < 3; round++) {
        const res = await request(client, addr, proto, {}, undefined, { highWaterMark: 64 * 1024 });
        await res.head;
        await sleep(150);
        const chunks: Uint8Array[] = [];
        let trailer: unknown;
        for await (const f of res.frames) {
          if (f.kind === 'data') chunks.push(f.bytes);
          else trailer = f.value;
        }
        expect(trailer).toEqual({ sha: sha256(payload) });
        expect(sha256(Buffer.concat(chunks))).toBe(sha256(payload));
      }
    } finally {
      await srv.stop();
    }
  });

  it('applies backpressure: res.data waits while the client does not read', async () => {
    const chunk = new Uint8Array(1024 * 1024);
    const total = 40;
    let written = 0;
    const { proto, srv } = await serve(async (_req, res) => {
      await res.head({ status: 200 });
      for (let i = 0; i < total; i++) {
        await res.data(chunk);
        written++;
      }
      await res.trailer({});
    });
    try {
      const res = await request(client, addr, proto, {});
      await res.head;
      await sleep(400); // client stalls
      const whileStalled = written;
      let got = 0;
      for await (const f of res.frames) if (f.kind === 'data') got += f.bytes.length;
      console.log(`backpressure: ${whileStalled} of ${total} MiB written while the client stalled`);
      expect(whileStalled).toBeLessThan(30);
      expect(got).toBe(total * chunk.length);
      expect(written).toBe(total);
    } finally {
      await srv.stop();
    }
  });
});

describe('a client that stops reading', () => {
  it('is cut off once a write has waited writeStallMs for it: the handler is cancelled, the stream aborted', async () => {
    const chunk = new Uint8Array(1024 * 1024);
    let written = 0;
    const ended = deferred<{ error: string; aborted: boolean }>();
    const { proto, srv } = await serve(async (req, res) => {
      await res.head({ status: 200 });
      try {
        for (let i = 0; i < 40; i++) {
          await res.data(chunk);
          written++;
        }
        await res.trailer({});
        ended.resolve({ error: 'none', aborted: req.signal.aborted });
      } catch (e) {
        ended.resolve({ error: (e as Error).name, aborted: req.signal.aborted });
      }
    }, { writeStallMs: 300 });
    try {
      const res = await request(client, addr, proto, {});
      await res.head;
      const t0 = performance.now();
      const end = await ended.promise; // the client never reads
      expect(performance.now() - t0).toBeGreaterThanOrEqual(250);
      expect(end).toEqual({ error: 'StreamError', aborted: true });
      expect(written).toBeLessThan(40);
      // The client's side of it: the stream ends in an error, not a clean TRAILER.
      await expect((async () => { for await (const _f of res.frames) { /* drain */ } })()).rejects.toThrow();
    } finally {
      await srv.stop();
    }
  });
});

describe('a client that reads slowly', () => {
  it('is not cut off while it takes anything: one large write may wait longer than writeStallMs', async () => {
    const { proto, srv } = await serve(async (_req, res) => {
      await res.head({ status: 200 });
      await res.data(new Uint8Array(8 * 1024 * 1024)); // one write; it drains only as fast as the client reads
      await res.trailer({});
    }, { writeStallMs: 800 });
    try {
      const res = await request(client, addr, proto, {});
      await res.head;
      const t0 = performance.now();
      let got = 0;
      for await (const f of res.frames) {
        if (f.kind !== 'data') continue;
        got += f.bytes.length;
        await sleep(200); // slow, but always reading (a quarter of writeStallMs: a loaded machine's delays fit in the rest)
      }
      expect(got).toBe(8 * 1024 * 1024);
      expect(performance.now() - t0).toBeGreaterThan(800); // the write did wait longer than writeStallMs
    } finally {
      await srv.stop();
    }
  });
});

describe('bad input', () => {
  it('answers garbage with 400 frame_malformed and keeps serving', async () => {
    const { proto, srv } = await serve(echoHandler);
    try {
      const cases: Array<[string, Uint8Array, string]> = [
        ['unknown kind', Uint8Array.of(3, 0x09, 1, 2, 3), 'frame_malformed'],
        ['random bytes', Uint8Array.of(0x05, 0xee, 0xff, 0x00, 0x13, 0x37), 'frame_malformed'],
        ['invalid JSON head', Uint8Array.of(2, 0x01, 0x7b, 0x7b), 'frame_malformed'],
        ['JSON array head', Uint8Array.of(2, 0x01, 0x5b, 0x5d), 'frame_malformed'],
        ['DATA before HEAD', encodeData(new Uint8Array(4)), 'frame_malformed'],
        ['TRAILER from the client', new Uint8Array([...encodeHead({}), ...encodeTrailer({})]), 'frame_malformed'],
        ['ends mid-frame', new Uint8Array([...encodeHead({}), ...encodeData(new Uint8Array(10)).subarray(0, 5)]), 'frame_truncated'],
        ['nothing at all', new Uint8Array(0), 'frame_truncated'],
      ];
      for (const [name, bytes, code] of cases) {
        const frames = await rawExchange(proto, bytes);
        expect(frames.map((f) => f.kind), name).toEqual(['head', 'trailer']);
        expect(frames[0], name).toEqual({ kind: 'head', value: { status: 400 } });
        expect(frames[1], name).toMatchObject({ kind: 'trailer', value: { error: { code } } });
      }
      // Garbage on a stream the client never closes: still answered.
      const open = await rawExchange(proto, Uint8Array.of(1, 0x42, 0), false);
      expect(open[1]).toMatchObject({ value: { error: { code: 'frame_malformed' } } });
      const r = await readResponse(await request(client, addr, proto, { after: 'garbage' }));
      expect(r.head).toEqual({ status: 200, echo: { after: 'garbage' } });
    } finally {
      await srv.stop();
    }
  });

  it('answers an oversized frame with 400 frame_too_large and keeps serving', async () => {
    let called = 0;
    const { proto, srv } = await serve(async (req, res) => {
      called++;
      await echoHandler(req, res);
    });
    try {
      // A DATA frame header announcing 5 MiB (limit 4 MiB); the payload never needs to arrive.
      const header = Uint8Array.of(...varint(5 * 1024 * 1024), 0x02);
      const frames = await rawExchange(proto, new Uint8Array([...encodeHead({}), ...header]), false);
      expect(frames[0]).toEqual({ kind: 'head', value: { status: 400 } });
      expect(frames[1]).toMatchObject({ kind: 'trailer', value: { error: { code: 'frame_too_large' } } });
      // A HEAD over 1 MiB, sent by a client configured with larger limits.
      const res = await request(client, addr, proto, { pad: 'x'.repeat(1024 * 1024 + 10) }, undefined, { limits: { maxJsonBytes: 4 * 1024 * 1024 } });
      const r = await readResponse(res);
      expect(r.head).toEqual({ status: 400 });
      expect(r.trailer).toMatchObject({ error: { code: 'frame_too_large' } });
      expect(called).toBe(0);
      // The server is still there for the next request.
      const next = await readResponse(await request(client, addr, proto, { after: 'oversized' }));
      expect(next.head).toEqual({ status: 200, echo: { after: 'oversized' } });
      expect(called).toBe(1);
    } finally {
      await srv.stop();
    }
  });

  it('answers a client that stalls mid-request with 408 request_timeout', async () => {
    const { proto, srv } = await serve(echoHandler, { readTimeoutMs: 200 });
    try {
      const t0 = performance.now();
      const stalled = new Uint8Array([...encodeHead({}), ...encodeData(new Uint8Array(10)).subarray(0, 4)]);
      const frames = await rawExchange(proto, stalled, false);
      expect(frames[0]).toEqual({ kind: 'head', value: { status: 408 } });
      expect(frames[1]).toMatchObject({ kind: 'trailer', value: { error: { code: 'request_timeout' } } });
      expect(performance.now() - t0).toBeGreaterThanOrEqual(150);
    } finally {
      await srv.stop();
    }
  });

  it('answers a client whose HEAD does not arrive with 408 after the HEAD timeout, not the whole request\'s', async () => {
    const { proto, srv } = await serve(echoHandler, { readTimeoutMs: 600_000, headTimeoutMs: 200 });
    try {
      const partialHead = encodeHead({ endpoint: 'x' }).subarray(0, 5);
      const frames = await rawExchange(proto, partialHead, false);
      expect(frames[0]).toEqual({ kind: 'head', value: { status: 408 } });
      expect(frames[1]).toMatchObject({ kind: 'trailer', value: { error: { code: 'request_timeout', message: expect.stringContaining('HEAD') } } });
    } finally {
      await srv.stop();
    }
  });

  it('answers a body over the limit (8 MiB) with 413 body_too_large', async () => {
    let called = 0;
    const { proto, srv } = await serve(async (req, res) => {
      called++;
      await echoHandler(req, res);
    });
    try {
      const t0 = performance.now();
      const res = await request(client, addr, proto, {}, new Uint8Array(8 * 1024 * 1024 + 1));
      const r = await readResponse(res);
      expect(r.head).toEqual({ status: 413 });
      expect(r.trailer).toMatchObject({ error: { code: 'body_too_large' } });
      expect(called).toBe(0);
      expect(performance.now() - t0).toBeLessThan(1500); // the client stops sending; no linger reset
      const ok = await readResponse(await request(client, addr, proto, {}, new Uint8Array(8 * 1024 * 1024)));
      expect(ok.body.length).toBe(8 * 1024 * 1024);
      expect(called).toBe(1);
    } finally {
      await srv.stop();
    }
  });
});

describe('the request bytes budget', () => {
  it('streams that together would hold more than the budget are answered 503 no_capacity at once; what they held is given back', async () => {
    const { RequestBytesBudget, REQUEST_BYTES_BUDGET } = await import('../src/p2p/request-server.ts');
    expect(REQUEST_BYTES_BUDGET.limit).toBe(256 * 1024 * 1024);
    const budget = new RequestBytesBudget(3 * 1024 * 1024, 3 * 1024 * 1024); // (one client here: no per-peer bound in the way)
    const held = deferred<void>();
    let called = 0;
    const { proto, srv } = await serve(async (req, res) => {
      called++;
      if (req.head.hold === true) await held.promise; // keeps its body (and its share) while it runs
      await echoHandler(req, res);
    }, { budget });
    try {
      // One request holds 2 MiB while its handler runs; a second of 2 MiB would take the total over.
      const first = request(client, addr, proto, { hold: true }, new Uint8Array(2 * 1024 * 1024));
      const firstRes = first.then((r) => readResponse(r));
      await sleep(10);
      while (called === 0) await sleep(10);
      expect(budget.inUse).toBeGreaterThanOrEqual(2 * 1024 * 1024);
      const over = await readResponse(await request(client, addr, proto, {}, new Uint8Array(2 * 1024 * 1024)));
      expect(over.head).toEqual({ status: 503 });
      expect(over.trailer).toMatchObject({ error: { code: 'no_capacity' } });
      expect(called).toBe(1);
      // A small one still fits.
      const small = await readResponse(await request(client, addr, proto, {}, new Uint8Array(1000)));
      expect(small.body.length).toBe(1000);
      held.resolve();
      expect((await firstRes).body.length).toBe(2 * 1024 * 1024);
      // Everything given back: the same 2 MiB request now fits.
      for (let i = 0; i < 50 && budget.inUse > 0; i++) await sleep(10);
      expect(budget.inUse).toBe(0);
      const again = await readResponse(await request(client, addr, proto, {}, new Uint8Array(2 * 1024 * 1024)));
      expect(again.body.length).toBe(2 * 1024 * 1024);
    } finally {
      held.resolve();
      await srv.stop();
    }
    expect(budget.inUse).toBe(0);
  });

  it('one peer holds a quarter of the budget at most: another peer still gets in', async () => {
    const { RequestBytesBudget, REQUEST_BYTES_BUDGET } = await import('../src/p2p/request-server.ts');
    expect(REQUEST_BYTES_BUDGET.perPeerLimit).toBe(64 * 1024 * 1024);
    const budget = new RequestBytesBudget(8 * 1024 * 1024); // 2 MiB a peer
    const held = deferred<void>();
    let running = 0;
    const { proto, srv } = await serve(async (req, res) => {
      running++;
      if (req.head.hold === true) await held.promise;
      await echoHandler(req, res);
    }, { budget });
    const other = await createHost({ seed: new Uint8Array(32).fill(33), listen: [] });
    try {
      const first = request(client, addr, proto, { hold: true }, new Uint8Array(1536 * 1024)).then((r) => readResponse(r));
      while (running === 0) await sleep(10);
      expect(budget.heldBy(client.peerId.toString())).toBeGreaterThanOrEqual(1536 * 1024);
      // The same peer again: over its quarter.
      const mine = await readResponse(await request(client, addr, proto, {}, new Uint8Array(1024 * 1024)));
      expect(mine.trailer).toMatchObject({ error: { code: 'no_capacity' } });
      // Another peer: in.
      const theirs = await readResponse(await request(other, addr, proto, {}, new Uint8Array(1024 * 1024)));
      expect(theirs.body.length).toBe(1024 * 1024);
      held.resolve();
      expect((await first).body.length).toBe(1536 * 1024);
      for (let i = 0; i < 50 && budget.inUse > 0; i++) await sleep(10);
      expect([budget.inUse, budget.heldBy(client.peerId.toString())]).toEqual([0, 0]);
    } finally {
      held.resolve();
      await other.stop();
      await srv.stop();
    }
  });

  it('a partial frame counts too: a client that sends most of one large DATA frame and waits is answered 503 before the frame completes', async () => {
    const { RequestBytesBudget } = await import('../src/p2p/request-server.ts');
    const budget = new RequestBytesBudget(1024 * 1024, 1024 * 1024);
    const { proto, srv } = await serve(echoHandler, { budget });
    try {
      const frame = encodeData(new Uint8Array(3 * 1024 * 1024));
      const partial = new Uint8Array([...encodeHead({}), ...frame.subarray(0, 2 * 1024 * 1024)]);
      const frames = await rawExchange(proto, partial, false);
      expect(frames[0]).toEqual({ kind: 'head', value: { status: 503 } });
      expect(frames[1]).toMatchObject({ kind: 'trailer', value: { error: { code: 'no_capacity' } } });
    } finally {
      await srv.stop();
    }
    expect(budget.inUse).toBe(0);
  });
});

describe('client against a misbehaving server', () => {
  /** A raw server: reads the request to its end, then writes `bytes` and closes. */
  async function rawServer(bytes: Uint8Array): Promise<string> {
    const proto = `/test/raw/${++protoCounter}/1.0.0`;
    await server.handle(proto, async (stream) => {
      for await (const chunk of stream) void chunk;
      stream.send(bytes);
      await stream.close();
    });
    return proto;
  }

  it('rejects garbage, a missing HEAD, a missing TRAILER and frames after the TRAILER', async () => {
    const cases: Array<[string, Uint8Array, 'head' | 'frames', string]> = [
      ['garbage', Uint8Array.of(4, 0x77, 1, 2, 3, 4), 'head', 'frame_malformed'],
      ['DATA first', encodeData(new Uint8Array(3)), 'head', 'unexpected_frame'],
      ['nothing', new Uint8Array(0), 'head', 'missing_trailer'],
      ['no TRAILER', new Uint8Array([...encodeHead({ status: 200 }), ...encodeData(new Uint8Array(3))]), 'frames', 'missing_trailer'],
      ['two HEADs', new Uint8Array([...encodeHead({}), ...encodeHead({})]), 'frames', 'unexpected_frame'],
      ['after TRAILER', new Uint8Array([...encodeHead({}), ...encodeTrailer({}), ...encodeData(new Uint8Array(1))]), 'frames', 'unexpected_frame'],
      ['cut mid-frame', new Uint8Array([...encodeHead({}), ...encodeData(new Uint8Array(9)).subarray(0, 4)]), 'frames', 'frame_truncated'],
    ];
    try {
      for (const [name, bytes, where, code] of cases) {
        const proto = await rawServer(bytes);
        const res = await request(client, addr, proto, {}, new Uint8Array(5));
        if (where === 'head') {
          await expect(res.head, name).rejects.toMatchObject({ code });
        } else {
          await res.head;
          await expect(readResponse(res), name).rejects.toMatchObject({ code });
        }
      }
    } finally {
      await server.unhandle(server.getProtocols().filter((p) => p.startsWith('/test/raw/')));
    }
  });
});

describe('cancellation and shutdown', () => {
  it('a signal aborted while the stream is being opened stops the request before it is sent: the handler never runs', async () => {
    let ran = 0;
    const { proto, srv } = await serve(async (req, res) => {
      ran++;
      await echoHandler(req, res);
    });
    /** Forwards everything to `target`, methods bound to it, except what `over` names. */
    const forward = <T extends object>(target: T, over: Record<string, unknown>): T =>
      new Proxy(target, {
        get(t, p) {
          if (typeof p === 'string' && p in over) return over[p];
          const v: unknown = Reflect.get(t, p, t);
          return typeof v === 'function' ? v.bind(t) : v;
        },
      });
    try {
      const ac = new AbortController();
      // The caller gives up just as the muxer hands over the new stream (the last await before the request is written).
      const host = forward(client, {
        dial: async (...a: Parameters<Host['dial']>) => {
          const connection = await client.dial(...a);
          const muxer = (connection as unknown as { muxer: { createStream(o: object): Promise<unknown> } }).muxer;
          const createStream = async (o: object) => {
            const stream = await muxer.createStream(o);
            ac.abort(new Error('the caller left'));
            return stream;
          };
          return forward(connection, { muxer: forward(muxer, { createStream }) });
        },
      });
      const res = await request(host, addr, proto, { hello: 1 }, new Uint8Array([1, 2, 3]), { signal: ac.signal });
      await expect(res.head).rejects.toMatchObject({ code: 'aborted' });
      await sleep(100);
      expect(ran).toBe(0);
    } finally {
      await srv.stop();
    }
  });

  it("client abort mid-stream fires the handler's signal promptly", async () => {
    let abortedAt = 0;
    const after = deferred<{ data: string; trailer: string }>();
    const { proto, srv } = await serve(async (req, res) => {
      req.signal.addEventListener('abort', () => {
        abortedAt = performance.now();
      });
      await res.head({ status: 200 });
      while (!req.signal.aborted) {
        await res.data(new Uint8Array(100)).catch(() => {});
        await sleep(5);
      }
      // After the abort every writer call rejects (and an ignored one raises no unhandled rejection).
      void res.data(new Uint8Array(1));
      const data = await res.data(new Uint8Array(1)).then(() => 'ok', (e: StreamError) => e.code);
      const trailer = await res.trailer({}).then(() => 'ok', (e: StreamError) => e.code);
      after.resolve({ data, trailer });
    });
    try {
      const res = await request(client, addr, proto, {});
      await res.head;
      let frames = 0;
      const it = res.frames[Symbol.asyncIterator]();
      while (frames < 3) if (!(await it.next()).done) frames++;
      const t0 = performance.now();
      res.abort();
      expect(await after.promise).toEqual({ data: 'aborted', trailer: 'aborted' });
      const ms = abortedAt - t0;
      console.log(`client abort → handler signal: ${ms.toFixed(1)} ms`);
      expect(ms).toBeGreaterThanOrEqual(0);
      expect(ms).toBeLessThan(1000);
      await expect(it.next()).rejects.toMatchObject({ code: 'aborted' });
      await sleep(20);
      expect(srv.inFlight).toBe(0);
    } finally {
      await srv.stop();
    }
  });

  it('leaving the frames loop early, or aborting the request signal, cancels the request', async () => {
    let cancelled = 0;
    const { proto, srv } = await serve(async (req, res) => {
      const done = new Promise<void>((r) => req.signal.addEventListener('abort', () => r()));
      await res.head({ status: 200 });
      await res.data(new Uint8Array(10));
      await done;
      cancelled++;
    });
    try {
      const res = await request(client, addr, proto, {});
      for await (const f of res.frames) {
        expect(f.kind).toBe('data');
        break;
      }
      const ac = new AbortController();
      const res2 = await request(client, addr, proto, {}, undefined, { signal: ac.signal });
      await res2.head;
      ac.abort();
      await expect(readResponse(res2)).rejects.toMatchObject({ code: 'aborted' });
      for (let i = 0; i < 50 && cancelled < 2; i++) await sleep(10);
      expect(cancelled).toBe(2);
    } finally {
      await srv.stop();
    }
  });

  it('server stop() with requests in flight cancels them cleanly', async () => {
    let started = 0;
    let signalled = 0;
    const { proto, srv } = await serve(async (req, res) => {
      started++;
      await res.head({ status: 200 });
      await new Promise<void>((r) => req.signal.addEventListener('abort', () => r()));
      signalled++;
      await res.data(new Uint8Array(1)).catch(() => {});
    });
    const pending = await Promise.all([0, 1, 2].map(() => request(client, addr, proto, {})));
    await Promise.all(pending.map((p) => p.head));
    expect(started).toBe(3);
    expect(srv.inFlight).toBe(3);
    await srv.stop();
    // (every handler ended on its signal within stop()'s wait: none is left running)
    expect(signalled).toBe(3);
    expect(srv.inFlight).toBe(0);
    for (const p of pending) await expect(readResponse(p)).rejects.toBeInstanceOf(StreamError);
    // The protocol is gone.
    await expect((await request(client, addr, proto, {})).head).rejects.toMatchObject({ name: 'UnsupportedProtocolError' });
  });

  it('host stop() with requests in flight is clean', async () => {
    const host = await createHost({ seed: new Uint8Array(32).fill(33), listen: ['/ip4/127.0.0.1/tcp/0'] });
    let signalled = false;
    const handlerDone = deferred<void>();
    await handleRequests(host, '/test/stop/1.0.0', async (req, res) => {
      await res.head({ status: 200 });
      while (!req.signal.aborted) {
        await res.data(new Uint8Array(1000)).catch(() => {});
        await sleep(2);
      }
      signalled = true;
      handlerDone.resolve();
    });
    const res = await request(client, host.getMultiaddrs()[0]!, '/test/stop/1.0.0', {});
    await res.head;
    const t0 = performance.now();
    await host.stop();
    console.log(`host.stop() with a request in flight: ${(performance.now() - t0).toFixed(1)} ms`);
    await handlerDone.promise;
    expect(signalled).toBe(true);
    await expect(readResponse(res)).rejects.toBeInstanceOf(StreamError);
  });
});

describe('keepalives (docs/protocol.md: an empty DATA frame while the handler works in silence)', () => {
  /** Waits in silence, as a request in the admission queue does, then answers, with silence again between HEAD and body. */
  const slowHandler: RequestHandler = async (_req, res) => {
    await sleep(450);
    await res.head({ status: 200 });
    await sleep(450);
    await res.data(new TextEncoder().encode('the answer'));
    await res.trailer({ ok: true });
  };

  it('go out before the HEAD and between frames; none after the TRAILER', async () => {
    const { proto, srv } = await serve(slowHandler, { keepAliveMs: 100 });
    try {
      const frames = await rawExchange(proto, encodeHead({}));
      const kinds = frames.map((f) => (f.kind === 'data' && f.bytes.length === 0 ? 'keepalive' : f.kind));
      const head = kinds.indexOf('head');
      expect(kinds.slice(0, head).length).toBeGreaterThanOrEqual(2);
      expect(new Set(kinds.slice(0, head))).toEqual(new Set(['keepalive']));
      const body = kinds.indexOf('data');
      expect(kinds.slice(head + 1, body).length).toBeGreaterThanOrEqual(2);
      expect(new Set(kinds.slice(head + 1, body))).toEqual(new Set(['keepalive']));
      expect(kinds.slice(body)).toEqual(['data', 'trailer']);
    } finally {
      await srv.stop();
    }
  });

  it('request() skips them, tells onActivity of each, and the body and trailer are as sent', async () => {
    const { proto, srv } = await serve(slowHandler, { keepAliveMs: 100 });
    try {
      let activity = 0;
      const res = await request(client, addr, proto, {}, undefined, { onActivity: () => activity++ });
      await res.head;
      const headAt = activity;
      const r = await readResponse(res);
      expect(r.head).toEqual({ status: 200 });
      expect(new TextDecoder().decode(r.body)).toBe('the answer');
      expect(r.trailer).toEqual({ ok: true });
      expect(headAt).toBeGreaterThanOrEqual(3); // keepalives, then the HEAD
      expect(activity).toBeGreaterThanOrEqual(headAt + 4); // more keepalives, DATA, TRAILER
    } finally {
      await srv.stop();
    }
  });

  it('are on by default (every protocol the node serves goes through handleRequests): after 1 s of silence', async () => {
    const { proto, srv } = await serve(async (_req, res) => {
      await sleep(2300);
      await res.head({ status: 204 });
      await res.trailer({});
    });
    try {
      const frames = await rawExchange(proto, encodeHead({}));
      expect(frames.length).toBeGreaterThanOrEqual(3);
      expect(frames.slice(0, -2).every((f) => f.kind === 'data' && f.bytes.length === 0)).toBe(true);
      expect(frames.slice(-2).map((f) => f.kind)).toEqual(['head', 'trailer']);
    } finally {
      await srv.stop();
    }
  });

  it('a handler that answers at once sends none', async () => {
    const { proto, srv } = await serve(echoHandler, { keepAliveMs: 100 });
    try {
      const frames = await rawExchange(proto, new Uint8Array([...encodeHead({}), ...encodeData(Uint8Array.of(1, 2, 3))]));
      expect(frames.map((f) => f.kind)).toEqual(['head', 'data', 'trailer']);
    } finally {
      await srv.stop();
    }
  });
});
