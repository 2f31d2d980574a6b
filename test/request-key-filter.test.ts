// The request-key filter names the log segments a request id may be in, so that a lookup reads a
// segment or two, not the whole log (a peer can ask the log about ids it made up).
import { describe, expect, test } from 'vitest';
import { RequestKeyFilter, SEGMENT } from '../src/store/request-key-filter.ts';
import { requestKey } from '../src/store/log-writer.ts';

const keyOf = (i: number) => requestKey(`req-${i}`);

describe('RequestKeyFilter', () => {
  test('every key added is a candidate in its own segment (no false negatives), across segments and batch starts', () => {
    const f = new RequestKeyFilter(1000);
    // Batches of 7 receipts: a batch belongs to the segment its first seq is in, even when it runs past the segment's end.
    for (let seq = 0; seq < 5000; seq += 7) for (let i = seq; i < seq + 7; i++) f.add(seq, keyOf(i));
    for (let seq = 0; seq < 5000; seq += 7) {
      for (let i = seq; i < seq + 7; i++) {
        const segs = [...f.candidates(keyOf(i), 5005)].map(([from]) => from);
        expect(segs).toContain(Math.floor(seq / 1000) * 1000);
      }
    }
  });

  test('a key never added is a candidate nowhere, but for the rare false positive', () => {
    const f = new RequestKeyFilter();
    for (let i = 0; i < 4 * SEGMENT; i++) f.add(i - (i % 128), keyOf(i));
    let falsePositives = 0;
    for (let i = 0; i < 10_000; i++) falsePositives += [...f.candidates(requestKey(`made-up-${i}`), 4 * SEGMENT)].length;
    // 40,000 segment checks at ~1 in 2,000 each: about 20 (a filter that says yes to all would give 40,000).
    expect(falsePositives).toBeLessThan(100);
  });

  test('candidates stop below the given seq and clip the last range to it', () => {
    const f = new RequestKeyFilter(100);
    const k = keyOf(1);
    for (const first of [0, 100, 200, 300]) f.add(first, k);
    expect([...f.candidates(k, 250)]).toEqual([[0, 100], [100, 200], [200, 250]]);
    expect([...f.candidates(k, 0)]).toEqual([]);
  });

  test('a segment whose keys could not be read is a candidate for every key', () => {
    const f = new RequestKeyFilter(100);
    f.add(0, keyOf(1));
    f.addAll(100);
    expect([...f.candidates(requestKey('anything'), 200)]).toEqual([[100, 200]]);
    expect(() => new RequestKeyFilter(0)).toThrow(RangeError);
  });
});
