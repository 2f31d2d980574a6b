// The response writer's `sent` mode (src/p2p/response-writer.ts), which streamed tokens use: their
// bytes count as delivered (billed, hashed) only once they were handed to the stream, never while
// they sit in the cork, and never when the writer gave up waiting for room before queueing them.
import { describe, expect, test } from 'vitest';
import type { Stream } from '@libp2p/interface';
import { CORK_BYTES, StreamResponseWriter } from '../src/p2p/response-writer.ts';
import { FrameDecoder } from '../src/p2p/frames.ts';
import { track } from './helpers/wait.ts';

/** The parts of a libp2p stream the writer touches, with every send recorded. */
class FakeStream extends EventTarget {
  writeStatus = 'writable';
  status = 'open';
  writableNeedsDrain = false;
  readonly sent: Uint8Array[] = [];

  send(bytes: Uint8Array): boolean {
    if (this.writeStatus !== 'writable') throw new Error('the stream is not writable');
    this.sent.push(bytes);
    return !this.writableNeedsDrain;
  }

  async close(): Promise<void> {
    this.writeStatus = 'closed';
  }

  /** The buyer resets the stream. */
  reset(): void {
    this.writeStatus = 'closed';
    this.status = 'reset';
    this.dispatchEvent(Object.assign(new Event('close'), { error: new Error('reset by the buyer') }));
  }

  drain(): void {
    this.writableNeedsDrain = false;
    this.dispatchEvent(new Event('drain'));
  }

  /** Every byte sent so far, in order. */
  bytes(): string {
    return Buffer.concat(this.sent).toString('latin1');
  }
}

const text = (s: string) => new TextEncoder().encode(s);
const nextTurn = () => new Promise((r) => setImmediate(r));
/** Runs queued promise callbacks, but not the next turn of the event loop (where the cork is flushed). */
async function microtasks(): Promise<void> {
  for (let i = 0; i < 20; i++) await Promise.resolve();
}

async function writerWithHead(stream = new FakeStream(), ac = new AbortController()) {
  const w = new StreamResponseWriter(stream as unknown as Stream, ac.signal);
  await w.head({ status: 200 });
  return { w, stream, ac };
}

describe('StreamResponseWriter.data(bytes, { sent: true })', () => {
  test('resolves only once the bytes were handed to the stream, not when they are queued', async () => {
    const { w, stream } = await writerWithHead();
    const plain = track(w.data(text('queued')));
    const sent = track(w.data(text('billed'), { sent: true }));
    await microtasks();
    expect(stream.bytes()).not.toContain('billed'); // still in the cork
    expect(plain.settled()).toBe(true); // a plain write resolves once queued
    expect(sent.settled()).toBe(false);
    await sent.p;
    expect(stream.bytes()).toContain('queued');
    expect(stream.bytes()).toContain('billed');
  });

  test('a buyer who resets while the bytes sit in the cork: the write rejects and the bytes were never sent', async () => {
    const { w, stream } = await writerWithHead();
    const plain = track(w.data(text('first')));
    const sent = w.data(text('second'), { sent: true });
    await microtasks();
    expect(plain.settled()).toBe(true); // resolved, though it is about to be lost with the cork
    stream.reset(); // before the flush at the next turn
    await expect(sent).rejects.toMatchObject({ code: 'stream_reset' });
    expect(stream.bytes()).not.toContain('second');
  });

  test('waits for room before queueing: a buyer who leaves meanwhile gets nothing more, and the bytes stay unsent', async () => {
    const { w, stream, ac } = await writerWithHead();
    await nextTurn(); // the HEAD is out
    stream.writableNeedsDrain = true;
    const sent = track(w.data(text('late'), { sent: true }));
    await nextTurn();
    await nextTurn();
    expect(sent.settled()).toBe(false);
    ac.abort();
    await expect(sent.p).rejects.toMatchObject({ code: 'aborted' });
    stream.drain();
    await nextTurn();
    expect(stream.bytes()).not.toContain('late');
  });

  test('once the stream drains, the bytes are queued, sent and the write resolves', async () => {
    const { w, stream } = await writerWithHead();
    await nextTurn();
    stream.writableNeedsDrain = true;
    const sent = track(w.data(text('after-drain'), { sent: true }));
    await nextTurn();
    expect(stream.bytes()).not.toContain('after-drain');
    stream.drain();
    await sent.p;
    expect(stream.bytes()).toContain('after-drain');
  });

  test('bytes larger than the cork: resolves after the last of their frames went out, in order', async () => {
    const { w, stream } = await writerWithHead();
    const big = new Uint8Array(CORK_BYTES * 2 + 100).map((_, i) => i % 251);
    await w.data(big, { sent: true });
    // Every byte is out when it resolves: the DATA frames carry the whole body, in order.
    expect(Buffer.from(dataPayloads(stream.sent)).equals(Buffer.from(big))).toBe(true);
  });

  test('empty bytes resolve at once and send nothing', async () => {
    const { w, stream } = await writerWithHead();
    await nextTurn();
    const before = stream.sent.length;
    await w.data(new Uint8Array(0), { sent: true });
    await nextTurn();
    expect(stream.sent.length).toBe(before);
  });
});

/** The DATA frames' payloads of what was sent, concatenated. */
function dataPayloads(sent: Uint8Array[]): Uint8Array {
  const decoder = new FrameDecoder();
  const out: Uint8Array[] = [];
  for (const chunk of sent) for (const f of decoder.push(chunk)) if (f.kind === 'data') out.push(f.bytes);
  return Buffer.concat(out);
}
