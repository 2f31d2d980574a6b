// Frames over one libp2p 3 stream: a reader with backpressure and a writer that waits for drain.
//
// libp2p 3 streams are event targets: 'message' delivers bytes, 'end' says no more bytes will come
// (after the remote closed its write side, or the stream was aborted/reset), 'close' says the stream is
// finished (`evt.error` set for a reset or abort), 'drain' says `send()` may be called again.
// `pause()`/`resume()` stop and restart reading; on yamux, pausing withholds window updates, so the
// remote's send window runs dry and it stops sending: real backpressure, not just buffering.
import type { Stream } from '@libp2p/interface';
import { FrameDecoder, FrameError, type Frame, type FrameKind, type FrameLimits } from './frames.ts';
import { STREAM_READ_BUFFER } from './stream-limits.ts';

export type StreamErrorCode = 'stream_reset' | 'stream_closed' | 'unexpected_frame' | 'missing_trailer' | 'aborted' | 'timeout';

export class StreamError extends Error {
  override name = 'StreamError';
  readonly code: StreamErrorCode;
  constructor(code: StreamErrorCode, message: string, options?: ErrorOptions) {
    super(message, options);
    this.code = code;
  }
}

export interface FrameReaderOptions {
  limits?: Partial<FrameLimits>;
  /** The kind the first frame must be: see FrameDecoderOptions.firstKind (frames.ts). */
  firstKind?: FrameKind;
  /** Pause the stream once this many decoded bytes wait unread (default 1 MiB). */
  highWaterMark?: number;
  /** Told, after each arrival, how many received bytes it holds (a partial frame and frames not yet read). */
  onBuffered?: (bytes: number) => void;
  /**
   * Bytes that must arrive before the first frame (a protocol confirmation: optimistic-select.ts).
   * `confirmed` resolves once they have; other bytes fail the reader with `mismatch(at)`'s error,
   * `at` being the index of the first byte that differed.
   */
  expectFirst?: { bytes: Uint8Array; mismatch: (at: number) => Error };
}

function payloadSize(f: Frame): number {
  return f.kind === 'data' ? f.bytes.length : 64;
}

/**
 * Decodes frames from a stream's incoming bytes. `next()` resolves with the next frame, with null at a
 * clean end of input (the remote closed its write side on a frame boundary), or rejects with a
 * FrameError (malformed input) or a StreamError (the stream was reset or aborted).
 */
export class FrameReader implements AsyncIterable<Frame> {
  private readonly stream: Stream;
  private readonly decoder: FrameDecoder;
  private readonly highWater: number;
  private readonly onBuffered: ((bytes: number) => void) | undefined;
  private readonly queue: Frame[] = [];
  private queued = 0;
  private ended = false;
  private error: Error | undefined;
  private wake: (() => void) | undefined;
  private detached = false;
  private discarding = false;
  private discardBound: { maxBytes: number; onOver: () => void } | undefined;
  private discarded = 0;
  /** Inside resumeStream(): see there. */
  private resuming = false;
  private readonly expect: FrameReaderOptions['expectFirst'];
  private expected = 0;
  private readonly confirmation = deferred();

  constructor(stream: Stream, opts: FrameReaderOptions = {}) {
    this.stream = stream;
    this.decoder = new FrameDecoder(opts.limits, { firstKind: opts.firstKind });
    this.highWater = opts.highWaterMark ?? 1024 * 1024;
    this.onBuffered = opts.onBuffered;
    this.expect = opts.expectFirst;
    this.confirmation.promise.catch(() => {}); // a failure also surfaces through next()
    if (!this.expect || this.expect.bytes.length === 0) this.confirmation.resolve();
    // See STREAM_READ_BUFFER: while paused, up to a full yamux window may still arrive.
    if (stream.maxReadBufferLength < STREAM_READ_BUFFER) stream.maxReadBufferLength = STREAM_READ_BUFFER;
    stream.addEventListener('message', this.onMessage);
    stream.addEventListener('end', this.onEnd);
    stream.addEventListener('close', this.onClose);
    if (stream.status === 'reset' || stream.status === 'aborted') this.fail(resetError(stream));
    else if (stream.readableEnded) this.onEnd();
  }

  /** Resolves once the `expectFirst` bytes have arrived (at once without them); rejects if the reader fails first. */
  get confirmed(): Promise<void> {
    return this.confirmation.promise;
  }

  /** Bytes decoded and waiting for `next()`. */
  get queuedBytes(): number {
    return this.queued;
  }

  /** Bytes received and held: a partial frame and the frames waiting for `next()`. */
  get heldBytes(): number {
    return this.queued + this.decoder.buffered;
  }

  async next(): Promise<Frame | null> {
    for (;;) {
      const frame = this.queue.shift();
      if (frame) {
        this.queued -= payloadSize(frame);
        if (this.queued <= this.highWater / 2 && this.stream.readStatus === 'paused') this.resumeStream();
        return frame;
      }
      if (this.error) throw this.error;
      if (this.ended) return null;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
    }
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Frame> {
    for (;;) {
      const f = await this.next();
      if (!f) return;
      yield f;
    }
  }

  /**
   * Drops queued frames and all further input (after an error reply, or after a whole request),
   * keeping the stream flowing. With `maxBytes`, `onOver` is called once when more than that has
   * been dropped (a peer that keeps sending what nobody reads).
   */
  discard(bound?: { maxBytes: number; onOver: () => void }): void {
    this.discardBound = bound;
    this.discarding = true;
    this.queue.length = 0;
    this.queued = 0;
    if (this.stream.readStatus === 'paused') this.resumeStream();
  }

  /**
   * Resumes reading, and pauses again at once if what the stream held back is more than we want.
   * Not a pause from inside the resume: libp2p's resume() delivers the held-back bytes first and
   * re-enables the muxer's window updates after, so a pause made while those bytes are delivered
   * would be undone for the muxer (yamux would grant the remote window after window while the
   * stream reads as paused, until its read buffer overflowed and the stream was aborted).
   */
  private resumeStream(): void {
    this.resuming = true;
    try {
      this.stream.resume();
    } catch {
      // The stream closed while paused (its remote went: a node that answered in full and then
      // stopped). resume() delivered what the stream held first, then failed to ask the remote
      // for more (s29 review: the throw lost an answer already billed). What came is read; the
      // input ends after it, or with the error the stream's close carries.
      if (this.stream.readBufferLength === 0 && this.stream.status !== 'open') this.onEnd();
      return;
    } finally {
      this.resuming = false;
    }
    if (this.queued > this.highWater && this.stream.readStatus === 'readable') this.stream.pause();
  }

  /** Stops listening; further input is left to the stream. */
  detach(): void {
    if (this.detached) return;
    this.detached = true;
    this.stream.removeEventListener('message', this.onMessage);
    this.stream.removeEventListener('end', this.onEnd);
    this.stream.removeEventListener('close', this.onClose);
  }

  private notify(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  /** Makes the pending and every later `next()` reject with `err` (unless the input already ended). */
  interrupt(err: Error): void {
    this.fail(err);
  }

  private fail(err: Error): void {
    if (this.error || this.ended) return;
    this.error = err;
    this.confirmation.reject(err);
    this.notify();
  }

  /** The part of `chunk` after the expected first bytes; null while they are not all here (or differed). */
  private confirm(chunk: Uint8Array): Uint8Array | null {
    const want = this.expect!.bytes;
    const n = Math.min(want.length - this.expected, chunk.length);
    for (let i = 0; i < n; i++) {
      if (chunk[i] !== want[this.expected + i]) {
        this.fail(this.expect!.mismatch(this.expected + i));
        return null;
      }
    }
    this.expected += n;
    if (this.expected < want.length) return null;
    this.confirmation.resolve();
    return chunk.subarray(n);
  }

  private readonly onMessage = (evt: { data: Uint8Array | Iterable<Uint8Array> }): void => {
    if (this.discarding && this.discardBound) {
      const data = evt.data;
      this.discarded += data instanceof Uint8Array ? data.byteLength : (data as { byteLength?: number }).byteLength ?? 0;
      if (this.discarded > this.discardBound.maxBytes) {
        const over = this.discardBound.onOver;
        this.discardBound = undefined;
        over();
      }
    }
    if (this.error || this.ended || this.discarding) return; // after an error the rest of the input is dropped
    const chunks = evt.data instanceof Uint8Array ? [evt.data] : evt.data;
    try {
      for (let chunk of chunks) {
        if (this.expect && this.expected < this.expect.bytes.length) {
          const rest = this.confirm(chunk);
          if (rest === null) {
            if (this.error) return;
            continue;
          }
          chunk = rest;
        }
        for (const f of this.decoder.push(chunk)) {
          this.queue.push(f);
          this.queued += payloadSize(f);
        }
      }
    } catch (e) {
      this.fail(e instanceof FrameError ? e : new StreamError('stream_closed', String(e)));
    }
    if (this.queue.length > 0) this.notify();
    if (this.queued > this.highWater && this.stream.readStatus === 'readable' && !this.resuming) this.stream.pause();
    if (!this.error) this.onBuffered?.(this.heldBytes);
  };

  private readonly onEnd = (): void => {
    if (this.error || this.ended) return;
    const s = this.stream.status;
    if (s === 'reset' || s === 'aborted') {
      // libp2p dispatches 'end' before the 'close' event that carries the reason: wait for it, so
      // the error says why (a read buffer over its limit, the remote's reset, a local abort).
      queueMicrotask(() => this.fail(resetError(this.stream)));
      return;
    }
    if (this.expect && this.expected < this.expect.bytes.length) {
      this.fail(new StreamError('stream_closed', 'the stream ended before the remote confirmed the protocol'));
      return;
    }
    try {
      this.decoder.end();
      this.ended = true;
      this.notify();
    } catch (e) {
      this.fail(e as Error);
    }
  };

  private readonly onClose = (evt: Event & { error?: Error }): void => {
    if (evt.error) this.fail(resetError(this.stream, evt.error));
    // A clean close can come while we are paused with input still buffered in the stream; that input
    // is delivered on resume() and 'end' follows it. Only an empty buffer means the input is over.
    else if (this.stream.readBufferLength === 0) this.onEnd();
  };
}

export interface Deferred {
  promise: Promise<void>;
  resolve: () => void;
  reject: (e: unknown) => void;
}

/** A promise with its resolve and reject (Promise.withResolvers, which the compile target lacks). */
export function deferred(): Deferred {
  let resolve!: () => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

function resetError(stream: Stream, cause?: Error): StreamError {
  return new StreamError('stream_reset', `stream ${stream.status}${cause ? `: ${cause.message}` : ''}`, { cause });
}

/** Resolves once the stream accepts writes again; rejects when it closes first or `signal` aborts. */
export function waitForDrain(stream: Stream, signal?: AbortSignal, stallMs?: number): Promise<void> {
  if (!stream.writableNeedsDrain) return Promise.resolve();
  // Not stream.onDrain(): in @libp2p/utils 7.4 its promise is created once and never replaced, so after
  // the first drain it resolves at once and applies no backpressure.
  return new Promise<void>((resolve, reject) => {
    // A remote that takes nothing for stallMs: the stream is aborted (its close settles this wait).
    // Progress is the send buffer shrinking, so a slow reader of one large write is not cut off.
    let buffered = stream.writeBufferLength;
    let progressAt = Date.now();
    const timer =
      stallMs === undefined
        ? undefined
        : setInterval(() => {
            const now = stream.writeBufferLength;
            if (now < buffered) progressAt = Date.now();
            buffered = now;
            if (Date.now() - progressAt >= stallMs) stream.abort(new StreamError('timeout', `the remote read nothing for ${stallMs} ms`));
          }, Math.max(10, Math.min(1000, Math.floor(stallMs / 4))));
    const done = (err?: Error): void => {
      clearInterval(timer);
      stream.removeEventListener('drain', onDrain);
      stream.removeEventListener('close', onClose);
      signal?.removeEventListener('abort', onAbort);
      if (err) reject(err);
      else resolve();
    };
    const onDrain = (): void => done();
    const onClose = (evt: Event & { error?: Error }): void =>
      done(new StreamError(evt.error ? 'stream_reset' : 'stream_closed', 'stream closed while waiting to write', { cause: evt.error }));
    const onAbort = (): void => done(new StreamError('aborted', 'aborted while waiting to write', { cause: signal?.reason }));
    if (signal?.aborted) return onAbort();
    stream.addEventListener('drain', onDrain);
    stream.addEventListener('close', onClose);
    signal?.addEventListener('abort', onAbort);
  });
}

/** Sends encoded bytes, then waits while the stream asks for a drain (backpressure). */
export async function writeBytes(stream: Stream, bytes: Uint8Array, signal?: AbortSignal): Promise<void> {
  signal?.throwIfAborted();
  if (stream.writeStatus !== 'writable') {
    throw new StreamError(stream.status === 'reset' || stream.status === 'aborted' ? 'stream_reset' : 'stream_closed', `stream is not writable (${stream.writeStatus})`);
  }
  let more: boolean;
  try {
    more = stream.send(bytes);
  } catch (e) {
    throw new StreamError('stream_closed', `send failed: ${(e as Error).message}`, { cause: e });
  }
  while (!more && stream.writableNeedsDrain) {
    await waitForDrain(stream, signal);
    more = !stream.writableNeedsDrain;
  }
}
