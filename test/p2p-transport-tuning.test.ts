// The host's transport tuning, on real libp2p over loopback: a Noise message leaves in one socket
// write (corked), and yamux tops a stream's receive window up only once half of it is spent, while
// large transfers still flow.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Connection, Stream } from '@libp2p/interface';
import { corkConnectionWrites } from '../src/p2p/cork-writes.ts';
import { halfWindowUpdates } from '../src/p2p/yamux-window-updates.ts';
import { readBytes, spyOnSocket, startBlastPair } from './helpers/socket-spy.ts';
import { until } from './helpers/wait.ts';

/** Requests "<count> <size>": count messages of size bytes, one per turn. */
let pair: Awaited<ReturnType<typeof startBlastPair>>;
beforeAll(async () => {
  pair = await startBlastPair('/test/tuning/1.0.0', 71, { turnEach: true });
});
afterAll(async () => {
  await pair?.stop();
});

async function openStream(): Promise<{ stream: Stream; conn: Connection }> {
  const { stream, conn } = await pair.open();
  // One round trip first, so the stream is established on both sides before anything is counted.
  stream.send(new TextEncoder().encode('1 10'));
  expect(await readBytes(stream, 10)).toBe(10);
  return { stream, conn };
}

describe('transport tuning', () => {
  it('a Noise message (length prefix and ciphertext) leaves in one socket write', async () => {
    const { stream, conn } = await openStream();
    const spy = spyOnSocket(conn);
    try {
      for (let i = 0; i < 5; i++) stream.send(new TextEncoder().encode('0 0'));
      await until('the five messages to be written', () => spy.writes >= 5);
      expect(spy.writes).toBe(5);
    } finally {
      spy.restore();
      await stream.close();
    }
  });

  it('corking is applied once per connection and refused for a connection without a TCP socket', async () => {
    const { stream, conn } = await openStream();
    try {
      // The host corked this connection when it opened: corking it again is a no-op that says so.
      const sendData = (conn as unknown as { maConn: { sendData: unknown } }).maConn.sendData;
      expect(corkConnectionWrites(conn)).toBe(true);
      expect((conn as unknown as { maConn: { sendData: unknown } }).maConn.sendData).toBe(sendData);
    } finally {
      await stream.close();
    }
    expect(corkConnectionWrites({} as Connection)).toBe(false);
    expect(corkConnectionWrites({ maConn: { socket: {} } } as unknown as Connection)).toBe(false);
  });

  it('small frames are received without a window update for each', async () => {
    expect(halfWindowUpdates()).toBe(true);
    const { stream, conn } = await openStream();
    const spy = spyOnSocket(conn);
    try {
      // 200 frames of 100 bytes: 20 KB, well under half of yamux's initial 256 KiB window.
      stream.send(new TextEncoder().encode('200 100'));
      expect(await readBytes(stream, 200 * 100)).toBe(200 * 100);
      expect(spy.writes).toBe(1); // the request itself, and no window update
    } finally {
      spy.restore();
      await stream.close();
    }
  });

  it('a transfer many windows long still flows: the window is topped up once half is spent', async () => {
    const { stream, conn } = await openStream();
    const spy = spyOnSocket(conn);
    try {
      // 12 MiB in 64 KiB messages: far more than the initial window, so updates must go out.
      stream.send(new TextEncoder().encode(`${12 * 16} ${64 * 1024}`));
      expect(await readBytes(stream, 12 * 1024 * 1024)).toBe(12 * 1024 * 1024);
      expect(spy.writes).toBeGreaterThan(1);
      // Far fewer updates than frames received (one per frame before).
      expect(spy.writes).toBeLessThan(12 * 16);
    } finally {
      spy.restore();
      await stream.close();
    }
  });
});
