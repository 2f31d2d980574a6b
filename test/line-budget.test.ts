// LineBudget: at most N lines a second of one kind; the rest counted and said once the next second begins.
import { describe, expect, test, vi } from 'vitest';
import { LineBudget } from '../src/ops/line-budget.ts';

describe('LineBudget', () => {
  test('N lines a second pass, the rest are held back and reported once, when the next second begins', () => {
    let t = 10_000;
    const reports: number[] = [];
    const budget = new LineBudget(3, (n) => reports.push(n), () => t);
    const take = () => budget.take();
    expect(Array.from({ length: 5 }, take)).toEqual([true, true, true, false, false]);
    expect(reports).toEqual([]);
    t += 999;
    expect(take()).toBe(false); // still the same second
    t += 1;
    expect(take()).toBe(true); // a new second: the three held back are said, once
    expect(reports).toEqual([3]);
    expect([take(), take(), take()]).toEqual([true, true, false]);
    t += 5000;
    expect(take()).toBe(true);
    expect(reports).toEqual([3, 1]);
    t += 1000;
    expect(take()).toBe(true);
    expect(reports).toEqual([3, 1]); // nothing held back: nothing said
  });

  test('tick() says what a burst held back once its second is over, with no line after it', () => {
    let t = 0;
    const reports: number[] = [];
    const budget = new LineBudget(1, (n) => reports.push(n), () => t);
    for (let i = 0; i < 4; i++) budget.take();
    budget.tick();
    expect(reports).toEqual([]); // the same second
    t += 1000;
    budget.tick();
    budget.tick();
    expect(reports).toEqual([3]); // once
  });

  test('the started timer says a burst that ended without another line', () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'Date'] });
    try {
      const reports: number[] = [];
      const budget = new LineBudget(1, (n) => reports.push(n));
      for (let i = 0; i < 3; i++) budget.take();
      budget.start(); // (after the burst began: its first tick comes a whole second after it)
      vi.advanceTimersByTime(999);
      expect(reports).toEqual([]);
      vi.advanceTimersByTime(1);
      expect(reports).toEqual([2]);
      vi.advanceTimersByTime(5000);
      expect(reports).toEqual([2]); // (said once)
      budget.stop();
      expect(vi.getTimerCount()).toBe(0); // (stop() clears its timer)
    } finally {
      vi.useRealTimers();
    }
  });

  test('stop() says what is held back at once, the second over or not, and only once', () => {
    const t = 0;
    const reports: number[] = [];
    const budget = new LineBudget(1, (n) => reports.push(n), () => t);
    budget.start();
    for (let i = 0; i < 4; i++) budget.take();
    budget.stop();
    budget.stop();
    expect(reports).toEqual([3]);
  });
});
