// halfWindowUpdates() (src/p2p/yamux-window-updates.ts) in two ways:
//  - its decisions, on stand-in YamuxStream classes given to a fresh copy of the module through a mocked
//    '@chainsafe/libp2p-yamux/stream': left alone when the class lacks what the patch relies on, and
//    with the shape, when a window update is held back and when the original runs;
//  - on real libp2p over loopback (test/p2p-transport-tuning.test.ts covers small frames and a long
//    transfer): a paused stream still withholds every window update (backpressure), and resuming
//    sends one and lets the rest through.
// The mocks reach only the fresh copies: the real YamuxStream is patched as usual for the hosts below.
import { StreamState, YamuxStream } from '@chainsafe/libp2p-yamux/stream';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { halfWindowUpdates } from '../src/p2p/yamux-window-updates.ts';
import { readBytes, spyOnSocket, startBlastPair } from './helpers/socket-spy.ts';
import { until } from './helpers/wait.ts';

const PATCHED = Symbol.for('seller-node.yamux-half-window-updates');
const STATES = { Init: 0, SYNSent: 1, SYNReceived: 2, Established: 3, Finished: 4, Paused: 5 } as const;

type Install = () => boolean;

/** A fresh copy of the module, over a yamux stream module exporting `exports` instead of the real one. */
async function moduleOver(exports: Record<string, unknown>): Promise<Install> {
  vi.resetModules();
  vi.doMock('@chainsafe/libp2p-yamux/stream', () => exports);
  try {
    const fresh = await import('../src/p2p/yamux-window-updates.ts');
    expect(fresh.halfWindowUpdates).not.toBe(halfWindowUpdates);
    return fresh.halfWindowUpdates;
  } finally {
    vi.doUnmock('@chainsafe/libp2p-yamux/stream');
    vi.resetModules();
  }
}

/** The own property keys (names and symbols) of an object, with their values. */
function snapshot(o: object): Map<string | symbol, unknown> {
  return new Map(Reflect.ownKeys(o).map((k) => [k, (Object.getOwnPropertyDescriptor(o, k) as PropertyDescriptor).value]));
}

/** A stand-in for YamuxStream: records the calls that reach the original sendWindowUpdate. */
function fakeStreamClass() {
  const calls: { state: number; recvWindow: unknown; recvWindowCapacity: unknown }[] = [];
  class FakeStream {
    state: number = STATES.Established;
    recvWindow: unknown = 256 * 1024;
    recvWindowCapacity: unknown = 256 * 1024;
    sendWindowUpdate(): void {
      calls.push({ state: this.state, recvWindow: this.recvWindow, recvWindowCapacity: this.recvWindowCapacity });
    }
  }
  const original = FakeStream.prototype.sendWindowUpdate;
  return { FakeStream, calls, original };
}

describe('halfWindowUpdates: a yamux without the expected shape is left as it is', () => {
  afterEach(() => {
    vi.doUnmock('@chainsafe/libp2p-yamux/stream');
  });

  it('no sendWindowUpdate on the stream class: returns false and changes nothing', async () => {
    class NoUpdate {
      other(): void {}
    }
    const before = snapshot(NoUpdate.prototype);
    const install = await moduleOver({ StreamState: STATES, YamuxStream: NoUpdate });
    expect(install()).toBe(false);
    expect(install()).toBe(false); // and again: a refusal is not turned into a half-done patch
    expect(snapshot(NoUpdate.prototype)).toEqual(before);
    expect(Object.getOwnPropertySymbols(NoUpdate.prototype)).toEqual([]);
  });

  it('sendWindowUpdate that is not a function: returns false and changes nothing', async () => {
    class FieldNotMethod {}
    Object.defineProperty(FieldNotMethod.prototype, 'sendWindowUpdate', { value: 42, writable: true, configurable: true });
    const before = snapshot(FieldNotMethod.prototype);
    const install = await moduleOver({ StreamState: STATES, YamuxStream: FieldNotMethod });
    expect(install()).toBe(false);
    expect(snapshot(FieldNotMethod.prototype)).toEqual(before);
  });

  it('no StreamState, or no numeric Established state: returns false and leaves sendWindowUpdate as it was', async () => {
    for (const StreamState of [undefined, {}, { Established: 'established' }, { ...STATES, Established: undefined }]) {
      const { FakeStream, original } = fakeStreamClass();
      const before = snapshot(FakeStream.prototype);
      const install = await moduleOver({ StreamState, YamuxStream: FakeStream });
      expect(install(), JSON.stringify(StreamState)).toBe(false);
      expect(FakeStream.prototype.sendWindowUpdate).toBe(original);
      expect(snapshot(FakeStream.prototype)).toEqual(before);
    }
  });

  it('a stream class with the shape is patched once: a second call says yes and does not wrap it again', async () => {
    const { FakeStream, original } = fakeStreamClass();
    const install = await moduleOver({ StreamState: STATES, YamuxStream: FakeStream });
    expect(install()).toBe(true);
    const patched = FakeStream.prototype.sendWindowUpdate;
    expect(patched).not.toBe(original);
    expect((FakeStream.prototype as unknown as Record<symbol, unknown>)[PATCHED]).toBe(true);
    expect(install()).toBe(true);
    expect(FakeStream.prototype.sendWindowUpdate).toBe(patched);
    // A second copy of the module (another bundle of seller-node in the process) sees the mark too.
    const again = await moduleOver({ StreamState: STATES, YamuxStream: FakeStream });
    expect(again()).toBe(true);
    expect(FakeStream.prototype.sendWindowUpdate).toBe(patched);
  });
});

describe('halfWindowUpdates: when the patched sendWindowUpdate reaches the original', () => {
  async function patchedFake() {
    const fake = fakeStreamClass();
    const install = await moduleOver({ StreamState: STATES, YamuxStream: fake.FakeStream });
    expect(install()).toBe(true);
    /** Whether a stream in this state reaches the original sendWindowUpdate. */
    const reaches = (fields: { state: number; recvWindow: unknown; recvWindowCapacity: unknown }): boolean => {
      const s = Object.assign(new fake.FakeStream(), fields);
      const before = fake.calls.length;
      s.sendWindowUpdate();
      if (fake.calls.length > before) {
        expect(fake.calls.at(-1)).toEqual(fields); // called on the stream itself
        return true;
      }
      return false;
    };
    return reaches;
  }

  it('an established stream: no update while at least half the window is left, the original once less is', async () => {
    const reaches = await patchedFake();
    const W = 256 * 1024;
    const established = (recvWindowCapacity: number, recvWindow = W) => ({ state: STATES.Established, recvWindow, recvWindowCapacity });
    expect(reaches(established(W))).toBe(false); // nothing spent
    expect(reaches(established(W - 1))).toBe(false); // one byte spent (the unpatched yamux sends an update here)
    expect(reaches(established(W / 2))).toBe(false); // exactly half left
    expect(reaches(established(W / 2 - 1))).toBe(true); // just under half
    expect(reaches(established(0))).toBe(true); // all spent
    // The rule follows the stream's current window (yamux grows it), not the initial one.
    expect(reaches(established(W, 4 * W))).toBe(true);
    expect(reaches(established(2 * W, 4 * W))).toBe(false);
  });

  it('a stream not established yet (its SYN or ACK rides on the update), finished or paused always takes the original path', async () => {
    const reaches = await patchedFake();
    const W = 256 * 1024;
    for (const state of [STATES.Init, STATES.SYNSent, STATES.SYNReceived, STATES.Finished, STATES.Paused]) {
      // A full window: the patch would hold this update back for an established stream.
      expect(reaches({ state, recvWindow: W, recvWindowCapacity: W }), `state ${state}`).toBe(true);
    }
  });

  it('fields that are not numbers (a changed yamux) take the original path', async () => {
    const reaches = await patchedFake();
    const W = 256 * 1024;
    expect(reaches({ state: STATES.Established, recvWindow: undefined, recvWindowCapacity: W })).toBe(true);
    expect(reaches({ state: STATES.Established, recvWindow: W, recvWindowCapacity: undefined })).toBe(true);
    expect(reaches({ state: STATES.Established, recvWindow: String(W), recvWindowCapacity: W })).toBe(true);
  });
});

describe('halfWindowUpdates on real libp2p: a paused stream gets no window update', () => {
  // For each request "<count> <size>": count random messages of size bytes, waiting for drain.
  let pair: Awaited<ReturnType<typeof startBlastPair>>;
  beforeAll(async () => {
    pair = await startBlastPair('/test/yamux-window/1.0.0', 81);
  });
  afterAll(async () => {
    await pair?.stop();
  });

  it('premise: the stand-in states above are the real StreamState values', () => {
    expect(StreamState.Established).toBe(STATES.Established);
    expect(StreamState.Paused).toBe(STATES.Paused);
  });

  it('paused, the receiver sends no update: the sender stops once the window is spent; resumed, one update lets the rest through', async () => {
    const { stream, conn } = await pair.open();
    expect(stream).toBeInstanceOf(YamuxStream);
    // The yamux fields the patch reads (private in the types) and the stream's unread bytes.
    const y = stream as unknown as { state: StreamState; recvWindow: number; recvWindowCapacity: number; readBuffer: { byteLength: number } };
    // One round trip first: the stream is established on both sides.
    stream.send(new TextEncoder().encode('1 10'));
    expect(await readBytes(stream, 10)).toBe(10);
    expect(y.state).toBe(StreamState.Established);
    const window = y.recvWindow;
    const credit = y.recvWindowCapacity; // what the server may still send on this stream
    expect(credit).toBeGreaterThan(window / 2); // the small reply did not earn an update
    const total = 4 * window;

    const spy = spyOnSocket(conn);
    try {
      stream.pause();
      expect(y.state).toBe(StreamState.Paused);
      stream.send(new TextEncoder().encode(`${total / 4096} 4096`));
      await until('the server to spend the whole window', () => y.recvWindowCapacity === 0, 10_000);
      expect(y.readBuffer.byteLength).toBe(credit);
      // A while longer: nothing more arrives, because no window update went out (only the request).
      await new Promise((r) => setTimeout(r, 100));
      expect(y.recvWindowCapacity).toBe(0);
      expect(y.readBuffer.byteLength).toBe(credit);
      expect(spy.writes).toBe(1);

      stream.resume();
      expect(await readBytes(stream, total)).toBe(total);
      expect(spy.writes).toBeGreaterThan(1); // the update(s) that let the rest through
      expect(spy.writes).toBeLessThan(total / 4096); // not one per frame
    } finally {
      spy.restore();
      await stream.close();
    }
  });
});
