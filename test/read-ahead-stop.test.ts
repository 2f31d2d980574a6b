// readAhead (src/serve/read-ahead.ts), the cases test/read-ahead.test.ts leaves open, on a source whose
// every step waits for the test to release it (so what is in flight when the consumer stops is known):
// a stop during a step of the source, a return() behind a pending next(), an error from the step in
// flight at a stop, an error on the very first step, and a source whose own cleanup fails.
import { describe, expect, test } from 'vitest';
import { readAhead } from '../src/serve/read-ahead.ts';
import { settle, track } from './helpers/wait.ts';


/**
 * A source whose step i (the computation of item i) waits until the test calls release(i), or
 * fail(i, error). Counts the steps started and finished, and how often its finally ran.
 */
function gatedSource(opts: { cleanupError?: Error } = {}) {
  const state = { started: 0, finished: 0, closed: 0 };
  const gates = new Map<number, { p: Promise<void>; resolve: () => void; reject: (e: Error) => void }>();
  const gate = (i: number) => {
    let g = gates.get(i);
    if (!g) {
      const d = { resolve: () => {}, reject: (_e: Error) => {} };
      const p = new Promise<void>((resolve, reject) => Object.assign(d, { resolve, reject }));
      g = { p, ...d };
      gates.set(i, g);
    }
    return g;
  };
  async function* gen(): AsyncGenerator<number, string, void> {
    try {
      for (let i = 0; ; i++) {
        state.started++;
        await gate(i).p;
        state.finished++;
        yield i;
      }
    } finally {
      state.closed++;
      if (opts.cleanupError) throw opts.cleanupError;
    }
  }
  return {
    gen: gen(),
    state,
    release: (i: number) => gate(i).resolve(),
    fail: (i: number, e: Error) => gate(i).reject(e),
  };
}

/** A reader 4 deep over a gated source, item 0 delivered and step 1 in flight. */
async function atStepOne(): Promise<{ s: ReturnType<typeof gatedSource>; g: AsyncGenerator<number, unknown, unknown> }> {
  const s = gatedSource();
  const g = readAhead(s.gen, 4);
  const first = g.next();
  s.release(0);
  expect(await first).toEqual({ value: 0, done: false });
  await settle();
  return { s, g };
}

describe('readAhead: stopping while the source is busy', () => {
  test('return() during a step of the source waits for that step, then closes the source once; its item is dropped', async () => {
    const { s, g } = await atStepOne();
    expect(s.state).toEqual({ started: 2, finished: 1, closed: 0 }); // step 1 in flight
    const stop = track(g.return('bye'));
    await settle();
    // The source is not cut in the middle of its step: return() waits, the source is not closed.
    expect(stop.settled()).toBe(false);
    expect(s.state.closed).toBe(0);
    s.release(1);
    expect(await stop.p).toEqual({ value: 'bye', done: true });
    // Step 1 finished, no step 2 was started, the finally ran once; item 1 never reaches anyone.
    expect(s.state).toEqual({ started: 2, finished: 2, closed: 1 });
    expect(await g.next()).toEqual({ value: undefined, done: true });
  });

  test('a return() behind a pending next() waits for it: the next gets its item, then the source is closed', async () => {
    const s = gatedSource();
    const g = readAhead(s.gen, 4);
    const next = track(g.next());
    const stop = track(g.return('bye'));
    await settle();
    expect(next.settled()).toBe(false);
    expect(stop.settled()).toBe(false);
    s.release(0);
    expect(await next.p).toEqual({ value: 0, done: false });
    // The producer went on to step 1 before the stop was seen: return() waits for that step too.
    await settle();
    expect(stop.settled()).toBe(false);
    expect(s.state.closed).toBe(0);
    s.release(1);
    expect(await stop.p).toEqual({ value: 'bye', done: true });
    expect(s.state).toEqual({ started: 2, finished: 2, closed: 1 });
  });

  test('an error from the step in flight when the consumer stopped is dropped: return() resolves, the source is closed once', async () => {
    const { s, g } = await atStepOne();
    const stop = track(g.return('bye'));
    await settle();
    s.fail(1, new Error('runtime failed after the buyer left'));
    // The consumer asked to stop: the failure has no one to go to, and is not raised.
    expect(await stop.p).toEqual({ value: 'bye', done: true });
    expect(s.state).toEqual({ started: 2, finished: 1, closed: 1 });
  });

  test('a throw() into the consumer during a step of the source also waits for the step, and rethrows the consumer\'s error', async () => {
    const { s, g } = await atStepOne();
    const thrown = track(g.throw(new Error('buyer left')));
    await settle();
    expect(thrown.settled()).toBe(false);
    s.fail(1, new Error('runtime failed too'));
    await expect(thrown.p).rejects.toThrow('buyer left'); // the consumer's own error, not the source's
    expect(s.state).toEqual({ started: 2, finished: 1, closed: 1 });
  });
  test('a source that is not an async generator (its return() acts at once) is still closed only after its current step', async () => {
    // An async generator queues return() behind a pending next() by itself; a hand-written iterator
    // does not, so here the wait comes from readAhead alone.
    const log: string[] = [];
    let finishStep: (() => void) | undefined;
    let i = 0;
    const source = {
      next: async (): Promise<IteratorResult<number, string>> => {
        const n = i++;
        log.push(`start ${n}`);
        if (n > 0) await new Promise<void>((r) => (finishStep = r));
        log.push(`end ${n}`);
        return { value: n, done: false };
      },
      return: async (v: string): Promise<IteratorResult<number, string>> => {
        log.push('return');
        return { value: v, done: true };
      },
      throw: async (e: unknown): Promise<IteratorResult<number, string>> => {
        throw e;
      },
      [Symbol.asyncIterator]() {
        return this;
      },
    } as AsyncGenerator<number, string, void>;
    const g = readAhead(source, 4);
    expect(await g.next()).toEqual({ value: 0, done: false });
    await settle();
    expect(log).toEqual(['start 0', 'end 0', 'start 1']);
    const stop = track(g.return('bye'));
    await settle();
    expect(stop.settled()).toBe(false);
    expect(log).toEqual(['start 0', 'end 0', 'start 1']); // not closed in the middle of step 1
    finishStep!();
    expect(await stop.p).toEqual({ value: 'bye', done: true });
    expect(log).toEqual(['start 0', 'end 0', 'start 1', 'end 1', 'return']);
  });
});

describe('readAhead: errors at the edges', () => {
  test('an error on the very first step reaches the first next(); the reader is finished after it', async () => {
    const s = gatedSource();
    const g = readAhead(s.gen, 3);
    const first = g.next();
    s.fail(0, new Error('prompt rejected by the runtime'));
    await expect(first).rejects.toThrow('prompt rejected by the runtime');
    expect(s.state).toEqual({ started: 1, finished: 0, closed: 1 });
    expect(await g.next()).toEqual({ value: undefined, done: true });
    expect(s.state.started).toBe(1); // the failed source is not asked again
  });

  test('the items read ahead before an error are all delivered, then the error, even if the consumer was slow', async () => {
    const s = gatedSource();
    const g = readAhead(s.gen, 4);
    const first = g.next();
    s.release(0);
    expect((await first).value).toBe(0);
    s.release(1);
    s.release(2);
    s.fail(3, new Error('out of memory'));
    await settle(); // the producer queued 1 and 2 and saw the failure, all before the consumer asked
    expect(s.state).toEqual({ started: 4, finished: 3, closed: 1 });
    expect(await g.next()).toEqual({ value: 1, done: false });
    expect(await g.next()).toEqual({ value: 2, done: false });
    await expect(g.next()).rejects.toThrow('out of memory');
    expect(await g.next()).toEqual({ value: undefined, done: true });
  });

  test('a failure in the source\'s own cleanup at an early stop reaches the consumer\'s return(); it runs once', async () => {
    const s = gatedSource({ cleanupError: new Error('slot could not be released') });
    const g = readAhead(s.gen, 2);
    const first = g.next();
    s.release(0);
    await first;
    s.release(1);
    s.release(2);
    await settle(); // the producer is paused: items 1 and 2 queued (depth 2), step 3 not started
    expect(s.state).toEqual({ started: 3, finished: 3, closed: 0 });
    await expect(g.return('bye')).rejects.toThrow('slot could not be released');
    expect(s.state).toEqual({ started: 3, finished: 3, closed: 1 });
  });
});
