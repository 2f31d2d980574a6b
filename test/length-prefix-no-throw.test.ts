// Noise's length-prefixed message reader, patched not to end each read with an exception: the
// same messages come out however the bytes are cut, and an empty buffer no longer reaches the
// prefix reader (which throws on it).
import { LengthPrefixedDecoder } from '@libp2p/utils';
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, test, vi } from 'vitest';
import { lengthPrefixWithoutThrow } from '../src/p2p/length-prefix-no-throw.ts';

/** Noise's framing: a 2-byte big-endian length, then the message. */
function frame(...messages: number[][]): Uint8Array {
  const out: number[] = [];
  for (const m of messages) out.push(m.length >> 8, m.length & 0xff, ...m);
  return Uint8Array.from(out);
}

/** A uint16 prefix reader that throws on too few bytes, as noise's does; counts the throws. */
function reader() {
  const r = {
    throws: 0,
    read: (data: { byteLength: number; get(i: number): number }): number => {
      if (data.byteLength < 2) {
        r.throws++;
        throw new RangeError('Could not decode int16BE');
      }
      return (data.get(0) << 8) | data.get(1);
    },
  };
  return r;
}

function decodeAll(chunks: Uint8Array[], read: ReturnType<typeof reader>['read']): number[][] {
  const d = new LengthPrefixedDecoder({ lengthDecoder: read as never, encodingLength: () => 2, maxBufferSize: 1 << 20 });
  const out: number[][] = [];
  for (const c of chunks) for (const m of d.decode(c)) out.push([...m.subarray()]);
  return out;
}

describe('lengthPrefixWithoutThrow', () => {
  const messages = [[1, 2, 3], [4], Array.from({ length: 300 }, (_, i) => i & 0xff), [5, 6]];
  const bytes = frame(...messages);
  const cuts: [string, Uint8Array[]][] = [
    ['one read', [bytes]],
    ['a read per message', [frame(messages[0]!), frame(messages[1]!), frame(messages[2]!), frame(messages[3]!)]],
    ['byte by byte', [...bytes].map((b) => Uint8Array.of(b))],
    ['a prefix split across reads', [bytes.subarray(0, 1), bytes.subarray(1, 6), bytes.subarray(6)]],
    ['with empty reads', [new Uint8Array(0), bytes.subarray(0, 7), new Uint8Array(0), bytes.subarray(7)]],
  ];

  test('the patch installs once and says so: a second call leaves the wrapped decode as it is', () => {
    expect(lengthPrefixWithoutThrow()).toBe(true);
    const wrapped = LengthPrefixedDecoder.prototype.decode;
    expect(lengthPrefixWithoutThrow()).toBe(true);
    expect(LengthPrefixedDecoder.prototype.decode).toBe(wrapped);
  });

  test.each(cuts)('the same messages, in order, however the bytes are cut: %s', (name, chunks) => {
    lengthPrefixWithoutThrow();
    const r = reader();
    expect(decodeAll(chunks, r.read)).toEqual(messages);
    // Reads that end on a message boundary never reach the throwing prefix reader.
    if (name === 'one read' || name === 'a read per message') expect(r.throws).toBe(0);
  });

  test('the decoder noise builds is the patched one (no second copy of @libp2p/utils under noise)', () => {
    // Node resolves noise's import from its own folder first: a nested copy there would be unpatched.
    const noise = path.join(process.cwd(), 'node_modules', '@chainsafe', 'libp2p-noise');
    expect(fs.existsSync(path.join(noise, 'package.json'))).toBe(true);
    expect(fs.existsSync(path.join(noise, 'node_modules', '@libp2p', 'utils'))).toBe(false);
  });

  test('a decoder class without decode() is left alone: false, nothing installed', async () => {
    class NoDecode {}
    vi.resetModules();
    vi.doMock('@libp2p/utils', () => ({ LengthPrefixedDecoder: NoDecode }));
    try {
      const fresh = await import('../src/p2p/length-prefix-no-throw.ts');
      expect(fresh.lengthPrefixWithoutThrow).not.toBe(lengthPrefixWithoutThrow);
      expect(fresh.lengthPrefixWithoutThrow()).toBe(false);
      expect(Reflect.ownKeys(NoDecode.prototype)).toEqual(['constructor']);
    } finally {
      vi.doUnmock('@libp2p/utils');
      vi.resetModules();
    }
  });

  test('a read that ends on a message boundary ends without asking the prefix reader about an empty buffer', () => {
    lengthPrefixWithoutThrow();
    const r = reader();
    decodeAll([frame(messages[0]!), frame(messages[1]!, messages[3]!)], r.read);
    expect(r.throws).toBe(0);
    // One byte of a prefix is still "too few bytes": the reader's own answer, as before.
    const partial = reader();
    expect(decodeAll([bytes.subarray(0, 6), bytes.subarray(6, 7)], partial.read)).toEqual([messages[0]]);
    expect(partial.throws).toBe(1);
  });

  test('a decoder whose prefix may be 0 bytes long keeps asking its own prefix reader about an empty buffer', () => {
    lengthPrefixWithoutThrow();
    const r = reader();
    const d = new LengthPrefixedDecoder({ lengthDecoder: r.read as never, encodingLength: (n: number) => (n === 0 ? 0 : 2), maxBufferSize: 1 << 20 });
    expect([...d.decode(Uint8Array.of(0, 1, 9))].map((m) => [...m.subarray()])).toEqual([[9]]);
    expect(r.throws).toBe(1); // the empty remainder reached the reader: not guarded
  });
});
