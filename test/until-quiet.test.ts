// untilQuiet: a stopping node waits until its protocols have been idle for a while (the last
// answers' trailers read) before its connections close, and no longer than its bound.
import { expect, test } from 'vitest';
import { untilQuiet } from '../src/p2p/request-server.ts';

test('idle since long ago: quiet at once; an exchange just ended: quiet only once quietMs have passed since it', async () => {
  expect(await untilQuiet([{ inFlight: 0, lastEnded: 0 }], 200, 2000)).toBe(true);
  const ended = performance.now();
  expect(await untilQuiet([{ inFlight: 0, lastEnded: 0 }, { inFlight: 0, lastEnded: ended }], 50, 2000)).toBe(true);
  expect(performance.now() - ended).toBeGreaterThanOrEqual(50);
});

test('a server that stays busy: not quiet, given up after maxMs; one that becomes idle meanwhile: quiet', async () => {
  expect(await untilQuiet([{ inFlight: 0, lastEnded: 0 }, { inFlight: 1, lastEnded: 0 }], 10, 50)).toBe(false);
  const busy = { inFlight: 1, lastEnded: 0 };
  setTimeout(() => Object.assign(busy, { inFlight: 0, lastEnded: performance.now() }), 20);
  expect(await untilQuiet([busy], 10, 2000)).toBe(true);
  expect(busy.inFlight).toBe(0);
});
