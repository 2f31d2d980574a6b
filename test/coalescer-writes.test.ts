// Coalescer (src/serve/coalescer.ts), the cases test/coalescer.test.ts leaves open: writes that are
// slow (one at a time, in order, tokens counted only once written), a write that fails when the
// window's timer flushes (nobody awaits that flush), what was queued behind a failed write, and
// tokens dropped by discard().
import { afterEach, describe, expect, test, vi } from 'vitest';
import { Coalescer } from '../src/serve/coalescer.ts';
import { settle, track } from './helpers/wait.ts';

/**
 * The coalescing window runs on a fake clock (setTimeout and performance.now), so "within the
 * window" holds however slow the machine is; promise turns (setImmediate) stay real.
 */
const fakeClock = () => vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
afterEach(() => {
  vi.useRealTimers();
});

const b = (s: string) => new TextEncoder().encode(s);
const dec = (x: Uint8Array) => new TextDecoder().decode(x);


/** A write side whose writes each wait until the test ends them. */
function slowWriter() {
  const started: string[] = [];
  const pending: { resolve: () => void; reject: (e: Error) => void }[] = [];
  let active = 0;
  let maxActive = 0;
  const write = (x: Uint8Array) =>
    new Promise<void>((resolve, reject) => {
      started.push(dec(x));
      active++;
      maxActive = Math.max(maxActive, active);
      pending.push({
        resolve: () => {
          active--;
          resolve();
        },
        reject: (e) => {
          active--;
          reject(e);
        },
      });
    });
  return { write, started, pending, maxActive: () => maxActive };
}

describe('Coalescer with a slow write side', () => {
  test('writes never overlap and keep their order; delivered counts only the writes that finished', async () => {
    const w = slowWriter();
    // windowMs 0: every push writes at once; the writes must still go one at a time.
    const c = new Coalescer(w.write, { windowMs: 0 });
    const first = c.push(b('a'), 1);
    const second = c.push(b('bc'), 2);
    const third = c.push(b('d'), 1);
    await settle();
    expect(w.started).toEqual(['a']); // the others wait for it
    expect(c.delivered).toBe(0);
    w.pending[0]!.resolve();
    await first;
    await settle();
    expect(c.delivered).toBe(1);
    expect(w.started).toEqual(['a', 'bc']);
    w.pending[1]!.resolve();
    await second;
    expect(c.delivered).toBe(3);
    const flushed = track(c.flush()); // resolves only when everything queued so far is written
    await settle();
    expect(flushed.settled()).toBe(false);
    expect(w.started).toEqual(['a', 'bc', 'd']);
    w.pending[2]!.resolve();
    await third;
    await flushed.p;
    expect(c.delivered).toBe(4);
    expect(w.maxActive()).toBe(1);
  });

  test('bytes pushed while a write is in flight go out together in the next write', async () => {
    fakeClock();
    const w = slowWriter();
    const c = new Coalescer(w.write, { windowMs: 1000 });
    const first = c.push(b('a'), 1); // the first goes at once
    await settle();
    void c.push(b('b'), 1);
    void c.push(b('c'), 1);
    const flushed = c.flush(); // both queued bytes join one write, after the first
    await settle();
    expect(w.started).toEqual(['a']);
    w.pending[0]!.resolve();
    await first;
    await settle();
    expect(w.started).toEqual(['a', 'bc']);
    w.pending[1]!.resolve();
    await flushed;
    expect(c.delivered).toBe(3);
  });
});

describe('Coalescer when the write side fails', () => {
  test('a write that fails in the timer\'s flush is recorded: the next push rejects with it, its tokens are not delivered', async () => {
    const writes: string[] = [];
    fakeClock();
    let calls = 0;
    const c = new Coalescer(
      async (x) => {
        calls++;
        if (calls === 2) throw new Error('stream reset');
        writes.push(dec(x));
      },
      { windowMs: 300 },
    );
    await c.push(b('a'), 1); // at once
    await c.push(b('b'), 2); // within the window: left to the timer, which nobody awaits
    expect(calls).toBe(1);
    await vi.advanceTimersByTimeAsync(300); // the timer flushes
    expect(calls).toBe(2);
    await settle();
    // The failure did not escape as an unhandled rejection (vitest fails the run on one): it waits here.
    await expect(c.push(b('c'), 1)).rejects.toThrow('stream reset');
    await expect(c.flush()).rejects.toThrow('stream reset');
    expect(writes).toEqual(['a']);
    expect(c.delivered).toBe(1);
    expect(calls).toBe(2); // nothing written after the failure
  });

  test('what was queued behind a failed write is never written, and every later flush rejects with the first error', async () => {
    const w = slowWriter();
    const c = new Coalescer(w.write, { windowMs: 0 });
    const first = c.push(b('a'), 1);
    const second = c.push(b('b'), 1); // queued behind the first write
    await settle();
    expect(w.started).toEqual(['a']);
    w.pending[0]!.reject(new Error('buyer gone'));
    await expect(first).rejects.toThrow('buyer gone');
    await expect(second).rejects.toThrow('buyer gone');
    await settle();
    expect(w.started).toEqual(['a']); // 'b' never reached the write side
    expect(c.delivered).toBe(0);
    await expect(c.flush()).rejects.toThrow('buyer gone');
    await expect(c.push(b('c'), 1)).rejects.toThrow('buyer gone');
    await expect(c.flush()).rejects.toThrow('buyer gone');
    expect(w.started).toEqual(['a']);
  });
});

describe('Coalescer.discard', () => {
  test('tokens dropped by discard() are not counted with the next write, and the timer does not write them', async () => {
    fakeClock();
    const writes: string[] = [];
    const c = new Coalescer(async (x) => void writes.push(dec(x)), { windowMs: 300 });
    await c.push(b('a'), 1); // at once
    await c.push(b('held'), 3); // left to the timer
    await c.push(b(''), 2); // tokens whose text is not out yet
    c.discard();
    await vi.advanceTimersByTimeAsync(400); // past the window: the discarded bytes stay unwritten
    expect(writes).toEqual(['a']);
    expect(c.delivered).toBe(1);
    await c.push(b('z'), 1);
    await c.flush();
    expect(writes).toEqual(['a', 'z']);
    expect(c.delivered).toBe(2); // 1 + 1, not 1 + 5 + 1
  });
});
