import { describe, expect, it } from 'vitest';
import {
  DEFAULT_FRAME_LIMITS,
  FrameDecoder,
  FrameError,
  encodeData,
  encodeFrame,
  encodeHead,
  encodeTrailer,
  type Frame,
} from '../src/p2p/frames.ts';

const enc = new TextEncoder();

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

/** A raw frame with an arbitrary kind byte and payload (for malformed input). */
function raw(kind: number, payload: Uint8Array, lengthBytes?: number[]): Uint8Array {
  const len: number[] = lengthBytes ?? [];
  if (!lengthBytes) {
    let n = payload.length;
    while (n >= 0x80) {
      len.push((n & 0x7f) | 0x80);
      n >>>= 7;
    }
    len.push(n);
  }
  return concat([Uint8Array.from(len), Uint8Array.of(kind), payload]);
}

function decodeAll(bytes: Uint8Array, decoder = new FrameDecoder()): Frame[] {
  const frames = decoder.push(bytes);
  decoder.end();
  return frames;
}

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    if (e instanceof FrameError) return e.code;
    throw e;
  }
  return undefined;
}

// Deterministic PRNG so a failing split is reproducible.
function prng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

describe('frame encoding', () => {
  it('encodes length (payload only), kind, payload', () => {
    expect([...encodeData(Uint8Array.of(9, 8, 7))]).toEqual([3, 0x02, 9, 8, 7]);
    expect([...encodeHead({ a: 1 })]).toEqual([7, 0x01, ...enc.encode('{"a":1}')]);
    expect([...encodeTrailer({})]).toEqual([2, 0x03, ...enc.encode('{}')]);
    const big = encodeData(new Uint8Array(300));
    expect([...big.subarray(0, 3)]).toEqual([0xac, 0x02, 0x02]); // 300 = 0b10_0101100
    expect(big.length).toBe(303);
  });

  it('refuses non-object JSON and payloads over the limit', () => {
    expect(() => encodeFrame({ kind: 'head', value: [] as unknown as Record<string, unknown> })).toThrow(TypeError);
    expect(() => encodeFrame({ kind: 'trailer', value: null as unknown as Record<string, unknown> })).toThrow(TypeError);
    expect(codeOf(() => encodeData(new Uint8Array(DEFAULT_FRAME_LIMITS.maxDataBytes + 1)))).toBe('frame_too_large');
    expect(codeOf(() => encodeHead({ s: 'x'.repeat(DEFAULT_FRAME_LIMITS.maxJsonBytes) }))).toBe('frame_too_large');
    expect(encodeData(new Uint8Array(10), { maxDataBytes: 10, maxJsonBytes: 10 }).length).toBe(12);
  });
});

describe('frame decoding', () => {
  it('round-trips every kind, including empty DATA and unicode JSON', () => {
    const frames: Frame[] = [
      { kind: 'head', value: { status: 200, headers: { 'x-request-id': 'r1' }, s: 'héllo ✓ 🚀' } },
      { kind: 'data', bytes: new Uint8Array(0) },
      { kind: 'data', bytes: Uint8Array.from({ length: 1000 }, (_, i) => i & 0xff) },
      { kind: 'trailer', value: { receipt: { n: [1, 2, 3] } } },
    ];
    const out = decodeAll(concat(frames.map((f) => encodeFrame(f))));
    expect(out).toEqual(frames);
  });

  it('an empty input is a clean end', () => {
    const d = new FrameDecoder();
    expect(d.push(new Uint8Array(0))).toEqual([]);
    expect(() => d.end()).not.toThrow();
  });

  it('decodes the same frames under random splits and merges (fuzz)', () => {
    const rand = prng(42);
    for (let round = 0; round < 200; round++) {
      const frames: Frame[] = [{ kind: 'head', value: { round, pad: 'p'.repeat(Math.floor(rand() * 300)) } }];
      const nData = Math.floor(rand() * 8);
      for (let i = 0; i < nData; i++) {
        const len = rand() < 0.2 ? 0 : Math.floor(rand() * (rand() < 0.1 ? 70_000 : 400));
        frames.push({ kind: 'data', bytes: Uint8Array.from({ length: len }, () => Math.floor(rand() * 256)) });
      }
      frames.push({ kind: 'trailer', value: { ok: rand() < 0.5 } });
      const wire = concat(frames.map((f) => encodeFrame(f)));
      const d = new FrameDecoder();
      const got: Frame[] = [];
      let at = 0;
      while (at < wire.length) {
        const step = rand() < 0.3 ? 1 : 1 + Math.floor(rand() * (rand() < 0.5 ? 16 : 90_000));
        got.push(...d.push(wire.slice(at, at + step)));
        at += step;
      }
      d.end();
      expect(got).toEqual(frames);
    }
  });

  it('returns DATA zero-copy when the payload lies inside one chunk', () => {
    const wire = encodeData(Uint8Array.of(1, 2, 3));
    const [f] = new FrameDecoder().push(wire);
    expect(f?.kind).toBe('data');
    if (f?.kind === 'data') expect(f.bytes.buffer).toBe(wire.buffer);
  });

  it('reports the buffered bytes of an incomplete frame', () => {
    const d = new FrameDecoder();
    const wire = encodeData(new Uint8Array(200));
    d.push(wire.subarray(0, 1));
    expect(d.buffered).toBe(1);
    d.push(wire.subarray(1, 50));
    expect(d.buffered).toBe(50);
    expect(d.push(wire.subarray(50))).toHaveLength(1);
    expect(d.buffered).toBe(0);
  });
});

describe('frame decoding errors', () => {
  it('frame_truncated when the input ends mid-varint, after the kind byte, or mid-payload', () => {
    const wire = encodeData(new Uint8Array(300)); // 2-byte varint
    for (const cut of [1, 2, 3, 100, wire.length - 1]) {
      const d = new FrameDecoder();
      expect(d.push(wire.subarray(0, cut))).toEqual([]);
      expect(codeOf(() => d.end())).toBe('frame_truncated');
    }
    // a complete frame followed by half of another
    const d = new FrameDecoder();
    expect(d.push(concat([encodeHead({}), wire.subarray(0, 5)]))).toHaveLength(1);
    expect(codeOf(() => d.end())).toBe('frame_truncated');
  });

  it('frame_malformed on an unknown kind', () => {
    for (const kind of [0x00, 0x04, 0x7f, 0xff]) {
      expect(codeOf(() => decodeAll(raw(kind, Uint8Array.of(1))))).toBe('frame_malformed');
    }
  });

  it('frame_malformed on a non-minimal or over-long varint', () => {
    expect(codeOf(() => decodeAll(raw(0x02, Uint8Array.of(1), [0x81, 0x00])))).toBe('frame_malformed');
    expect(codeOf(() => new FrameDecoder().push(Uint8Array.from(new Array(12).fill(0x80))))).toBe('frame_malformed');
  });

  it('frame_malformed on invalid JSON, invalid UTF-8, or JSON that is not an object', () => {
    for (const text of ['', '{', '{"a":}', 'nul', '[]', '[1,2]', 'null', '"s"', '42', 'true', '\uFEFF{}']) {
      expect(codeOf(() => decodeAll(raw(0x01, enc.encode(text)))), text).toBe('frame_malformed');
      expect(codeOf(() => decodeAll(raw(0x03, enc.encode(text)))), text).toBe('frame_malformed');
    }
    expect(codeOf(() => decodeAll(raw(0x01, Uint8Array.of(0x7b, 0xff, 0x7d))))).toBe('frame_malformed');
  });

  it('frame_too_large as soon as the length is known, before the payload arrives', () => {
    const d = new FrameDecoder();
    // DATA of limit+1: header only
    const len = DEFAULT_FRAME_LIMITS.maxDataBytes + 1;
    const lenBytes = [(len & 0x7f) | 0x80, ((len >>> 7) & 0x7f) | 0x80, ((len >>> 14) & 0x7f) | 0x80, len >>> 21];
    expect(codeOf(() => d.push(Uint8Array.from([...lenBytes, 0x02])))).toBe('frame_too_large');
    // A length beyond every limit is refused from the varint alone, without a kind byte.
    expect(codeOf(() => new FrameDecoder().push(Uint8Array.of(0xff, 0xff, 0xff, 0x7f)))).toBe('frame_too_large');
    // HEAD over the JSON limit but under the DATA limit: refused once the kind byte says HEAD.
    const jsonLen = DEFAULT_FRAME_LIMITS.maxJsonBytes + 1;
    const jb = [(jsonLen & 0x7f) | 0x80, ((jsonLen >>> 7) & 0x7f) | 0x80, jsonLen >>> 14];
    const d2 = new FrameDecoder();
    expect(d2.push(Uint8Array.from(jb))).toEqual([]);
    expect(codeOf(() => d2.push(Uint8Array.of(0x01)))).toBe('frame_too_large');
    // The same length is fine for DATA.
    expect(new FrameDecoder().push(Uint8Array.from([...jb, 0x02]))).toEqual([]);
  });

  it('firstKind: a first frame of another kind is refused at its kind byte, a first length over that kind\'s limit at the length; later frames as usual', () => {
    const first = () => new FrameDecoder(undefined, { firstKind: 'head' });
    // A 512 KiB DATA frame announced first: refused at its kind byte, none of its payload waited for.
    const d = first();
    expect(d.push(Uint8Array.of(0x80, 0x80, 0x20))).toEqual([]);
    expect(codeOf(() => d.push(Uint8Array.of(0x02)))).toBe('frame_malformed');
    expect(() => first().push(raw(0x03, enc.encode('{}')))).toThrow('expected a HEAD frame first, got TRAILER');
    // A first length over a HEAD's limit (under a DATA frame's): refused from the varint alone.
    const jsonLen = DEFAULT_FRAME_LIMITS.maxJsonBytes + 1;
    expect(codeOf(() => first().push(Uint8Array.of((jsonLen & 0x7f) | 0x80, ((jsonLen >>> 7) & 0x7f) | 0x80, jsonLen >>> 14)))).toBe('frame_too_large');
    // A HEAD first, then DATA of any size the limits allow, and the rest of a stream as ever.
    const ok = first();
    const big = new Uint8Array(DEFAULT_FRAME_LIMITS.maxJsonBytes + 1);
    expect(ok.push(concat([encodeHead({ a: 1 }), encodeData(big), encodeTrailer({})])).map((f) => f.kind)).toEqual(['head', 'data', 'trailer']);
    expect(ok.buffered).toBe(0);
    // (without the option, any kind may come first)
    expect(new FrameDecoder().push(encodeData(Uint8Array.of(1)))).toHaveLength(1);
  });

  it('honours configured limits', () => {
    const d = new FrameDecoder({ maxDataBytes: 16, maxJsonBytes: 8 });
    expect(d.push(encodeData(new Uint8Array(16)))).toHaveLength(1);
    expect(codeOf(() => d.push(encodeData(new Uint8Array(17))))).toBe('frame_too_large');
    const d2 = new FrameDecoder({ maxJsonBytes: 8 });
    expect(d2.push(encodeHead({ a: 1 }))).toHaveLength(1); // {"a":1}: 7 bytes
    expect(codeOf(() => d2.push(encodeTrailer({ a: 'bc' })))).toBe('frame_too_large'); // 10 bytes
  });

  it('stays failed after an error', () => {
    const d = new FrameDecoder();
    expect(codeOf(() => d.push(raw(0x09, new Uint8Array(0))))).toBe('frame_malformed');
    expect(codeOf(() => d.push(encodeHead({})))).toBe('frame_malformed');
    expect(codeOf(() => d.end())).toBe('frame_malformed');
  });

  it('a frame error anywhere in random garbage never escapes as anything but FrameError', () => {
    const rand = prng(7);
    for (let i = 0; i < 2000; i++) {
      const bytes = Uint8Array.from({ length: 1 + Math.floor(rand() * 64) }, () => Math.floor(rand() * 256));
      const d = new FrameDecoder({ maxDataBytes: 1 << 16, maxJsonBytes: 1 << 12 });
      try {
        d.push(bytes);
        d.end();
      } catch (e) {
        expect(e).toBeInstanceOf(FrameError);
      }
    }
  });
});
