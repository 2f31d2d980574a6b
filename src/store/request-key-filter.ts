// Which stored receipts may belong to a request id, without reading them all. The log keeps a
// 53-bit key per receipt (requestKey); receipts older than the in-memory index were found by
// reading every batch row, and a row's keys sit behind its payloads, so SQLite walked the whole
// log: 0.7–1.8 s of the event loop per lookup in a log of a million receipts, for any peer asking
// /service/log/1.0.0 about an id it made up. Here each segment of the log (the batch rows whose
// first seq falls in [s·SEGMENT, (s+1)·SEGMENT)) has a Bloom filter of its keys: a lookup reads
// only the segments whose filter may hold the key. 16 bits a key and 11 probes give about 1 false
// segment in 2,000; memory is 2 bytes a receipt. Filters are built when the log opens and kept up
// as receipts become durable; nothing is stored.

/** Receipts a segment covers, by the first seq of their batch. */
export const SEGMENT = 4096;
const BITS_PER_KEY = 16;
const PROBES = 11;
const TWO_32 = 2 ** 32;

export class RequestKeyFilter {
  readonly segment: number;
  private readonly bits: number;
  private readonly filters: (Uint8Array | undefined)[] = [];

  constructor(segment = SEGMENT) {
    if (!Number.isSafeInteger(segment) || segment < 1) throw new RangeError('segment must be a positive integer');
    this.segment = segment;
    this.bits = segment * BITS_PER_KEY;
  }

  /** Records the key of a receipt in the batch that starts at `firstSeq`. */
  add(firstSeq: number, key: number): void {
    const s = Math.floor(firstSeq / this.segment);
    const f = (this.filters[s] ??= new Uint8Array(this.bits / 8));
    const m = this.bits;
    let h = key % TWO_32;
    const step = (Math.floor(key / TWO_32) * 2 + 1) % m || 1;
    for (let i = 0; i < PROBES; i++) {
      const bit = h % m;
      f[bit >>> 3]! |= 1 << (bit & 7);
      h += step;
    }
  }

  /** Marks a segment as possibly holding every key (its keys could not be read). */
  addAll(firstSeq: number): void {
    this.filters[Math.floor(firstSeq / this.segment)] = new Uint8Array(this.bits / 8).fill(0xff);
  }

  /** The segments that start below `below` and may hold `key`, in order: [start, end) seq ranges of batch first seqs. */
  *candidates(key: number, below: number): Generator<[number, number]> {
    const m = this.bits;
    const start = key % TWO_32;
    const step = (Math.floor(key / TWO_32) * 2 + 1) % m || 1;
    const last = Math.min(this.filters.length, Math.ceil(below / this.segment));
    next: for (let s = 0; s < last; s++) {
      const f = this.filters[s];
      if (!f) continue;
      let h = start;
      for (let i = 0; i < PROBES; i++) {
        const bit = h % m;
        if ((f[bit >>> 3]! & (1 << (bit & 7))) === 0) continue next;
        h += step;
      }
      yield [s * this.segment, Math.min((s + 1) * this.segment, below)];
    }
  }
}
