// The gateway's provider clock: silence for `ms` cuts a provider off; keepalives restart the clock
// only until `quietMaxMs` since the last frame with bytes; the reason said is the one that happened.
import { expect, test } from 'vitest';
import { IdleWatch } from '../src/gateway/idle-watch.ts';

const until = (ac: AbortController) => new Promise<void>((r) => (ac.signal.aborted ? r() : ac.signal.addEventListener('abort', () => r())));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('one keepalive, then silence: cut off as silent, not as "only keepalives" (s24 hA)', async () => {
  const ac = new AbortController();
  const w = new IdleWatch(ac, 100, 3000);
  await sleep(20);
  w.keepalive();
  await until(ac);
  expect(w.timedOut).toBe(true);
  expect(w.onlyKeepalives).toBe(false);
  expect((ac.signal.reason as Error).message).toBe('the provider sent nothing for 100 ms');
  w.stop();
});

test('keepalives and nothing else: kept past ms, then cut off once quietMaxMs has passed since the last real frame', async () => {
  const ac = new AbortController();
  const w = new IdleWatch(ac, 100, 400);
  const started = Date.now();
  const beat = setInterval(() => w.keepalive(), 20);
  await sleep(150);
  w.kick(); // a real frame: the quiet time starts again
  const kicked = Date.now();
  await until(ac);
  clearInterval(beat);
  expect(w.timedOut).toBe(true);
  expect(w.onlyKeepalives).toBe(true);
  expect((ac.signal.reason as Error).message).toBe('the provider sent only keepalives for 400 ms');
  expect(Date.now() - kicked).toBeGreaterThanOrEqual(395); // (never before the limit: keepalives kept it until then)
  expect(Date.now() - started).toBeGreaterThanOrEqual(545);
  w.stop();
});

test('a pause (the buyer slow to read) stops the clock; the quiet time starts again at resume', async () => {
  const ac = new AbortController();
  const w = new IdleWatch(ac, 60, 200);
  w.pause();
  await sleep(150);
  expect(w.timedOut).toBe(false);
  w.resume();
  const beat = setInterval(() => w.keepalive(), 10);
  await until(ac);
  clearInterval(beat);
  expect(w.onlyKeepalives).toBe(true);
  w.stop();
});
