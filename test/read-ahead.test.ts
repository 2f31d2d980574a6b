import { describe, expect, test } from 'vitest';
import { readAhead } from '../src/serve/read-ahead.ts';
import { until } from './helpers/wait.ts';

/** A source that records how far it ran and whether its finally ran. */
function source(n: number, opts: { failAt?: number } = {}) {
  const state = { produced: 0, closed: 0 };
  async function* gen(): AsyncGenerator<number, string, void> {
    try {
      for (let i = 0; i < n; i++) {
        await new Promise((r) => setImmediate(r));
        if (i === opts.failAt) throw new Error(`failed at ${i}`);
        state.produced++;
        yield i;
      }
      return 'done';
    } finally {
      state.closed++;
    }
  }
  return { gen: gen(), state };
}

async function drain<T, R>(g: AsyncGenerator<T, R, void>): Promise<{ items: T[]; value: R }> {
  const items: T[] = [];
  for (;;) {
    const r = await g.next();
    if (r.done) return { items, value: r.value };
    items.push(r.value);
  }
}

describe('readAhead', () => {
  test('yields every item in order and the return value; the source is closed once', async () => {
    const s = source(50);
    const { items, value } = await drain(readAhead(s.gen, 4));
    expect(items).toEqual(Array.from({ length: 50 }, (_, i) => i));
    expect(value).toBe('done');
    expect(s.state.closed).toBe(1);
  });

  test('runs ahead of a slow consumer, but never more than depth items', async () => {
    const s = source(100);
    const g = readAhead(s.gen, 5);
    expect((await g.next()).value).toBe(0);
    await until('the producer to fill the queue', () => s.state.produced >= 6);
    // Then a while longer, in which an unbounded producer would run on: one taken, five queued, no more.
    await new Promise((r) => setTimeout(r, 50));
    expect(s.state.produced).toBe(6);
    await g.return('stopped');
    expect(s.state.closed).toBe(1);
    expect(s.state.produced).toBe(6);
  });

  test('a consumer that stops early closes the source after its current step', async () => {
    const s = source(1000);
    const g = readAhead(s.gen, 8);
    let seen = 0;
    for await (const x of g) {
      seen++;
      if (x === 9) break;
    }
    expect(seen).toBe(10);
    expect(s.state.closed).toBe(1);
    expect(s.state.produced).toBeLessThanOrEqual(10 + 8);
  });

  test('an error in the source reaches the consumer after the items before it', async () => {
    const s = source(10, { failAt: 3 });
    const g = readAhead(s.gen, 4);
    const got: number[] = [];
    await expect((async () => {
      for await (const x of g) got.push(x);
    })()).rejects.toThrow('failed at 3');
    expect(got).toEqual([0, 1, 2]);
    expect(s.state.closed).toBe(1);
  });

  test('an error thrown into the consumer closes the source', async () => {
    const s = source(100);
    const g = readAhead(s.gen, 2);
    await g.next();
    await expect(g.throw(new Error('buyer left'))).rejects.toThrow('buyer left');
    expect(s.state.closed).toBe(1);
  });

  test('a reader closed before its first next() never starts the source', async () => {
    const s = source(10);
    const g = readAhead(s.gen, 4);
    await new Promise((r) => setTimeout(r, 20));
    await g.return('never read');
    expect(s.state.produced).toBe(0);
  });

  test('depth must be a positive integer', () => {
    expect(() => readAhead(source(1).gen, 0)).toThrow(RangeError);
    expect(() => readAhead(source(1).gen, 1.5)).toThrow(RangeError);
  });
});
