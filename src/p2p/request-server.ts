// Server side of the HTTP-shaped exchange: one stream per request, for any protocol id.
//
//   client → server: HEAD, DATA*, then the client closes its write side (end of body); a HEAD with
//                    `body_length` ends the body after that many DATA bytes (the close may follow later)
//   server → client: HEAD, DATA*, TRAILER, then the server closes its write side
//
// The whole body is read (bounded) before the handler runs. Bad input is answered, when the stream is
// still writable, with HEAD {status: 400|408|413} and TRAILER {error: {code, message}}; the stream is then
// closed (reset if the client keeps sending past a grace period). A client that resets the stream (its
// only way to cancel over yamux, which has no STOP_SENDING) fires the handler's AbortSignal.
import { STREAMS_PER_PROTOCOL } from './stream-limits.ts';
import { concatBytes } from '../../attestation/bytes.ts';
import type { Connection, Libp2p, Stream } from '@libp2p/interface';
import { FrameError, frameLimits, type FrameLimits, type JsonObject } from './frames.ts';
import { FrameReader, StreamError } from './frame-io.ts';
import { StreamResponseWriter, type ResponseWriter } from './response-writer.ts';
import { PeerIdentityError, providerIdFromPeerId } from './peer-id.ts';
import { settledWithin } from '../settled-within.ts';
import { multiaddrGroup } from './address-cap.ts';

export interface IncomingRequest {
  head: JsonObject;
  body: Uint8Array;
  /** The remote PeerId in libp2p's string form (authenticated by Noise). */
  remotePeer: string;
  /** The remote's provider id (hex Ed25519 public key), when its key is Ed25519. */
  remoteProviderId: string | undefined;
  /** Fires when the client resets or loses the stream, or the server stops. */
  signal: AbortSignal;
  /** What HandleRequestsOptions.screen said of the HEAD (its `note`), when the server screens. */
  screened?: unknown;
}

/** A refusal the server writes itself: HEAD {status}, TRAILER {error: {code, message}}. */
export interface BadRequest {
  status: number;
  code: string;
  message: string;
}

/**
 * What a request's HEAD earns before its body is read (HandleRequestsOptions.screen). Vouched for
 * (a paid request whose ticket verifies): its body counts against `budget`, up to maxBodyBytes.
 * Not: against `openBudget`, and a body longer than `maxBody` gets `refusal` as soon as it is seen
 * to be. `note` reaches the handler as `req.screened`; `release` runs once the body has been read
 * or the exchange has ended.
 */
export type HeadScreen =
  | { vouched: true; note?: unknown; release?: () => void }
  | { vouched: false; note?: unknown; maxBody: number; refusal: BadRequest };

export type RequestHandler = (req: IncomingRequest, res: ResponseWriter) => void | Promise<void>;

export interface HandleRequestsOptions {
  /** Largest request body (sum of DATA payloads); more gets 413 body_too_large. Default 8 MiB. */
  maxBodyBytes?: number;
  /** Per-frame limits, both directions. Defaults: 1 MiB JSON, 4 MiB DATA. */
  limits?: Partial<FrameLimits>;
  /** res.data() splits its bytes into DATA frames of at most this size. Default 1 MiB. */
  dataFrameBytes?: number;
  /** Concurrent requests per connection for this protocol (libp2p refuses more). Default 128. */
  maxInboundStreams?: number;
  /** How long the client may take to send HEAD and the whole body; then 408 request_timeout. Default 60 s. */
  readTimeoutMs?: number;
  /**
   * How long a response may wait for the client to read anything before the stream is aborted (the
   * request is then cancelled: billed for what was delivered). Default 60 s: a buyer that stops
   * reading must not hold a slot for good.
   */
  writeStallMs?: number;
  /** After an error reply, how long the client may keep sending before the stream is reset. Default 2 s. */
  lingerMs?: number;
  /**
   * While a handler works, an empty DATA frame (a keepalive) goes out after this long with nothing
   * written (response-writer.ts). Default KEEPALIVE_MS (1 s).
   */
  keepAliveMs?: number;
  /** How long stop() waits for running handlers after aborting them. Default 2 s. */
  stopTimeoutMs?: number;
  /** Told about handler failures and stream errors; never throws into libp2p. */
  onError?: (err: unknown, context: { protocol: string; remotePeer: string }) => void;
  /** Told of every request the server answers itself, before any handler (malformed, too large, too slow, over budget). */
  onRefused?: (refusal: { protocol: string; remotePeer: string; status: number; code: string }) => void;
  /**
   * What every request's received bytes count against (with `screen`: those of requests it vouches
   * for). Default: one budget for the whole process (REQUEST_BYTES_BUDGET).
   */
  budget?: RequestBytesBudget;
  /**
   * Looks at each HEAD before the body is read: requests it does not vouch for (no ticket, a
   * forged one) take what they hold from `openBudget` and may send only a little, so that peers
   * without a ticket, however many ids they make, cannot fill the paid requests' budget. Never
   * throws (one that does refuses the request with 500).
   */
  screen?: (head: JsonObject, remotePeer: string) => HeadScreen;
  /** What requests `screen` does not vouch for count against. Default OPEN_REQUEST_BYTES_BUDGET. */
  openBudget?: RequestBytesBudget;
  /**
   * With `screen`: what a stream holds before its HEAD has been screened counts against this, apart
   * from both (bodies held by peers without tickets must not keep a paying buyer's HEAD out).
   * Default HEAD_BYTES_BUDGET.
   */
  headBudget?: RequestBytesBudget;
  /** How long the client may take to send its HEAD; then 408 request_timeout. Default 10 s (a HEAD is one small frame). */
  headTimeoutMs?: number;
}

/**
 * The bytes of request bodies (and partial frames) that all the streams of a process may hold at
 * once. Each stream may hold 8 MiB of body and a partial frame of 4 MiB, and a peer may open 128
 * streams per protocol on each connection: without a common bound, one peer without a ticket held
 * 2 GB for a minute. A stream that would go over gets 503 no_capacity at once. One part may hold a
 * quarter of it at most, so that a part filling its share leaves room for everyone else: a part is
 * a peer id, or (`partBy: 'address'`, for bytes nobody has paid for) an address group, so that ids
 * made by the thousand on one address share one part (partOf).
 */
export class RequestBytesBudget {
  readonly limit: number;
  readonly perPeerLimit: number;
  readonly partBy: 'peer' | 'address';
  private used = 0;
  private readonly byPeer = new Map<string, number>();
  constructor(limit: number, perPeerLimit = Math.floor(limit / 4), partBy: 'peer' | 'address' = 'peer') {
    this.limit = limit;
    this.perPeerLimit = perPeerLimit;
    this.partBy = partBy;
  }
  /** The part a connection's streams take from: its peer id, or its address group (addressPart). */
  partOf(connection: Pick<Connection, 'remoteAddr' | 'remotePeer'>): string {
    return this.partBy === 'address' ? addressPart(connection) : connection.remotePeer.toString();
  }
  get inUse(): number {
    return this.used;
  }
  /** What `peer`'s streams hold now. */
  heldBy(peer: string): number {
    return this.byPeer.get(peer) ?? 0;
  }
  /** One stream's share: set() to what it holds now (false, and unchanged, if that would go over); release() at its end. */
  share(peer = ''): { set(bytes: number): boolean; release(): void } {
    let held = 0;
    const move = (delta: number): void => {
      this.used += delta;
      const mine = this.heldBy(peer) + delta;
      if (mine === 0) this.byPeer.delete(peer);
      else this.byPeer.set(peer, mine);
    };
    return {
      set: (bytes) => {
        const more = bytes - held;
        if (more > 0 && (this.used + more > this.limit || this.heldBy(peer) + more > this.perPeerLimit)) return false;
        move(more);
        held = bytes;
        return true;
      },
      release: () => {
        move(-held);
        held = 0;
      },
    };
  }
}

/** The process's default RequestBytesBudget: 256 MiB. */
export const REQUEST_BYTES_BUDGET = new RequestBytesBudget(256 * 1024 * 1024);

/**
 * What requests nobody has paid for hold, apart: those a screen did not vouch for, and those of
 * the protocols without tickets (capacity, log). 32 MiB, a quarter of it an address group
 * (ids made on one address share one part; session 27).
 */
export const OPEN_REQUEST_BYTES_BUDGET = new RequestBytesBudget(32 * 1024 * 1024, 8 * 1024 * 1024, 'address');

/**
 * What streams hold before their HEAD is screened (HandleRequestsOptions.headBudget): 16 MiB, a
 * quarter an address group. A stream holds at most one HEAD's bytes (the JSON frame limit, 1 MiB)
 * before its HEAD: its first frame must be a HEAD (FrameDecoderOptions.firstKind).
 */
export const HEAD_BYTES_BUDGET = new RequestBytesBudget(16 * 1024 * 1024, 4 * 1024 * 1024, 'address');

/**
 * A connection's part of a budget taken by address (RequestBytesBudget.partOf): its address group
 * (an IPv4 address, an IPv6 /64: address-cap.ts); the peer id for a connection without an IP
 * address (or a relayed one, whose address is the relay's).
 */
export function addressPart(connection: Pick<Connection, 'remoteAddr' | 'remotePeer'>): string {
  const addr = connection.remoteAddr;
  const group = addr.getComponents().some((c) => c.name === 'p2p-circuit') ? undefined : multiaddrGroup(addr);
  return group === undefined ? connection.remotePeer.toString() : `ip ${group}`;
}

class OverBudget extends Error {
  override name = 'OverBudget';
}

export interface RequestServer {
  readonly protocol: string;
  /** Requests being read or handled right now. */
  readonly inFlight: number;
  /** When the latest request's exchange ended (performance.now()); 0 before any. */
  readonly lastEnded: number;
  /**
   * Resolves true once no request is in flight (new ones included while waiting), false if some
   * still are after timeoutMs. Admits nothing (the caller stops admission first) and cancels no
   * request whose handler runs; one still being received after DRAIN_READ_GRACE_MS is reset.
   */
  drain(timeoutMs: number): Promise<boolean>;
  /**
   * Cancels every request whose handler runs (its signal aborts with `reason`) without closing its
   * stream: the handler still writes what it ends with (a `cancelled` receipt in its trailer), as
   * when a stop's grace runs out. Requests still being received are reset.
   */
  cancel(reason: Error): void;
  /** Unregisters the protocol, cancels running requests, waits (bounded) for their handlers. */
  stop(): Promise<void>;
  /**
   * Resolves true once every handler has returned (after stop(): those that outlived its wait),
   * false if some still run after timeoutMs. Cancels nothing.
   */
  idle(timeoutMs: number): Promise<boolean>;
}

type ReadResult = { head: JsonObject; body: Uint8Array } | { bad: BadRequest };

const DEFAULT_MAX_BODY = 8 * 1024 * 1024;

/** What a client may send after its announced body before its stream is reset (it should send nothing but its close). */
const AFTER_BODY_BYTES = 64 * 1024;

/** How long a body may be once its HEAD is seen, and what a longer one is told. */
interface BodyLimit {
  limit: number;
  over: BadRequest;
}

/**
 * `hold(size)`: the body read so far is `size` bytes; false when that (with what the reader holds)
 * goes over the budget. `onHead`: what the HEAD allows (or the refusal it earns at once).
 */
async function readRequest(reader: FrameReader, onHead: (head: JsonObject) => BodyLimit | BadRequest, timeouts: { headMs: number; wholeMs: number }, hold: (size: number) => boolean): Promise<ReadResult> {
  const timer = setTimeout(() => reader.interrupt(new StreamError('timeout', `the request was not received within ${timeouts.wholeMs} ms`)), timeouts.wholeMs);
  const headTimer = setTimeout(() => reader.interrupt(new StreamError('timeout', `the request's HEAD was not received within ${timeouts.headMs} ms`)), timeouts.headMs);
  try {
    const first = await reader.next();
    clearTimeout(headTimer);
    if (!first) return { bad: { status: 400, code: 'frame_truncated', message: 'the stream ended before a HEAD frame' } };
    if (first.kind !== 'head') return { bad: { status: 400, code: 'frame_malformed', message: `expected a HEAD frame first, got ${first.kind.toUpperCase()}` } };
    // With `body_length` the body ends after that many bytes, without waiting for the client's close.
    const announced = first.value.body_length;
    if (announced !== undefined && !(Number.isSafeInteger(announced) && (announced as number) >= 0)) {
      return { bad: { status: 400, code: 'frame_malformed', message: 'head.body_length: expected a whole number of bytes' } };
    }
    const length = announced as number | undefined;
    const allowed = onHead(first.value);
    if (!('limit' in allowed)) return { bad: allowed };
    const { limit, over } = allowed;
    if (length !== undefined && length > limit) return { bad: over };
    const parts: Uint8Array[] = [];
    let size = 0;
    while (size !== length) {
      const f = await reader.next();
      if (!f) {
        if (length === undefined) break;
        return { bad: { status: 400, code: 'frame_truncated', message: `the stream ended after ${size} of the ${length} body bytes announced` } };
      }
      if (f.kind !== 'data') return { bad: { status: 400, code: 'frame_malformed', message: `unexpected ${f.kind.toUpperCase()} frame in a request body` } };
      size += f.bytes.length;
      if (size > limit) return { bad: over };
      if (length !== undefined && size > length) return { bad: { status: 400, code: 'frame_malformed', message: `the body is longer than the ${length} bytes announced` } };
      parts.push(f.bytes);
      if (!hold(size)) throw new OverBudget();
    }
    // body_length belongs to the framing: handlers see the HEAD without it.
    const { body_length: _framing, ...head } = first.value;
    return { head, body: concatBytes(...parts) };
  } catch (e) {
    if (e instanceof FrameError) return { bad: { status: 400, code: e.code, message: e.message } };
    if (e instanceof StreamError && e.code === 'timeout') return { bad: { status: 408, code: 'request_timeout', message: e.message } };
    if (e instanceof OverBudget) return { bad: { status: 503, code: 'no_capacity', message: 'the node holds as many request bytes as it takes now; retry shortly' } };
    throw e;
  } finally {
    clearTimeout(timer);
    clearTimeout(headTimer);
  }
}


function providerIdOf(connection: Connection): string | undefined {
  try {
    return providerIdFromPeerId(connection.remotePeer);
  } catch (e) {
    if (e instanceof PeerIdentityError) return undefined;
    throw e;
  }
}

/** Resolves when the remote has finished sending (or the stream is gone), or after `ms`. */
function remoteDone(stream: Stream, ms: number): Promise<boolean> {
  if (stream.readableEnded || stream.status !== 'open') return Promise.resolve(true);
  return new Promise((resolve) => {
    const finish = (v: boolean): void => {
      clearTimeout(timer);
      stream.removeEventListener('end', onEnd);
      stream.removeEventListener('close', onEnd);
      resolve(v);
    };
    const onEnd = (): void => finish(true);
    const timer = setTimeout(() => finish(false), ms);
    stream.addEventListener('end', onEnd);
    stream.addEventListener('close', onEnd);
  });
}

interface Exchange {
  stream: Stream;
  done: Promise<void>;
  /** The request has arrived whole and its handler runs (until then it is being received). */
  handling: boolean;
  /** Aborts the handler's signal, the stream left open (RequestServer.cancel). */
  cancel(reason: Error): void;
}

/** Resets a request still being received: the server is stopping, and it had not arrived whole. */
function resetUnread(x: Exchange): void {
  x.stream.abort(new StreamError('aborted', 'the server is stopping and the request had not arrived whole'));
}

/**
 * How long drain() lets requests still being received arrive whole before it resets them: a real
 * one is already on its way; a peer that sends a HEAD and never the rest must not hold a stop for
 * the whole grace period.
 */
const DRAIN_READ_GRACE_MS = 1000;

/** Registers `handler` for `protocol` on the host. */
export async function handleRequests(
  host: Libp2p,
  protocol: string,
  handler: RequestHandler,
  opts: HandleRequestsOptions = {},
): Promise<RequestServer> {
  const limits = frameLimits(opts.limits);
  const maxBodyBytes = opts.maxBodyBytes ?? DEFAULT_MAX_BODY;
  const budget = opts.budget ?? REQUEST_BYTES_BUDGET;
  const openBudget = opts.screen ? (opts.openBudget ?? OPEN_REQUEST_BYTES_BUDGET) : budget;
  const headBudget = opts.screen ? (opts.headBudget ?? HEAD_BYTES_BUDGET) : budget;
  const tooLarge: BadRequest = { status: 413, code: 'body_too_large', message: `the request body exceeds ${maxBodyBytes} bytes` };
  const overBudget: BadRequest = { status: 503, code: 'no_capacity', message: 'the node holds as many request bytes as it takes now; retry shortly' };
  const lingerMs = opts.lingerMs ?? 2000;
  const readTimeoutMs = opts.readTimeoutMs ?? 60_000;
  const timeouts = { headMs: Math.min(opts.headTimeoutMs ?? 10_000, readTimeoutMs), wholeMs: readTimeoutMs };
  const writeStallMs = opts.writeStallMs ?? 60_000;
  const stopTimeoutMs = opts.stopTimeoutMs ?? 2000;
  const exchanges = new Set<Exchange>();
  let stopping = false;

  const report = (err: unknown, remotePeer: string): void => {
    try {
      opts.onError?.(err, { protocol, remotePeer });
    } catch {
      // a faulty logger must not take the server down
    }
  };

  async function serve(stream: Stream, connection: Connection, exchange: Exchange): Promise<void> {
    const remotePeer = connection.remotePeer.toString();
    const ac = new AbortController();
    const res = new StreamResponseWriter(stream, ac.signal, limits, opts.dataFrameBytes, writeStallMs);
    // The handler's signal: the client's cancel (ac, which also ends the writer), or the server's
    // own (cancel(): the work stops, the response can still be finished).
    const work = new AbortController();
    ac.signal.addEventListener('abort', () => work.abort(ac.signal.reason), { once: true });
    exchange.cancel = (reason) => work.abort(reason);
    // The client's cancel: any close of the stream before the response is complete.
    const onClose = (evt: Event & { error?: Error }): void => {
      if (!res.complete) ac.abort(new StreamError(evt.error ? 'stream_reset' : 'stream_closed', 'the client closed the stream', { cause: evt.error }));
    };
    stream.addEventListener('close', onClose);
    if (stream.status !== 'open') ac.abort(new StreamError('stream_closed', 'the stream closed before the request was read'));
    // What the stream holds counts against the budget: the body read so far and what the reader
    // holds (a partial frame, frames not yet read), after each arrival and each frame read. Before
    // its HEAD, at most one HEAD: a first frame of any other kind is refused at its kind byte.
    let share = headBudget.share(headBudget.partOf(connection));
    let body = 0;
    const reader: FrameReader = new FrameReader(stream, {
      limits,
      firstKind: 'head',
      onBuffered: (held) => {
        if (!share.set(body + held)) reader.interrupt(new OverBudget());
      },
    });
    const hold = (size: number): boolean => share.set((body = size) + reader.heldBytes);
    let screened: HeadScreen | undefined;
    const onHead = (head: JsonObject): BodyLimit | BadRequest => {
      if (!opts.screen) return { limit: maxBodyBytes, over: tooLarge };
      // (a body announced too large for anyone is that, whatever its ticket: not screened)
      if (typeof head.body_length === 'number' && head.body_length > maxBodyBytes) return tooLarge;
      try {
        screened = opts.screen(head, remotePeer);
      } catch (e) {
        report(e, remotePeer);
        return { status: 500, code: 'internal_error', message: 'the request could not be screened' };
      }
      // What the stream holds moves to the paid requests' budget, or to the open one.
      const to = screened.vouched ? budget : openBudget;
      const next = to.share(to.partOf(connection));
      if (!next.set(body + reader.heldBytes)) return overBudget;
      share.release();
      share = next;
      if (!screened.vouched && screened.maxBody < maxBodyBytes) return { limit: screened.maxBody, over: screened.refusal };
      return { limit: maxBodyBytes, over: tooLarge };
    };
    const released = (): void => {
      const r = screened?.vouched ? screened.release : undefined;
      if (!r) return;
      try {
        r();
      } catch (e) {
        report(e, remotePeer);
      }
    };
    try {
      let read: ReadResult;
      try {
        read = await readRequest(reader, onHead, timeouts, hold);
      } finally {
        released();
      }
      if ('bad' in read) {
        try {
          opts.onRefused?.({ protocol, remotePeer, status: read.bad.status, code: read.bad.code });
        } catch {
          // an observer must not break serving
        }
        reader.discard();
        if (stream.writeStatus === 'writable') await res.finishWithError(read.bad.status, read.bad.code, read.bad.message);
        if (!(await remoteDone(stream, lingerMs))) stream.abort(new StreamError('aborted', 'the client kept sending after an error reply'));
        return;
      }
      // Whatever the client sends after an announced body (it should send nothing but its close)
      // is dropped as it arrives; more than a little, and the stream is reset: nothing it sends
      // is held (libp2p would buffer what nobody reads up to the stream's read buffer).
      reader.discard({ maxBytes: AFTER_BODY_BYTES, onOver: () => stream.abort(new StreamError('aborted', 'the client kept sending past its body')) });
      if (ac.signal.aborted) return;
      exchange.handling = true;
      const req: IncomingRequest = { head: read.head, body: read.body, remotePeer, remoteProviderId: providerIdOf(connection), signal: work.signal };
      if (screened?.note !== undefined) req.screened = screened.note;
      res.keepAlive(opts.keepAliveMs);
      try {
        await handler(req, res);
      } catch (e) {
        if (!work.signal.aborted) report(e, remotePeer);
      } finally {
        res.stopKeepAlive();
      }
      if (!res.finished && !ac.signal.aborted) {
        await res.finishWithError(500, 'internal_error', res.headSent ? 'the response ended without a trailer' : 'the request failed');
      }
      await res.settled();
      // The answer is out; the client should close too. One that does not is cut off after the
      // linger, as after an error reply: an open stream is memory and a slot in the stream limits.
      if (!(await remoteDone(stream, lingerMs))) stream.abort(new StreamError('aborted', 'the client kept its side open after the response'));
    } catch (e) {
      // Stream-level failures (reset while reading, closed while writing): nothing left to answer.
      if (!(e instanceof StreamError)) report(e, remotePeer);
    } finally {
      reader.detach();
      share.release();
      stream.removeEventListener('close', onClose);
    }
  }

  let lastEnded = 0;
  const streamHandler = (stream: Stream, connection: Connection): void => {
    if (stopping) {
      stream.abort(new StreamError('aborted', 'the server is stopping'));
      return;
    }
    const exchange: Exchange = { stream, done: Promise.resolve(), handling: false, cancel: () => undefined };
    exchanges.add(exchange);
    exchange.done = serve(stream, connection, exchange)
      .catch((e: unknown) => report(e, connection.remotePeer.toString()))
      .finally(() => {
        exchanges.delete(exchange);
        lastEnded = performance.now();
      });
  };

  await host.handle(protocol, streamHandler, { maxInboundStreams: opts.maxInboundStreams ?? STREAMS_PER_PROTOCOL });

  return {
    protocol,
    get inFlight() {
      return exchanges.size;
    },
    get lastEnded() {
      return lastEnded;
    },
    async drain(timeoutMs: number) {
      const start = Date.now();
      const deadline = start + timeoutMs;
      const readDeadline = start + Math.min(timeoutMs, DRAIN_READ_GRACE_MS);
      while (exchanges.size > 0) {
        const now = Date.now();
        const left = deadline - now;
        if (left <= 0) return false;
        const receiving = [...exchanges].filter((x) => !x.handling);
        if (receiving.length > 0 && now >= readDeadline) {
          for (const x of receiving) resetUnread(x);
        }
        const wait = receiving.length > 0 && now < readDeadline ? readDeadline - now : left;
        await settledWithin(Promise.allSettled([...exchanges].map((x) => x.done)), wait);
      }
      return true;
    },
    cancel(reason: Error) {
      for (const x of exchanges) {
        if (x.handling) x.cancel(reason);
        else resetUnread(x);
      }
    },
    async stop() {
      if (stopping) return;
      stopping = true;
      try {
        await host.unhandle(protocol);
      } catch {
        // the host may already be stopped
      }
      const running = [...exchanges];
      // Resetting the stream fires each handler's signal through the stream's 'close' event.
      for (const x of running) x.stream.abort(new StreamError('aborted', 'the server is stopping'));
      await settledWithin(Promise.allSettled(running.map((x) => x.done)), stopTimeoutMs);
    },
    async idle(timeoutMs: number) {
      const deadline = Date.now() + timeoutMs;
      while (exchanges.size > 0) {
        const left = deadline - Date.now();
        if (left <= 0) return false;
        await settledWithin(Promise.allSettled([...exchanges].map((x) => x.done)), left);
      }
      return true;
    },
  };
}

/**
 * Resolves once none of `servers` has had a request in flight for `quietMs` (their last exchanges
 * ended that long ago), or after `maxMs`; true when quiet. A node stopping waits for this before its
 * connections close: a peer that opens a stream as the host stops has its whole connection reset,
 * and the bytes it had received and not yet read go with it (a completed request's trailer, billed).
 */
export async function untilQuiet(servers: readonly Pick<RequestServer, 'inFlight' | 'lastEnded'>[], quietMs: number, maxMs: number): Promise<boolean> {
  const deadline = performance.now() + maxMs;
  for (;;) {
    const now = performance.now();
    const busy = servers.some((s) => s.inFlight > 0);
    const since = Math.max(0, ...servers.map((s) => s.lastEnded));
    if (!busy && now - since >= quietMs) return true;
    if (now >= deadline) return false;
    await new Promise((r) => setTimeout(r, Math.max(1, Math.min(busy ? 10 : since + quietMs - now, deadline - now))));
  }
}
