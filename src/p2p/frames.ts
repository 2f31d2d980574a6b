// Wire framing for the request streams (design.md, "Wire protocol").
//
//   frame   = length kind payload
//   length  = unsigned LEB128 varint, minimally encoded: the byte length of `payload` (the kind byte
//             is not counted)
//   kind    = 0x01 HEAD (UTF-8 JSON object) | 0x02 DATA (raw bytes) | 0x03 TRAILER (UTF-8 JSON object)
//
// The decoder is incremental: feed it chunks exactly as a transport delivers them (a frame may be split
// over many chunks, or many frames may share one) and it returns each frame once it is complete. Limits
// are per frame payload, by kind; a frame over its limit is refused as soon as its length is read, before
// its payload is buffered. Pure: no libp2p, no Node built-ins.

export type JsonObject = Record<string, unknown>;

export type Frame =
  | { kind: 'head'; value: JsonObject }
  | { kind: 'data'; bytes: Uint8Array }
  | { kind: 'trailer'; value: JsonObject };

export type FrameKind = Frame['kind'];

const KIND_BYTE = { head: 0x01, data: 0x02, trailer: 0x03 } as const satisfies Record<FrameKind, number>;

export type FrameErrorCode = 'frame_too_large' | 'frame_malformed' | 'frame_truncated';

export class FrameError extends Error {
  override name = 'FrameError';
  readonly code: FrameErrorCode;
  constructor(code: FrameErrorCode, message: string) {
    super(message);
    this.code = code;
  }
}

export interface FrameLimits {
  /** Largest HEAD or TRAILER payload (JSON bytes). */
  maxJsonBytes: number;
  /** Largest DATA payload. */
  maxDataBytes: number;
}

export const DEFAULT_FRAME_LIMITS: Readonly<FrameLimits> = Object.freeze({
  maxJsonBytes: 1024 * 1024,
  maxDataBytes: 4 * 1024 * 1024,
});

export function frameLimits(partial?: Partial<FrameLimits>): FrameLimits {
  const limits = { ...DEFAULT_FRAME_LIMITS, ...partial };
  for (const [k, v] of Object.entries(limits)) {
    if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`${k} must be a non-negative integer`);
  }
  return limits;
}

/** Longest varint accepted; any length a limit allows fits well within it. */
const MAX_VARINT_BYTES = 8;

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function limitFor(kind: FrameKind, limits: FrameLimits): number {
  return kind === 'data' ? limits.maxDataBytes : limits.maxJsonBytes;
}

function varintLength(n: number): number {
  let len = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 128);
    len++;
  }
  return len;
}

function writeVarint(out: Uint8Array, n: number): number {
  let i = 0;
  while (n >= 0x80) {
    out[i++] = (n % 128) | 0x80;
    n = Math.floor(n / 128);
  }
  out[i++] = n;
  return i;
}

function isJsonObject(v: unknown): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Encodes one frame. Throws FrameError `frame_too_large` past the limits, TypeError on a non-object. */
export function encodeFrame(frame: Frame, limits: FrameLimits = DEFAULT_FRAME_LIMITS): Uint8Array {
  let payload: Uint8Array;
  if (frame.kind === 'data') {
    payload = frame.bytes;
  } else {
    if (!isJsonObject(frame.value)) throw new TypeError(`a ${frame.kind.toUpperCase()} frame holds a JSON object`);
    payload = textEncoder.encode(JSON.stringify(frame.value));
  }
  const limit = limitFor(frame.kind, limits);
  if (payload.length > limit) {
    throw new FrameError('frame_too_large', `${frame.kind} frame of ${payload.length} bytes exceeds the limit of ${limit}`);
  }
  const headerLen = varintLength(payload.length) + 1;
  const out = new Uint8Array(headerLen + payload.length);
  const n = writeVarint(out, payload.length);
  out[n] = KIND_BYTE[frame.kind];
  out.set(payload, headerLen);
  return out;
}

export const encodeHead = (value: JsonObject, limits?: FrameLimits): Uint8Array => encodeFrame({ kind: 'head', value }, limits);
export const encodeData = (bytes: Uint8Array, limits?: FrameLimits): Uint8Array => encodeFrame({ kind: 'data', bytes }, limits);
export const encodeTrailer = (value: JsonObject, limits?: FrameLimits): Uint8Array =>
  encodeFrame({ kind: 'trailer', value }, limits);

/** A FIFO of byte chunks that hands out single bytes or runs of bytes without re-concatenating. */
class ByteQueue {
  private chunks: Uint8Array[] = [];
  private index = 0; // first live chunk
  private offset = 0; // read position inside it
  length = 0;

  push(chunk: Uint8Array): void {
    if (chunk.length === 0) return;
    this.chunks.push(chunk);
    this.length += chunk.length;
  }

  /** Caller guarantees length > 0. */
  byte(): number {
    const chunk = this.chunks[this.index]!;
    const b = chunk[this.offset++]!;
    this.length--;
    if (this.offset === chunk.length) this.advance();
    return b;
  }

  /** Caller guarantees length >= n. Zero-copy when the run lies inside one chunk. */
  take(n: number): Uint8Array {
    if (n === 0) return new Uint8Array(0);
    const first = this.chunks[this.index]!;
    if (first.length - this.offset >= n) {
      const out = first.subarray(this.offset, this.offset + n);
      this.offset += n;
      this.length -= n;
      if (this.offset === first.length) this.advance();
      return out;
    }
    const out = new Uint8Array(n);
    let filled = 0;
    while (filled < n) {
      const chunk = this.chunks[this.index]!;
      const k = Math.min(n - filled, chunk.length - this.offset);
      out.set(chunk.subarray(this.offset, this.offset + k), filled);
      filled += k;
      this.offset += k;
      if (this.offset === chunk.length) this.advance();
    }
    this.length -= n;
    return out;
  }

  private advance(): void {
    this.index++;
    this.offset = 0;
    if (this.index === this.chunks.length) {
      this.chunks = [];
      this.index = 0;
    } else if (this.index >= 64) {
      this.chunks = this.chunks.slice(this.index);
      this.index = 0;
    }
  }
}

export interface FrameDecoderOptions {
  /**
   * The kind the first frame must be (a request's HEAD): a first frame of another kind is refused
   * (`frame_malformed`) as soon as its kind byte is read, and a first length over this kind's limit
   * (`frame_too_large`) as soon as the length is read, so that nothing is held before that frame
   * but what one frame of this kind can be.
   */
  firstKind?: FrameKind;
}

/**
 * Incremental frame decoder. `push` returns the frames completed by the chunk; `end` checks that the
 * input stopped on a frame boundary. After an error the decoder stays failed and rethrows it.
 * DATA payloads may alias the pushed chunks: do not mutate a chunk after pushing it.
 */
export class FrameDecoder {
  readonly limits: FrameLimits;
  private readonly queue = new ByteQueue();
  private failed: FrameError | undefined;
  // Header parse state: a varint in progress, then the kind byte, then the payload.
  private varintValue = 0;
  private varintBytes = 0;
  private payloadLength = -1; // -1 while the varint is incomplete
  private kind: FrameKind | undefined;
  private readonly hardMax: number;
  /** FrameDecoderOptions.firstKind, until the first frame's kind byte has been read. */
  private firstKind: FrameKind | undefined;

  constructor(limits?: Partial<FrameLimits>, opts: FrameDecoderOptions = {}) {
    this.limits = frameLimits(limits);
    this.hardMax = Math.max(this.limits.maxJsonBytes, this.limits.maxDataBytes);
    this.firstKind = opts.firstKind;
  }

  /** Bytes received but not yet returned as part of a frame. */
  get buffered(): number {
    return this.queue.length + this.varintBytes + (this.kind ? 1 : 0);
  }

  push(chunk: Uint8Array): Frame[] {
    if (this.failed) throw this.failed;
    this.queue.push(chunk);
    const frames: Frame[] = [];
    try {
      for (;;) {
        const frame = this.next();
        if (!frame) break;
        frames.push(frame);
      }
    } catch (e) {
      if (e instanceof FrameError) this.failed = e;
      throw e;
    }
    return frames;
  }

  /** The input ended: throws `frame_truncated` unless it ended exactly between frames. */
  end(): void {
    if (this.failed) throw this.failed;
    if (this.buffered > 0) {
      this.failed = new FrameError('frame_truncated', `stream ended inside a frame (${this.buffered} bytes of an incomplete frame)`);
      throw this.failed;
    }
  }

  private next(): Frame | undefined {
    const q = this.queue;
    while (this.payloadLength < 0) {
      if (q.length === 0) return undefined;
      const b = q.byte();
      if (this.varintBytes === MAX_VARINT_BYTES) throw new FrameError('frame_malformed', 'frame length varint is too long');
      this.varintValue += (b & 0x7f) * 2 ** (7 * this.varintBytes);
      this.varintBytes++;
      const max = this.firstKind ? limitFor(this.firstKind, this.limits) : this.hardMax;
      if (this.varintValue > max) {
        const length = `${this.varintValue}${b & 0x80 ? '+' : ''}`;
        throw new FrameError(
          'frame_too_large',
          this.firstKind
            ? `the first frame must be a ${this.firstKind.toUpperCase()}: its length ${length} exceeds that kind's limit of ${max}`
            : `frame length ${length} exceeds the limit of ${max}`,
        );
      }
      if ((b & 0x80) === 0) {
        if (b === 0 && this.varintBytes > 1) throw new FrameError('frame_malformed', 'frame length varint is not minimally encoded');
        this.payloadLength = this.varintValue;
      }
    }
    if (this.kind === undefined) {
      if (q.length === 0) return undefined;
      const k = q.byte();
      const kind: FrameKind | undefined = k === 0x01 ? 'head' : k === 0x02 ? 'data' : k === 0x03 ? 'trailer' : undefined;
      if (!kind) throw new FrameError('frame_malformed', `unknown frame kind 0x${k.toString(16).padStart(2, '0')}`);
      if (this.firstKind !== undefined) {
        if (kind !== this.firstKind) throw new FrameError('frame_malformed', `expected a ${this.firstKind.toUpperCase()} frame first, got ${kind.toUpperCase()}`);
        this.firstKind = undefined;
      }
      const limit = limitFor(kind, this.limits);
      if (this.payloadLength > limit) {
        throw new FrameError('frame_too_large', `${kind} frame of ${this.payloadLength} bytes exceeds the limit of ${limit}`);
      }
      this.kind = kind;
    }
    if (q.length < this.payloadLength) return undefined;
    const payload = q.take(this.payloadLength);
    const kind = this.kind;
    this.varintValue = 0;
    this.varintBytes = 0;
    this.payloadLength = -1;
    this.kind = undefined;
    if (kind === 'data') return { kind, bytes: payload };
    return { kind, value: parseJsonObject(kind, payload) };
  }
}

function parseJsonObject(kind: 'head' | 'trailer', payload: Uint8Array): JsonObject {
  let value: unknown;
  try {
    value = JSON.parse(textDecoder.decode(payload));
  } catch {
    throw new FrameError('frame_malformed', `${kind} frame is not valid UTF-8 JSON`);
  }
  if (!isJsonObject(value)) throw new FrameError('frame_malformed', `${kind} frame JSON is not an object`);
  return value;
}
