import { EventEmitter } from 'node:events';
import { describe, expect, test } from 'vitest';
import { untilSignal, type SignalHost } from '../src/cli/until-signal.ts';

function fakeProcess() {
  const emitter = new EventEmitter();
  const out: string[] = [];
  const exits: number[] = [];
  const raised: string[] = [];
  const host: SignalHost & { signal(s: 'SIGTERM' | 'SIGINT' | 'SIGHUP'): void } = {
    on: (event, listener) => emitter.on(event, () => listener(event)),
    stderr: { write: (t: string) => out.push(t) },
    exit: (code: number) => void exits.push(code),
    raise: (signal: string) => void raised.push(signal),
    exitCode: undefined,
    signal: (s) => void emitter.emit(s),
  };
  return { host, out, exits, raised };
}

describe('untilSignal', () => {
  test('the first signal stops gracefully and resolves; the exit code is untouched', async () => {
    const { host, out, exits } = fakeProcess();
    let stopped = 0;
    const done = untilSignal('seller-node', 'stopping', async () => void stopped++, { host });
    host.signal('SIGTERM');
    await done;
    expect(stopped).toBe(1);
    expect(out).toEqual(['seller-node: SIGTERM: stopping\n']);
    expect(exits).toEqual([]);
    expect(host.exitCode).toBeUndefined();
  });

  test('SIGHUP (the terminal or ssh session closed) stops gracefully too', async () => {
    const { host, out, exits } = fakeProcess();
    let stopped = 0;
    const done = untilSignal('seller-node', 'stopping', async () => void stopped++, { host });
    host.signal('SIGHUP');
    await done;
    expect(stopped).toBe(1);
    expect(out).toEqual(['seller-node: SIGHUP: stopping\n']);
    expect(exits).toEqual([]);
  });

  test('a second signal while stopping ends the process at once by that signal (no exit: nothing torn down)', async () => {
    const { host, out, exits, raised } = fakeProcess();
    let finish!: () => void;
    void untilSignal('seller-node market', 'stopping', () => new Promise<void>((r) => (finish = r)), { host });
    host.signal('SIGINT');
    host.signal('SIGTERM');
    expect(out).toEqual(['seller-node market: SIGINT: stopping\n', 'seller-node market: SIGTERM again: exiting now\n']);
    expect(raised).toEqual(['SIGTERM']);
    expect(exits).toEqual([]);
    finish();
    // What must not be left behind is done first, synchronously; the signal follows even if it throws.
    const order: string[] = [];
    const second = fakeProcess();
    second.host.raise = (sig) => void order.push(`raise ${sig}`);
    void untilSignal('seller-node demo', 'stopping', () => new Promise<void>(() => {}), { host: second.host, beforeExitNow: () => {
      order.push('cleanup');
      throw new Error('cleanup failed');
    } });
    second.host.signal('SIGINT');
    expect(() => second.host.signal('SIGINT')).toThrow('cleanup failed');
    expect(order).toEqual(['cleanup', 'raise SIGINT']);
  });

  test('a signal after the stop has finished (the process winding down) exits at once with the stop\'s code, not 1', async () => {
    const { host, out, exits } = fakeProcess();
    const done = untilSignal('seller-node', 'stopping', async () => undefined, { host });
    host.signal('SIGTERM');
    await done;
    expect(exits).toEqual([]);
    host.signal('SIGTERM');
    expect(out).toEqual(['seller-node: SIGTERM: stopping\n', 'seller-node: SIGTERM: stopped already; exiting\n']);
    expect(exits).toEqual([0]);
    // ... and a failed stop's code, 1, after a failed stop.
    const failed = fakeProcess();
    const f = untilSignal('seller-node', 'stopping', () => Promise.reject(new Error('disk full')), { host: failed.host });
    failed.host.signal('SIGTERM');
    await f;
    failed.host.signal('SIGINT');
    expect(failed.exits).toEqual([1]);
  });

  test('a stop that fails says why and sets exit code 1', async () => {
    const { host, out, exits } = fakeProcess();
    const done = untilSignal('seller-node', 'flushing receipts', () => Promise.reject(new Error('disk full')), { host });
    host.signal('SIGTERM');
    await done;
    expect(out).toEqual(['seller-node: SIGTERM: flushing receipts\n', 'seller-node: stop failed: disk full\n']);
    expect(host.exitCode).toBe(1);
    expect(exits).toEqual([]);
  });

  test('nothing happens before a signal', async () => {
    const { host, out } = fakeProcess();
    let stopped = false;
    const done = untilSignal('x', 'stopping', async () => void (stopped = true), { host });
    const raced = await Promise.race([done.then(() => 'resolved'), new Promise((r) => setTimeout(() => r('pending'), 20))]);
    expect(raced).toBe('pending');
    expect(stopped).toBe(false);
    expect(out).toEqual([]);
  });
});
