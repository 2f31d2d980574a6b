// The peer-store merge cache: repeated protocol-only merges for a peer are answered at once; any
// change to the peer's record, anything besides protocols, the host's own id and age go through.
import { describe, expect, test } from 'vitest';
import type { PeerData, PeerId } from '@libp2p/interface';
import { cacheProtocolMerges } from '../src/p2p/protocol-merge-cache.ts';

const id = (s: string) => ({ toString: () => s }) as unknown as PeerId;

function fakeHost() {
  const calls: { peer: string; data: PeerData }[] = [];
  const listeners: ((e: { detail: { peer: { id: PeerId } } }) => void)[] = [];
  let clock = 0;
  const host = {
    peerId: id('self'),
    addEventListener: (_type: string, l: (e: { detail: { peer: { id: PeerId } } }) => void) => void listeners.push(l),
    peerStore: {
      merge: async (peer: PeerId, data: PeerData) => {
        calls.push({ peer: peer.toString(), data });
        return { id: peer, protocols: data.protocols ?? [] } as never;
      },
      delete: async (_peer: PeerId) => {},
    },
  };
  const cache = cacheProtocolMerges(host as never, { ttlMs: 1000, now: () => clock });
  return { host, calls, cache, update: (peer: string) => listeners.forEach((l) => l({ detail: { peer: { id: id(peer) } } })), advance: (ms: number) => (clock += ms) };
}

describe('cacheProtocolMerges', () => {
  test('the first merge of a protocol goes through; repeats are answered from the cache', async () => {
    const { host, calls, cache } = fakeHost();
    const first = await host.peerStore.merge(id('a'), { protocols: ['/p/1'] });
    for (let i = 0; i < 5; i++) expect(await host.peerStore.merge(id('a'), { protocols: ['/p/1'] })).toBe(first);
    expect(calls.length).toBe(1);
    expect(cache.skipped).toBe(5);
    // Another protocol, or another peer, is a real merge.
    await host.peerStore.merge(id('a'), { protocols: ['/p/2'] });
    await host.peerStore.merge(id('b'), { protocols: ['/p/1'] });
    expect(calls.length).toBe(3);
    expect(await host.peerStore.merge(id('a'), { protocols: ['/p/1', '/p/2'] })).toBeDefined();
    expect(calls.length).toBe(3);
  });

  test('a change to the peer\'s record (peer:update), its deletion and age all send the next merge through', async () => {
    const { host, calls, update, advance } = fakeHost();
    await host.peerStore.merge(id('a'), { protocols: ['/p/1'] });
    update('a');
    await host.peerStore.merge(id('a'), { protocols: ['/p/1'] });
    expect(calls.length).toBe(2);
    await host.peerStore.delete(id('a'));
    await host.peerStore.merge(id('a'), { protocols: ['/p/1'] });
    expect(calls.length).toBe(3);
    calls.pop();
    advance(999);
    await host.peerStore.merge(id('a'), { protocols: ['/p/1'] });
    expect(calls.length).toBe(2);
    advance(2);
    await host.peerStore.merge(id('a'), { protocols: ['/p/1'] });
    expect(calls.length).toBe(3);
  });

  test('merges with anything besides protocols, and merges for the host itself, always go through', async () => {
    const { host, calls } = fakeHost();
    for (let i = 0; i < 2; i++) {
      await host.peerStore.merge(id('a'), { protocols: ['/p/1'], tags: { x: { value: 1 } } } as PeerData);
      await host.peerStore.merge(id('self'), { protocols: ['/p/1'] });
      await host.peerStore.merge(id('a'), { protocols: [] });
    }
    expect(calls.length).toBe(6);
  });
});
