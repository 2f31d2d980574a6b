import { describe, expect, test } from 'vitest';
import { stopStep } from '../src/stop-step.ts';

function recorder() {
  const lines: { level: string; obj: Record<string, unknown>; msg: string | undefined }[] = [];
  return {
    lines,
    error: (obj: object, msg?: string) => void lines.push({ level: 'error', obj: obj as Record<string, unknown>, msg }),
    warn: (obj: object, msg?: string) => void lines.push({ level: 'warn', obj: obj as Record<string, unknown>, msg }),
  };
}

describe('stopStep', () => {
  test('a quick step logs nothing', async () => {
    const log = recorder();
    let ran = false;
    await stopStep(log, 'quick', () => void (ran = true), 1000);
    expect(ran).toBe(true);
    expect(log.lines).toEqual([]);
  });

  test('a slow step is reported by name while it runs, and still awaited to the end', async () => {
    const log = recorder();
    let release!: () => void;
    const work = new Promise<void>((r) => (release = r));
    let finished = false;
    const step = stopStep(log, 'receipt log', () => work, 20).then(() => (finished = true));
    await new Promise((r) => setTimeout(r, 60));
    expect(finished).toBe(false);
    expect(log.lines).toEqual([{ level: 'error', obj: { step: 'receipt log', after_ms: 20 }, msg: 'shutdown step still running' }]);
    release();
    await step;
    expect(finished).toBe(true);
    expect(log.lines).toHaveLength(1);
  });

  test('a failing step is logged, not thrown, so the next steps run', async () => {
    const log = recorder();
    const order: string[] = [];
    await stopStep(log, 'first', () => {
      order.push('first');
      throw new Error('disk gone');
    });
    await stopStep(log, 'second', async () => void order.push('second'));
    expect(order).toEqual(['first', 'second']);
    expect(log.lines).toEqual([{ level: 'warn', obj: { step: 'first', err: 'disk gone' }, msg: 'shutdown step failed' }]);
  });

  test('a step whose promise rejects, with an Error or anything else, is logged the same way', async () => {
    const log = recorder();
    await stopStep(log, 'async', () => Promise.reject(new Error('socket gone')));
    await stopStep(log, 'odd', () => Promise.reject('not an Error'));
    expect(log.lines.map((l) => l.obj)).toEqual([
      { step: 'async', err: 'socket gone' },
      { step: 'odd', err: 'not an Error' },
    ]);
  });

  test('a slow step that then fails is reported twice: still running, then failed', async () => {
    const log = recorder();
    await stopStep(log, 'slow', () => new Promise<void>((_, reject) => setTimeout(() => reject(new Error('gave up')), 60)), 20);
    expect(log.lines.map((l) => [l.level, l.msg])).toEqual([
      ['error', 'shutdown step still running'],
      ['warn', 'shutdown step failed'],
    ]);
  });
});
