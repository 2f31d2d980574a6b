// FrameReader's backpressure over real libp2p (yamux on loopback): a reader that falls behind pauses
// the stream, and the stream stays paused for the muxer too, however the pauses and resumes fall.
//
// The case that once broke it: the reader resumes (its queue drained) while the stream holds back
// more than the reader's high-water mark. libp2p's resume() delivers those bytes, the reader pauses
// again while they are delivered, and resume() then re-enabled yamux's window updates: the stream
// read as paused while yamux granted the sender window after window, until the stream's read buffer
// overflowed and libp2p aborted it ("Read buffer length ... exceeded limit"). A gateway relaying to
// a buyer slow to read saw exactly that on a long stream.
import { StreamState } from '@chainsafe/libp2p-yamux/stream';
import type { Stream } from '@libp2p/interface';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { FrameReader, writeBytes } from '../src/p2p/frame-io.ts';
import { encodeData } from '../src/p2p/frames.ts';
import { createHost, type Host } from '../src/p2p/host.ts';
import { until } from './helpers/wait.ts';

const PROTO = '/test/frame-reader-backpressure/1.0.0';
const FRAME = 16 * 1024;
/** The frames the server sends: 24 MiB, several of the largest yamux windows (4 MiB on these hosts). */
const FRAMES = 1536;
const HIGH_WATER = 64 * 1024;

/** The yamux fields read here (private in the types) and the stream's held-back bytes. */
interface YamuxView {
  state: StreamState;
  recvWindow: number;
  recvWindowCapacity: number;
  readBuffer: { byteLength: number };
}

let server: Host;
let client: Host;

beforeAll(async () => {
  server = await createHost({ seed: new Uint8Array(32).fill(91), listen: ['/ip4/127.0.0.1/tcp/0'] });
  client = await createHost({ seed: new Uint8Array(32).fill(92), listen: [] });
  // Each request: FRAMES DATA frames of FRAME bytes (byte i of frame k is (k + i) % 251), then close.
  await server.handle(PROTO, async (stream) => {
    try {
      for (let k = 0; k < FRAMES; k++) await writeBytes(stream, encodeData(frameBytes(k)));
      await stream.close();
    } catch (e) {
      stream.abort(e as Error);
    }
  });
});

afterAll(async () => {
  await client?.stop();
  await server?.stop();
});

function frameBytes(k: number): Uint8Array {
  const b = new Uint8Array(FRAME);
  for (let i = 0; i < FRAME; i++) b[i] = (k + i) % 251;
  return b;
}

async function open(): Promise<{ stream: Stream; y: YamuxView; reader: FrameReader }> {
  const stream = await client.dialProtocol(server.getMultiaddrs()[0]!, PROTO);
  return { stream, y: stream as unknown as YamuxView, reader: new FrameReader(stream, { highWaterMark: HIGH_WATER }) };
}

/** Waits until the stream's held-back bytes stop growing (the sender has spent its credit): three equal readings in a row. */
async function heldWhenStill(y: YamuxView): Promise<number> {
  let last = -1;
  for (let same = 0; same < 3; ) {
    await new Promise((r) => setTimeout(r, 150));
    same = y.readBuffer.byteLength === last ? same + 1 : 0;
    last = y.readBuffer.byteLength;
  }
  return last;
}

describe('FrameReader: an aborted stream', () => {
  test('the error names why the stream was aborted (libp2p fires end before the close that carries the reason)', async () => {
    const { stream, reader } = await open();
    expect((await reader.next())?.kind).toBe('data');
    stream.abort(new Error('the buyer went away'));
    // Frames decoded before the abort are still read; then the error.
    const error = await (async () => {
      // An end without an error (next() giving null) must fail the test, not spin.
      for (let f = await reader.next(); f; f = await reader.next());
      throw new Error('the reader ended without an error');
    })().catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'stream_reset', message: 'stream aborted: the buyer went away' });
  });
});

describe('FrameReader: a paused stream stays paused for the muxer', () => {
  test('resumed while the stream holds back more than the high-water mark, the reader pauses again and yamux withholds window updates: the held-back bytes stay within one window', async () => {
    const { stream, y, reader } = await open();
    // The reader falls behind at once: its queue passes the mark, the stream pauses, the sender
    // spends its credit and the rest of that window waits in the stream's read buffer.
    await until('the stream to pause', () => stream.readStatus === 'paused');
    expect(y.state).toBe(StreamState.Paused);
    const held = await heldWhenStill(y);
    expect(held).toBeGreaterThan(HIGH_WATER); // premise: a resume will deliver more than the mark

    let read = 0;
    let maxHeld = 0;
    let resumesWithBacklog = 0;
    // Read slowly: drain the queue to the resume point, then stop and let the sender do its worst.
    while (read < FRAMES) {
      const wasPaused = stream.readStatus === 'paused';
      const heldBefore = y.readBuffer.byteLength;
      const f = await reader.next();
      expect(f?.kind).toBe('data');
      if (f?.kind !== 'data') break;
      expect(Buffer.from(f.bytes.buffer, f.bytes.byteOffset, f.bytes.byteLength).equals(frameBytes(read)), `frame ${read} intact`).toBe(true);
      read++;
      if (wasPaused && stream.readStatus === 'paused' && heldBefore > HIGH_WATER) {
        // This next() resumed the stream and the backlog paused it again.
        resumesWithBacklog++;
        expect(y.state, 'paused for the reader, so paused for yamux').toBe(StreamState.Paused);
        if (resumesWithBacklog <= 3) {
          // Let the sender try: it can spend at most the credit it had, and no window update
          // adds to that credit while the stream is paused.
          const credit = y.recvWindowCapacity;
          maxHeld = Math.max(maxHeld, await heldWhenStill(y));
          expect(y.recvWindowCapacity, 'no window update while paused').toBeLessThanOrEqual(credit);
        }
      }
      maxHeld = Math.max(maxHeld, y.readBuffer.byteLength);
    }
    expect(read).toBe(FRAMES);
    expect(await reader.next()).toBeNull();
    // The premise of the case: resumes that delivered a backlog larger than the mark happened.
    expect(resumesWithBacklog).toBeGreaterThan(0);
    // Never more held back than one full window (yamux's largest on these hosts: 4 MiB) plus the
    // frame in flight; with window updates leaking through, the sender would have sent it all.
    expect(maxHeld).toBeLessThanOrEqual(4 * 1024 * 1024 + FRAME + 64);
    expect(stream.status).not.toBe('aborted');
  });
});

describe('FrameReader: a paused stream whose remote has gone', () => {
  test('what the stream held back is still read, then the end: a node that answered in full and then stopped (s29 review: resume() threw on the closed stream and the answer was lost)', async () => {
    const PROTO2 = '/test/frame-reader-gone/1.0.0';
    const gone = await createHost({ seed: new Uint8Array(32).fill(93), listen: ['/ip4/127.0.0.1/tcp/0'] });
    const COUNT = 8; // 128 KiB: within yamux's first window, so all of it reaches the paused stream
    let sent!: () => void;
    const allSent = new Promise<void>((resolve) => (sent = resolve));
    await gone.handle(PROTO2, async (stream) => {
      for (let k = 0; k < COUNT; k++) await writeBytes(stream, encodeData(frameBytes(k)));
      await stream.close();
      sent();
    });
    const stream = await client.dialProtocol(gone.getMultiaddrs()[0]!, PROTO2);
    const y = stream as unknown as YamuxView;
    const reader = new FrameReader(stream, { highWaterMark: HIGH_WATER });
    await until('the stream to pause', () => stream.readStatus === 'paused');
    await allSent;
    await heldWhenStill(y);
    expect(y.readBuffer.byteLength).toBeGreaterThan(0); // (the premise: the paused stream holds the rest)
    await gone.stop(); // (the connection closes under the paused stream)
    await until('the stream to close', () => stream.status !== 'open');
    let read = 0;
    for (let f = await reader.next(); f; f = await reader.next()) {
      expect(f.kind).toBe('data');
      if (f.kind !== 'data') break;
      expect(Buffer.from(f.bytes.buffer, f.bytes.byteOffset, f.bytes.byteLength).equals(frameBytes(read)), `frame ${read} intact`).toBe(true);
      read++;
    }
    expect(read).toBe(COUNT);
  });
});
