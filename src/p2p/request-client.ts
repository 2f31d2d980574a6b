// Client side of the HTTP-shaped exchange (see request-server.ts for the frame sequence).
//
//   const res = await request(host, addr, '/service/infer/1.0.0', { endpoint: '/v1/chat/completions' }, body);
//   const head = await res.head;                      // { status, headers, ... }
//   for await (const f of res.frames) …               // { kind: 'data', bytes } … then { kind: 'trailer', value }
//   res.abort();                                      // cancels: resets the stream, the server's signal fires
//
// The body is sent while the response is awaited; if the server answers before reading it all (413, 400),
// sending stops. Leaving the `frames` loop before the trailer cancels the request too.
import { STREAMS_PER_PROTOCOL } from './stream-limits.ts';
import { concatBytes } from '../../attestation/bytes.ts';
import { multiaddr, type Multiaddr } from '@multiformats/multiaddr';
import { UnsupportedProtocolError, type Libp2p, type PeerId, type Stream } from '@libp2p/interface';
import { encodeData, encodeHead, frameLimits, FrameError, type FrameLimits, type JsonObject } from './frames.ts';
import { FrameReader, StreamError, writeBytes } from './frame-io.ts';
import { parsePeerId } from './peer-id.ts';
import { CORK_BYTES } from './response-writer.ts';
import { HEADER_BYTES, openUnnegotiated, selectPreamble } from './optimistic-select.ts';
import { takeStreamSlot } from './stream-slots.ts';

/** A peer to dial: PeerId, multiaddr(s), a multiaddr string ('/ip4/…/p2p/…'), a provider id or a PeerId string. */
export type RequestTarget = PeerId | Multiaddr | Multiaddr[] | string;

export type RequestBody = Uint8Array | Iterable<Uint8Array> | AsyncIterable<Uint8Array>;

export type ResponseFrame = { kind: 'data'; bytes: Uint8Array } | { kind: 'trailer'; value: JsonObject };

export interface RequestOptions {
  signal?: AbortSignal;
  /** Per-frame limits, both directions. Defaults: 1 MiB JSON, 4 MiB DATA. */
  limits?: Partial<FrameLimits>;
  /** The body goes out in DATA frames of at most this size. Default 1 MiB. */
  dataFrameBytes?: number;
  /** Pause reading once this many response bytes wait unconsumed. Default 1 MiB. */
  highWaterMark?: number;
  /** Concurrent outbound streams per connection for this protocol. Default 128. */
  maxOutboundStreams?: number;
  /**
   * 'optimistic' (default): the protocol is selected in the same write as the request, and a node
   * that does not speak it fails `head` with UnsupportedProtocolError. 'full': negotiated first, one
   * round trip before the request leaves; the returned promise rejects for such a node.
   */
  negotiate?: 'optimistic' | 'full';
  /**
   * Called on every frame that arrives, keepalives included (empty DATA frames, which the node sends
   * while it works and nothing else is sent: docs/protocol.md), with `keepalive` true for those.
   * They are not handed on as frames.
   */
  onActivity?: (keepalive: boolean) => void;
}

/**
 * The largest request (HEAD and body) sent before the remote has confirmed the protocol. A listener
 * buffers what arrives while it negotiates (4 MiB at most in libp2p), and a larger body gains
 * nothing from the round trip saved.
 */
const OPTIMISTIC_BYTES = 64 * 1024;

/** Whether a request failed because the remote does not speak its protocol (nothing was sent to a handler). */
export function isUnsupportedProtocol(e: unknown): boolean {
  return e instanceof Error && e.name === 'UnsupportedProtocolError';
}

export interface Response {
  /** The response HEAD; rejects if the stream fails or the server answers something else first. */
  readonly head: Promise<JsonObject>;
  /**
   * DATA frames then the TRAILER. Iterate once, to the end or until you break (which cancels the
   * request); a caller that never iterates should abort(), or the stream stays open. Throws StreamError
   * (`missing_trailer`, `stream_reset`, `aborted`, `unexpected_frame`) or FrameError.
   */
  readonly frames: AsyncIterable<ResponseFrame>;
  /** Cancels the request: resets the stream. Safe to call at any time, any number of times. */
  abort(reason?: string): void;
  readonly stream: Stream;
}

const noop = (): void => {};


function toDialTarget(target: RequestTarget): PeerId | Multiaddr | Multiaddr[] {
  if (typeof target !== 'string') return target;
  return target.startsWith('/') ? multiaddr(target) : parsePeerId(target);
}

async function* bodyChunks(body: RequestBody | undefined): AsyncIterable<Uint8Array> {
  if (body === undefined) return;
  if (body instanceof Uint8Array) yield body;
  else yield* body;
}

/**
 * Opens a stream for `protocol` and sends HEAD + body. A body given as bytes is announced in the HEAD
 * (`body_length`), so the server may start before this side closes its write half. Rejects if the
 * dial fails (or, with `negotiate: 'full'`, the protocol negotiation).
 */
export async function request(
  host: Libp2p,
  target: RequestTarget,
  protocol: string,
  head: JsonObject,
  body?: RequestBody,
  opts: RequestOptions = {},
): Promise<Response> {
  const limits = frameLimits(opts.limits);
  const bodyLength = body === undefined ? 0 : body instanceof Uint8Array ? body.length : undefined;
  // throws before dialling on a bad or oversized head
  const headFrame = encodeHead(bodyLength === undefined ? head : { ...head, body_length: bodyLength }, limits);
  const dataFrameBytes = Math.max(1, Math.min(opts.dataFrameBytes ?? 1024 * 1024, limits.maxDataBytes));
  const signal = opts.signal;
  signal?.throwIfAborted();

  const maxOutboundStreams = opts.maxOutboundStreams ?? STREAMS_PER_PROTOCOL;
  const connection = await host.dial(toDialTarget(target), { signal });
  // At most maxOutboundStreams streams for this protocol on the connection: more wait for one to
  // close (stream-slots.ts) rather than be reset by the remote's limit.
  const release = await takeStreamSlot(connection, protocol, maxOutboundStreams, signal);
  let stream: Stream;
  let preamble: Uint8Array | undefined;
  try {
    // Optimistic: the protocol is selected in the request's first write (optimistic-select.ts), so
    // the request leaves at once instead of one round trip later.
    const raw = opts.negotiate === 'full' ? undefined : await openUnnegotiated(connection, protocol);
    preamble = raw ? selectPreamble(protocol) : undefined;
    stream = raw ?? (await connection.newStream(protocol, { signal, maxOutboundStreams }));
  } catch (e) {
    release();
    throw e;
  }
  if (stream.status === 'open') stream.addEventListener('close', release, { once: true });
  else release();
  const reader = new FrameReader(stream, {
    limits,
    highWaterMark: opts.highWaterMark,
    expectFirst: preamble && {
      bytes: preamble,
      mismatch: (at) =>
        at < HEADER_BYTES
          ? new FrameError('frame_malformed', 'the remote did not answer multistream-select')
          : new UnsupportedProtocolError(`Protocol selection failed - the remote does not speak ${protocol}`),
    },
  });
  let localError: Error | undefined; // why we reset the stream, if we did
  let responded = false;
  let complete = false;

  const abort = (err: Error): void => {
    if (complete) return;
    localError ??= err;
    stream.abort(err);
  };
  const onAbortSignal = (): void => abort(new StreamError('aborted', 'the request was aborted', { cause: signal?.reason }));
  signal?.addEventListener('abort', onAbortSignal, { once: true });
  // (An abort while the stream was being opened reached no listener: nothing is sent then.)
  if (signal?.aborted) onAbortSignal();
  const cleanup = (): void => {
    signal?.removeEventListener('abort', onAbortSignal);
    reader.detach();
  };

  // Send HEAD and body; stop early once the server has answered (it will not read the rest). A body
  // given as bytes goes out with the HEAD in as few writes as CORK_BYTES allows.
  const sending = (async () => {
    let batch: Uint8Array[] = preamble ? [preamble, headFrame] : [headFrame];
    let batchBytes = headFrame.length + (preamble?.length ?? 0);
    const flush = async (): Promise<void> => {
      if (batchBytes === 0) return;
      const bytes = batch.length === 1 ? batch[0]! : concatBytes(...batch);
      batch = [];
      batchBytes = 0;
      await writeBytes(stream, bytes);
    };
    if (!(body === undefined || body instanceof Uint8Array)) await flush();
    if (preamble && (bodyLength === undefined || batchBytes + bodyLength > OPTIMISTIC_BYTES)) {
      // A large or streamed body waits until the remote has taken the protocol.
      await flush();
      await reader.confirmed;
    }
    for await (const chunk of bodyChunks(body)) {
      for (let at = 0; at < chunk.length && !responded; at += dataFrameBytes) {
        const frame = encodeData(chunk.subarray(at, at + dataFrameBytes), limits);
        batch.push(frame);
        batchBytes += frame.length;
        if (batchBytes >= CORK_BYTES) await flush();
      }
      await flush();
      if (responded) break;
    }
    await flush();
    // Closing the write side while the remote still negotiates would cut the bytes it hands on to
    // the protocol's handler (libp2p refuses them once the remote has finished writing).
    await reader.confirmed;
    await stream.close();
  })();
  sending.catch((e: unknown) => {
    // A reset by the server surfaces through the reader; anything else (a failing body iterator, a
    // frame too large) is ours to report, so reset the stream with it.
    if (!(e instanceof StreamError)) abort(e instanceof Error ? e : new Error(String(e)));
  });

  const failure = (e: unknown): unknown => (localError && e instanceof StreamError ? localError : e);
  /** The next frame that is not a keepalive (an empty DATA frame), or null at the end. */
  const nextFrame = async (): Promise<Awaited<ReturnType<typeof reader.next>>> => {
    for (;;) {
      const f = await reader.next();
      if (f) opts.onActivity?.(f.kind === 'data' && f.bytes.length === 0);
      if (!f || f.kind !== 'data' || f.bytes.length > 0) return f;
    }
  };

  const headPromise = (async () => {
    try {
      const first = await nextFrame();
      if (!first) throw new StreamError('missing_trailer', 'the stream ended before a response HEAD');
      if (first.kind !== 'head') throw new StreamError('unexpected_frame', `expected a HEAD frame, got ${first.kind.toUpperCase()}`);
      responded = true;
      return first.value;
    } catch (e) {
      if (e instanceof FrameError || e instanceof StreamError || isUnsupportedProtocol(e)) abort(e as Error);
      cleanup();
      throw failure(e);
    }
  })();
  headPromise.catch(noop);

  async function* frames(): AsyncGenerator<ResponseFrame> {
    await headPromise;
    try {
      for (;;) {
        const f = await nextFrame();
        if (!f) throw new StreamError('missing_trailer', 'the stream ended before the TRAILER');
        if (f.kind === 'head') throw new StreamError('unexpected_frame', 'a second HEAD frame');
        if (f.kind === 'trailer') {
          // The server closes right after the TRAILER; wait for that so the stream is released. A reset
          // at this point loses nothing, but a further frame is a protocol violation.
          const extra = await reader.next().catch((e: unknown) => {
            if (e instanceof StreamError) return null;
            throw e;
          });
          if (extra) throw new StreamError('unexpected_frame', 'a frame after the TRAILER');
          complete = true;
          yield f;
          return;
        }
        yield f;
      }
    } catch (e) {
      throw failure(e);
    } finally {
      // Leaving early (break, throw) cancels the request.
      if (!complete) abort(new StreamError('aborted', 'the response was abandoned'));
      cleanup();
    }
  }

  return {
    head: headPromise,
    frames: { [Symbol.asyncIterator]: frames },
    abort: (reason?: string) => abort(new StreamError('aborted', reason ?? 'the request was aborted')),
    stream,
  };
}

export interface CollectedResponse {
  head: JsonObject;
  body: Uint8Array;
  trailer: JsonObject;
}

/** Reads a whole response into memory. */
export async function readResponse(res: Response): Promise<CollectedResponse> {
  const head = await res.head;
  const parts: Uint8Array[] = [];
  let size = 0;
  let trailer: JsonObject = {};
  for await (const f of res.frames) {
    if (f.kind === 'data') {
      parts.push(f.bytes);
      size += f.bytes.length;
    } else trailer = f.value;
  }
  const body = new Uint8Array(size);
  let at = 0;
  for (const p of parts) {
    body.set(p, at);
    at += p.length;
  }
  return { head, body, trailer };
}
