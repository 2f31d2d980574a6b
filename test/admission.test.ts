import { describe, expect, test } from 'vitest';
import { Admission, AdmissionError } from '../src/dispatch/admission.ts';

const code = (p: Promise<unknown>) => p.then(() => 'ok', (e: AdmissionError) => e.code);

describe('Admission', () => {
  test('slots run at once, the queue waits in order, the slot passes to the next', async () => {
    const a = new Admission({ slots: 2, queue: 2 });
    const r1 = await a.acquire();
    const r2 = await a.acquire();
    expect(a.inUse).toBe(2);
    const order: number[] = [];
    const w3 = a.acquire({ maxWaitMs: 5000 }).then((r) => (order.push(3), r));
    const w4 = a.acquire({ maxWaitMs: 5000 }).then((r) => (order.push(4), r));
    expect(a.queued).toBe(2);
    expect(await code(a.acquire({ maxWaitMs: 5000 }))).toBe('queue_full');
    r1();
    r1(); // releasing twice is harmless
    const r3 = await w3;
    r2();
    const r4 = await w4;
    expect(order).toEqual([3, 4]);
    expect(a.inUse).toBe(2);
    r3();
    r4();
    expect(a.inUse).toBe(0);
  });

  test('a request that cannot start within its wait is refused; 0 means now or never', async () => {
    const a = new Admission({ slots: 1, queue: 5 });
    const r = await a.acquire();
    expect(await code(a.acquire({ maxWaitMs: 0 }))).toBe('admission_timeout');
    const t0 = Date.now();
    expect(await code(a.acquire({ maxWaitMs: 50 }))).toBe('admission_timeout');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(45);
    expect(a.queued).toBe(0);
    r();
    expect(await code(a.acquire({ maxWaitMs: 0 }))).toBe('ok');
  });

  test('an abandoned waiter leaves the queue and never takes a slot', async () => {
    const a = new Admission({ slots: 1, queue: 5 });
    const r = await a.acquire();
    const ac = new AbortController();
    const w = a.acquire({ maxWaitMs: 60_000, signal: ac.signal });
    ac.abort();
    expect(await code(w)).toBe('aborted');
    expect(a.queued).toBe(0);
    r();
    expect(a.inUse).toBe(0);
    const already = new AbortController();
    already.abort();
    expect(await code(a.acquire({ signal: already.signal }))).toBe('aborted');
  });

  test('close refuses waiting and new requests; running ones still release', async () => {
    const a = new Admission({ slots: 1, queue: 5 });
    const r = await a.acquire();
    const w = a.acquire({ maxWaitMs: 60_000 });
    a.close();
    expect(await code(w)).toBe('closed');
    expect(await code(a.acquire())).toBe('closed');
    r();
    expect(a.inUse).toBe(0);
  });

  test('a request that names no wait gets the default: none unless configured, then queued up to it', async () => {
    const now = new Admission({ slots: 1, queue: 5 });
    const held = await now.acquire();
    expect(await code(now.acquire())).toBe('admission_timeout');
    held();
    const queued = new Admission({ slots: 1, queue: 5, defaultMaxWaitMs: 10_000 });
    const first = await queued.acquire();
    const waiting = queued.acquire(); // no wait of its own: queued under the default
    expect(queued.queued).toBe(1);
    expect(await code(queued.acquire({ maxWaitMs: 0 }))).toBe('admission_timeout'); // its own bound wins
    first();
    const second = await waiting;
    expect(queued.inUse).toBe(1);
    second();
  });

  test('the default wait bounds a request that names none: it times out, and leaves the queue', async () => {
    const short = new Admission({ slots: 1, queue: 5, defaultMaxWaitMs: 20 });
    const held = await short.acquire();
    expect(await code(short.acquire())).toBe('admission_timeout'); // nothing frees the slot: only the default can end the wait
    expect(short.queued).toBe(0);
    held();
  });

  test('bad limits are refused', () => {
    expect(() => new Admission({ slots: 0, queue: 1 })).toThrow(RangeError);
    expect(() => new Admission({ slots: 1, queue: -1 })).toThrow(RangeError);
    expect(() => new Admission({ slots: 1, queue: 1, defaultMaxWaitMs: -1 })).toThrow(RangeError);
    expect(() => new Admission({ slots: 1, queue: 1, defaultMaxWaitMs: Number.NaN })).toThrow(RangeError);
  });
});
