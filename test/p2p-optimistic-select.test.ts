// A request leaves in its stream's first write (the protocol selected optimistically), and a HEAD
// that announces its body's length is served without waiting for the client's close.
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { AbstractMessageStream } from '@libp2p/utils';
import type { Multiaddr } from '@multiformats/multiaddr';
import { createHost, type Host } from '../src/p2p/host.ts';
import { FrameDecoder, encodeData, encodeHead, type Frame } from '../src/p2p/frames.ts';
import { selectPreamble } from '../src/p2p/optimistic-select.ts';
import { handleRequests, readResponse, request, type RequestHandler, type RequestServer } from '../src/p2p/request-stream.ts';

let server: Host;
let client: Host;
let addr: Multiaddr;
let n = 0;
const servers: RequestServer[] = [];

beforeAll(async () => {
  server = await createHost({ seed: new Uint8Array(32).fill(41), listen: ['/ip4/127.0.0.1/tcp/0'] });
  client = await createHost({ seed: new Uint8Array(32).fill(42), listen: [] });
  addr = server.getMultiaddrs()[0]!;
});
afterEach(async () => {
  vi.restoreAllMocks();
  for (const s of servers.splice(0)) await s.stop();
});
afterAll(async () => {
  await client?.stop();
  await server?.stop();
});

const seen: { head: Record<string, unknown>; body: number[] }[] = [];
const echo: RequestHandler = async (req, res) => {
  seen.push({ head: req.head, body: [...req.body] });
  await res.head({ status: 200 });
  await res.data(req.body);
  await res.trailer({ ok: true });
};

async function serve(handler: RequestHandler = echo): Promise<string> {
  const proto = `/test/optimistic/${++n}/1.0.0`;
  servers.push(await handleRequests(server, proto, handler, { maxBodyBytes: 1000, lingerMs: 200 }));
  return proto;
}

/** Sends `bytes` on a negotiated stream, never closing its write side; the frames the server sends before it closes. */
async function withoutClosing(proto: string, bytes: Uint8Array): Promise<Frame[]> {
  const stream = await client.dialProtocol(addr, proto);
  stream.send(bytes);
  const dec = new FrameDecoder();
  const frames: Frame[] = [];
  for await (const chunk of stream) frames.push(...dec.push(chunk.subarray()));
  dec.end();
  stream.abort(new Error('done'));
  return frames;
}

const cat = (...parts: Uint8Array[]) => Uint8Array.from(parts.flatMap((p) => [...p]));

describe('body_length in the HEAD', () => {
  it('the body ends after the bytes announced: served while the client still holds its write side open; the handler sees no body_length', async () => {
    const proto = await serve();
    seen.length = 0;
    const frames = await withoutClosing(proto, cat(encodeHead({ op: 'x', body_length: 5 }), encodeData(Uint8Array.of(1, 2)), encodeData(Uint8Array.of(3, 4, 5))));
    expect(frames.map((f) => f.kind)).toEqual(['head', 'data', 'trailer']);
    expect(frames[0]).toEqual({ kind: 'head', value: { status: 200 } });
    expect(seen).toEqual([{ head: { op: 'x' }, body: [1, 2, 3, 4, 5] }]);
    // An empty body announced: served on the HEAD alone.
    const empty = await withoutClosing(proto, encodeHead({ body_length: 0 }));
    expect(empty.map((f) => f.kind)).toEqual(['head', 'trailer']);
    expect(seen[1]).toEqual({ head: {}, body: [] });
  });

  it.each([
    ['a negative length', 400, 'frame_malformed', { body_length: -1 }, []],
    ['a fractional length', 400, 'frame_malformed', { body_length: 1.5 }, []],
    ['a length as text', 400, 'frame_malformed', { body_length: '3' }, []],
    ['more bytes than announced', 400, 'frame_malformed', { body_length: 2 }, [Uint8Array.of(1, 2, 3)]],
    ['a length over the body limit (refused before the body)', 413, 'body_too_large', { body_length: 1001 }, []],
  ])('%s is refused (%i %s) and nothing reaches the handler', async (_name, status, code, head, data) => {
    const proto = await serve();
    seen.length = 0;
    const frames = await withoutClosing(proto, cat(encodeHead(head), ...data.map((d) => encodeData(d))));
    expect(frames[0]).toEqual({ kind: 'head', value: { status } });
    expect(frames[1]).toMatchObject({ kind: 'trailer', value: { error: { code } } });
    expect(seen).toEqual([]);
  });

  it('a stream that ends before the bytes announced is 400 frame_truncated; the server keeps serving', async () => {
    const proto = await serve();
    seen.length = 0;
    const stream = await client.dialProtocol(addr, proto);
    stream.send(cat(encodeHead({ body_length: 10 }), encodeData(Uint8Array.of(1, 2, 3))));
    await stream.close();
    const dec = new FrameDecoder();
    const frames: Frame[] = [];
    for await (const chunk of stream) frames.push(...dec.push(chunk.subarray()));
    expect(frames[1]).toMatchObject({ kind: 'trailer', value: { error: { code: 'frame_truncated', message: 'the stream ended after 3 of the 10 body bytes announced' } } });
    expect(seen).toEqual([]);
    const r = await readResponse(await request(client, addr, proto, {}, Uint8Array.of(9)));
    expect([r.head.status, [...r.body]]).toEqual([200, [9]]);
  });
});

describe('a client that does not close after its announced body', () => {
  it('one that keeps sending past its body is reset once it has sent 64 KiB more: nothing it sends is held', async () => {
    const proto = await serve(async (req, res) => {
      await res.head({ status: 200 });
      await new Promise((r) => setTimeout(r, 300)); // the handler is still running while junk arrives
      if (!req.signal.aborted) await res.trailer({});
    });
    const stream = await client.dialProtocol(addr, proto);
    stream.send(encodeHead({ body_length: 0 }));
    const junk = new Uint8Array(16 * 1024);
    const ended = new Promise<string>((resolve) => stream.addEventListener('close', (e) => resolve((e as Event & { error?: Error }).error ? 'reset' : 'closed'), { once: true }));
    for (let i = 0; i < 16 && stream.writeStatus === 'writable'; i++) {
      stream.send(junk);
      await new Promise((r) => setTimeout(r, 5));
    }
    expect(await ended).toBe('reset');
  });

  it('one that keeps its side open after the response is cut off after the linger (no stream held for good)', async () => {
    const proto = await serve();
    const stream = await client.dialProtocol(addr, proto);
    stream.send(cat(encodeHead({ body_length: 1 }), encodeData(Uint8Array.of(7))));
    const dec = new FrameDecoder();
    const frames: Frame[] = [];
    const ended = new Promise<string>((resolve) => stream.addEventListener('close', (e) => resolve((e as Event & { error?: Error }).error ? 'reset' : 'closed'), { once: true }));
    stream.addEventListener('message', (e) => frames.push(...dec.push((e as Event & { data: { subarray(): Uint8Array } }).data.subarray())));
    expect(await ended).toBe('reset'); // (lingerMs: 200 in these servers)
    expect(frames.map((f) => f.kind)).toEqual(['head', 'data', 'trailer']); // the answer came first, whole
  });
});

describe('optimistic protocol selection', () => {
  it("a small request leaves in its stream's first write, before anything came back: the selection, the HEAD (with body_length) and the body", async () => {
    const proto = await serve();
    // Every write on the client's stream for this protocol, and whether the stream had received anything by then.
    const writes: { receivedBefore: boolean; bytes: Uint8Array }[] = [];
    const got = new WeakSet<object>();
    const send = AbstractMessageStream.prototype.send;
    vi.spyOn(AbstractMessageStream.prototype, 'send').mockImplementation(function (this: AbstractMessageStream, data) {
      if (this.direction === 'outbound' && (this as unknown as { protocol?: string }).protocol === proto) {
        if (writes.length === 0) this.addEventListener('message', () => got.add(this));
        writes.push({ receivedBefore: got.has(this), bytes: (data instanceof Uint8Array ? data : data.subarray()).slice() });
      }
      return send.call(this, data);
    });
    const body = new TextEncoder().encode('{"hello":"node"}');
    const r = await readResponse(await request(client, addr, proto, { endpoint: 'x' }, body));
    expect([r.head.status, new TextDecoder().decode(r.body)]).toEqual([200, '{"hello":"node"}']);
    expect(writes.map((w) => w.receivedBefore)).toEqual([false]);
    expect([...writes[0]!.bytes]).toEqual([...selectPreamble(proto), ...encodeHead({ endpoint: 'x', body_length: body.length }), ...encodeData(body)]);
  });

  it('a body over 64 KiB waits for the protocol to be confirmed, then goes out whole', async () => {
    const proto = await serve(async (req, res) => {
      await res.head({ status: 200, size: req.body.length, last: req.body.at(-1) ?? null });
      await res.trailer({});
    });
    const big = new Uint8Array(200_000).map((_, i) => i % 251);
    const srvBig = await handleRequests(server, `${proto}-big`, async (req, res) => {
      await res.head({ status: 200, size: req.body.length, sum: req.body.reduce((a, b) => a + b, 0) });
      await res.trailer({});
    });
    servers.push(srvBig);
    const r = await readResponse(await request(client, addr, `${proto}-big`, {}, big));
    expect(r.head).toEqual({ status: 200, size: big.length, sum: big.reduce((a, b) => a + b, 0) });
    // A streamed body (length unknown) too: the server reads it to the client's close.
    const r2 = await readResponse(await request(client, addr, proto, {}, [Uint8Array.of(1), Uint8Array.of(2, 7)]));
    expect(r2.head).toEqual({ status: 200, size: 3, last: 7 });
  });

  it('a burst over the per-protocol stream limit waits for streams to close instead of being reset, in both modes; a wait can be aborted', async () => {
    const proto = await serve(async (req, res) => {
      await new Promise((r) => setTimeout(r, 100));
      await res.head({ status: 200 });
      await res.data(req.body);
      await res.trailer({});
    });
    for (const negotiate of ['optimistic', 'full'] as const) {
      const out = await Promise.allSettled(Array.from({ length: 140 }, async (_, i) => new TextDecoder().decode((await readResponse(await request(client, addr, proto, {}, new TextEncoder().encode(`b${i}`), { negotiate }))).body)));
      expect(out.filter((o) => o.status === 'rejected').map((o) => String((o as PromiseRejectedResult).reason)), negotiate).toEqual([]);
      expect(out.map((o) => (o as PromiseFulfilledResult<string>).value)).toEqual(Array.from({ length: 140 }, (_, i) => `b${i}`));
    }
    // With a limit of 2, a third request waits; aborted while it waits, it is refused and opens nothing.
    const held = await Promise.all([request(client, addr, proto, {}, Uint8Array.of(1), { maxOutboundStreams: 2 }), request(client, addr, proto, {}, Uint8Array.of(2), { maxOutboundStreams: 2 })]);
    const ac = new AbortController();
    let settled = false;
    const third = request(client, addr, proto, {}, Uint8Array.of(3), { maxOutboundStreams: 2, signal: ac.signal }).finally(() => (settled = true));
    third.catch(() => {});
    await new Promise((r) => setTimeout(r, 30));
    expect(settled).toBe(false); // waiting for a stream
    ac.abort(new Error('gave up waiting'));
    await expect(third).rejects.toThrow('gave up waiting');
    for (const h of held) expect((await readResponse(h)).head.status).toBe(200);
    // Once those closed, the slots are free again.
    expect((await readResponse(await request(client, addr, proto, {}, Uint8Array.of(4), { maxOutboundStreams: 2 }))).head.status).toBe(200);
  });

  it('many optimistic requests in flight on one connection all get their own answers', async () => {
    const proto = await serve(async (req, res) => {
      await new Promise((r) => setTimeout(r, Math.floor(Math.random() * 20)));
      await res.head({ status: 200 });
      await res.data(req.body);
      await res.trailer({});
    });
    const out = await Promise.all(
      Array.from({ length: 40 }, async (_, i) => {
        const r = await readResponse(await request(client, addr, proto, {}, new TextEncoder().encode(`req-${i}`)));
        return new TextDecoder().decode(r.body);
      }),
    );
    expect(out).toEqual(Array.from({ length: 40 }, (_, i) => `req-${i}`));
    expect(client.getConnections(server.peerId)).toHaveLength(1);
  });
});

describe('a remote that does not answer the selection as a libp2p listener does', () => {
  /** Makes the server's next inbound stream do `act` in place of its first write (the multistream echo). */
  function tamperFirstInboundWrite(act: (stream: AbstractMessageStream, data: Uint8Array) => void): void {
    const send = AbstractMessageStream.prototype.send;
    let done = false;
    vi.spyOn(AbstractMessageStream.prototype, 'send').mockImplementation(function (this: AbstractMessageStream, data) {
      // the server's side of a muxed stream (not the connection under it)
      if (!done && this.direction === 'inbound' && this.constructor.name === 'YamuxStream') {
        done = true;
        act(this, data instanceof Uint8Array ? data : data.subarray());
        return true;
      }
      return send.call(this, data);
    });
  }

  it('bytes that are not the multistream header fail the request as frame_malformed; the connection serves the next request', async () => {
    const proto = await serve();
    const send = AbstractMessageStream.prototype.send;
    tamperFirstInboundWrite((stream, data) => send.call(stream, new Uint8Array(data.length).fill(0x41)));
    const r = await request(client, addr, proto, {}, Uint8Array.of(1));
    await expect(r.head).rejects.toMatchObject({ code: 'frame_malformed', message: expect.stringContaining('did not answer multistream-select') });
    vi.restoreAllMocks();
    expect((await readResponse(await request(client, addr, proto, {}, Uint8Array.of(2)))).body).toEqual(Uint8Array.of(2));
  });

  it('the header echoed but another protocol id in place of ours fails as UnsupportedProtocolError', async () => {
    const proto = await serve();
    const send = AbstractMessageStream.prototype.send;
    tamperFirstInboundWrite((stream) => send.call(stream, selectPreamble(`${proto}-other`)));
    const r = await request(client, addr, proto, {}, Uint8Array.of(1));
    await expect(r.head).rejects.toMatchObject({ name: 'UnsupportedProtocolError' });
  });

  it('a stream closed before the echo fails the request with a named error, never a hang', async () => {
    const proto = await serve();
    tamperFirstInboundWrite((stream) => void stream.close());
    const r = await request(client, addr, proto, {}, Uint8Array.of(1));
    const err = await r.head.then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toMatchObject({ name: 'StreamError', code: 'stream_closed', message: expect.stringContaining('before the remote confirmed the protocol') });
  });
});
