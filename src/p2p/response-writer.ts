// The server's side of one response: HEAD, then DATA frames, then TRAILER, which closes the write side.
//
// Frames are corked: written into a small buffer that goes out as one stream write at the next
// setImmediate, when it reaches CORK_BYTES, or with the TRAILER. A short response (HEAD + DATA + TRAILER)
// thus costs one muxer frame, one Noise message and one syscall instead of three. head() and data()
// resolve as soon as their bytes are queued while the stream keeps up; once it asks for a drain they
// resolve only after it drains: backpressure, as with Node's writable.write().
//
// data(bytes, { sent: true }) is for bytes that are billed (streamed tokens): it waits for room
// before it queues, and resolves only once its bytes were handed to the stream (stream.send). So a
// buyer who resets the stream while the bytes sit in the cork makes it reject (they were never
// sent, so never billed), and a failure while waiting for room leaves them unsent as well.
//
// Keepalives (keepAlive()): while the handler works, an empty DATA frame goes out whenever nothing
// has been written for a while, before the HEAD too (docs/protocol.md): a buyer's gateway takes a
// provider silent for long for dead, and a whole-body answer, a long prefill, an embeddings batch or
// a wait in the admission queue is silent for as long as it takes. It carries no bytes, so it adds
// nothing to the body or to response_sha256.
//
// Every returned promise is already marked handled: a handler that ignores one (after the client went
// away, say) never causes an unhandled rejection, while one that awaits it still sees the error.
import { concatBytes } from '../../attestation/bytes.ts';
import type { Stream } from '@libp2p/interface';
import { DEFAULT_FRAME_LIMITS, encodeData, encodeHead, encodeTrailer, type FrameLimits, type JsonObject } from './frames.ts';
import { deferred, StreamError, waitForDrain, type Deferred } from './frame-io.ts';
import { errorBody } from '../service-error.ts';
import type { DataOptions } from '../serve/infer-service.ts';

export interface ResponseWriter {
  /** Sends the HEAD frame (status, headers). Exactly once, first. */
  head(value: JsonObject): Promise<void>;
  /**
   * Sends body bytes as one or more DATA frames; waits while the stream asks for a drain. With
   * `sent`, resolves only once the bytes were handed to the transport (see the top of this file).
   */
  data(bytes: Uint8Array, opts?: DataOptions): Promise<void>;
  /** Sends the TRAILER frame (receipt or error envelope) and closes the write side. Last. */
  trailer(value: JsonObject): Promise<void>;
  /** True once head() has been called. */
  readonly headSent: boolean;
  /** True once trailer() has been called. */
  readonly finished: boolean;
}

/** Queued bytes that force a write without waiting for setImmediate. */
export const CORK_BYTES = 64 * 1024;

/** How long a response may be silent while its handler works before a keepalive goes out. */
export const KEEPALIVE_MS = 1000;

/** An empty DATA frame: a keepalive. */
const KEEPALIVE_FRAME = encodeData(new Uint8Array(0));

const noop = (): void => {};

function handled<T>(p: Promise<T>): Promise<T> {
  p.catch(noop);
  return p;
}


export class StreamResponseWriter implements ResponseWriter {
  private readonly stream: Stream;
  private readonly signal: AbortSignal;
  private readonly limits: FrameLimits;
  private readonly dataFrameBytes: number;
  private state: 'start' | 'body' | 'done' = 'start';
  private pending: Uint8Array[] = [];
  private pendingBytes = 0;
  private flushTimer: NodeJS.Immediate | undefined;
  private writeError: Error | undefined;
  private trailerWritten = false;
  private closing: Promise<void> | undefined;
  /** Settled by the next flush: resolved once it handed the queued bytes to the stream, else rejected. */
  private flushed: Deferred | undefined;
  /** When bytes last went to the stream (performance.now()). */
  private lastSentAt = performance.now();
  private keepAliveTimer: NodeJS.Timeout | undefined;

  /** How long a write may wait for the remote to take anything before the stream is aborted. */
  private readonly stallMs: number | undefined;

  constructor(stream: Stream, signal: AbortSignal, limits: FrameLimits = DEFAULT_FRAME_LIMITS, dataFrameBytes = 1024 * 1024, stallMs?: number) {
    this.stream = stream;
    this.signal = signal;
    this.stallMs = stallMs;
    this.limits = limits;
    this.dataFrameBytes = Math.max(1, Math.min(dataFrameBytes, limits.maxDataBytes));
  }

  get headSent(): boolean {
    return this.state !== 'start';
  }

  get finished(): boolean {
    return this.state === 'done';
  }

  /** True once the TRAILER frame has been handed to the stream: the response is complete. */
  get complete(): boolean {
    return this.trailerWritten;
  }

  /** Resolves when the TRAILER has been written and the write side closed (or that failed). */
  settled(): Promise<void> {
    return (this.closing ?? Promise.resolve()).catch(noop);
  }

  /**
   * From now until the TRAILER (or the stream's end), an empty DATA frame whenever `silentMs` pass
   * with nothing written; never while the stream asks for a drain (the wait is the reader's).
   */
  keepAlive(silentMs = KEEPALIVE_MS): void {
    if (this.keepAliveTimer || this.state === 'done') return;
    this.keepAliveTimer = setInterval(() => {
      if (this.state === 'done' || this.signal.aborted || this.writeError) return this.stopKeepAlive();
      if (this.pendingBytes > 0 || performance.now() - this.lastSentAt < silentMs) return;
      if (this.stream.writeStatus !== 'writable' || this.stream.writableNeedsDrain) return;
      this.queue(KEEPALIVE_FRAME);
    }, Math.max(1, Math.floor(silentMs / 2)));
    this.keepAliveTimer.unref();
  }

  stopKeepAlive(): void {
    clearInterval(this.keepAliveTimer);
    this.keepAliveTimer = undefined;
  }

  head(value: JsonObject): Promise<void> {
    if (this.state !== 'start') return this.misuse('head() was already sent');
    return handled(
      (async () => {
        this.check();
        const frame = encodeHead(value, this.limits);
        this.state = 'body';
        this.queue(frame);
        await this.ready();
      })(),
    );
  }

  data(bytes: Uint8Array, opts?: DataOptions): Promise<void> {
    if (this.state !== 'body') return this.misuse(this.state === 'start' ? 'data() before head()' : 'data() after trailer()');
    if (!(bytes instanceof Uint8Array)) return handled(Promise.reject(new TypeError('data() takes a Uint8Array')));
    if (opts?.sent) return handled(this.dataSent(bytes));
    return handled(
      (async () => {
        this.check();
        this.queueData(bytes);
        await this.ready();
      })(),
    );
  }

  /** data() with `sent`: room first, then queue, then resolve once a flush handed the bytes over. */
  private async dataSent(bytes: Uint8Array): Promise<void> {
    while (this.stream.writableNeedsDrain) await waitForDrain(this.stream, this.signal, this.stallMs);
    this.check();
    if (this.state !== 'body') throw new Error('response misuse: data() after trailer()');
    this.queueData(bytes); // (a full cork is flushed at once: that throws if the stream refuses)
    if (this.pendingBytes === 0) return; // nothing left in the cork: all of it was handed over
    if (!this.flushed) {
      this.flushed = deferred();
      this.flushed.promise.catch(noop); // settled by the next flush, awaited or not
    }
    await this.flushed.promise;
  }

  /** All frames are handed over synchronously, so concurrent data() calls cannot interleave. */
  private queueData(bytes: Uint8Array): void {
    for (let at = 0; at < bytes.length; at += this.dataFrameBytes) {
      this.queue(encodeData(bytes.subarray(at, at + this.dataFrameBytes), this.limits));
      if (this.pendingBytes >= CORK_BYTES) this.flush();
    }
  }

  trailer(value: JsonObject): Promise<void> {
    if (this.state !== 'body') return this.misuse(this.state === 'start' ? 'trailer() before head()' : 'trailer() was already sent');
    let frame: Uint8Array;
    try {
      this.check();
      frame = encodeTrailer(value, this.limits);
    } catch (e) {
      return handled(Promise.reject(e));
    }
    this.state = 'done';
    this.stopKeepAlive();
    this.closing = (async () => {
      this.queue(frame);
      this.flush();
      this.trailerWritten = true;
      try {
        // close() waits for the queued bytes to reach the muxer, then sends FIN.
        await this.stream.close();
      } catch (e) {
        throw new StreamError('stream_closed', `closing the stream failed: ${(e as Error).message}`, { cause: e });
      }
    })();
    return handled(this.closing);
  }

  /**
   * Ends a response the handler left unfinished: a 500 when nothing was sent, else an error trailer.
   * No-op when finished or when the stream is gone.
   */
  async finishWithError(status: number, code: string, message: string): Promise<void> {
    if (this.state === 'done' || this.signal.aborted) return;
    if (this.state === 'start') await this.head({ status });
    await this.trailer({ ...errorBody(code, message) });
  }

  /** Throws when the request was cancelled or an earlier write failed. */
  private check(): void {
    if (this.signal.aborted) throw new StreamError('aborted', 'the request was cancelled', { cause: this.signal.reason });
    if (this.writeError) throw this.writeError;
  }

  private queue(frame: Uint8Array): void {
    this.pending.push(frame);
    this.pendingBytes += frame.length;
    this.flushTimer ??= setImmediate(() => {
      this.flushTimer = undefined;
      try {
        this.flush();
      } catch {
        // recorded in writeError; the next call (or the signal) reports it
      }
    });
  }

  /** Writes everything queued as one stream write. */
  private flush(): void {
    if (this.flushTimer) {
      clearImmediate(this.flushTimer);
      this.flushTimer = undefined;
    }
    if (this.pendingBytes === 0) return;
    const bytes = concatBytes(...this.pending);
    const flushed = this.flushed;
    this.pending = [];
    this.pendingBytes = 0;
    this.flushed = undefined;
    try {
      if (this.writeError) throw this.writeError;
      try {
        if (this.stream.writeStatus !== 'writable') throw new Error(`the stream is ${this.stream.status}`);
        this.stream.send(bytes);
        this.lastSentAt = performance.now();
      } catch (e) {
        const s = this.stream.status;
        this.writeError = new StreamError(s === 'reset' || s === 'aborted' ? 'stream_reset' : 'stream_closed', `write failed: ${(e as Error).message}`, { cause: e });
        throw this.writeError;
      }
    } catch (e) {
      flushed?.reject(e);
      throw e;
    }
    flushed?.resolve();
  }

  /** Flushes when the cork is full, then waits while the stream asks for a drain. */
  private async ready(): Promise<void> {
    if (this.pendingBytes >= CORK_BYTES) this.flush();
    while (this.stream.writableNeedsDrain) await waitForDrain(this.stream, this.signal, this.stallMs);
    this.check();
  }

  private misuse(message: string): Promise<void> {
    const err = this.signal.aborted
      ? new StreamError('aborted', 'the request was cancelled', { cause: this.signal.reason })
      : new Error(`response misuse: ${message}`);
    return handled(Promise.reject(err));
  }
}
