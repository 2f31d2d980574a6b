// libp2p records "this peer speaks protocol P" in its peer store on every stream it opens or
// accepts: a locked read-modify-write of the peer's record (protobuf decode, compare, maybe encode)
// that, after the first stream, changes nothing. Cold, it is ~0.3 ms a side on a small machine, on
// the path to the first token. This wraps the host's peerStore.merge so that a merge of nothing but
// protocols already recorded for that peer, recently, by this wrapper, is answered at once.
//
// What is skipped: the merge would have found the protocol present and rewritten the record with
// nothing changed but its `updated` time (no peer:update event); that time is then refreshed once
// a ttlMs instead of on every stream (libp2p ages peers out after hours, not seconds). The cache
// entry is dropped when the peer's record changes (peer:update) or is deleted, and lives at most
// ttlMs in case the record was pruned without an event; merges for the host's own peer id, and
// merges carrying anything besides protocols, always go through.
import type { Libp2p, Peer, PeerId, PeerData, PeerStore } from '@libp2p/interface';

export interface ProtocolMergeCacheOptions {
  /** How long a recorded (peer, protocol) is trusted without a fresh merge. Default 60 s. */
  ttlMs?: number;
  /** Peers remembered at most (the cache is cleared when full). Default 10,000. */
  maxPeers?: number;
  now?: () => number;
}

export interface ProtocolMergeCache {
  /** Merges answered from the cache. */
  readonly skipped: number;
}

type MergeHost = Pick<Libp2p, 'peerId' | 'addEventListener'> & { peerStore: Pick<PeerStore, 'merge'> & Partial<Pick<PeerStore, 'delete'>> };

const caches = new WeakMap<object, ProtocolMergeCache>();

/** The cache installed on a host by cacheProtocolMerges, if any (for tests and metrics). */
export function protocolMergeCacheOf(host: object): ProtocolMergeCache | undefined {
  return caches.get(host);
}

export function cacheProtocolMerges(host: MergeHost, opts: ProtocolMergeCacheOptions = {}): ProtocolMergeCache {
  const ttlMs = opts.ttlMs ?? 60_000;
  const maxPeers = opts.maxPeers ?? 10_000;
  const now = opts.now ?? (() => performance.now()); // monotonic: a clock step cannot stretch the ttl
  const self = host.peerId.toString();
  /** peer id → protocol → when it was last merged. */
  const known = new Map<string, Map<string, number>>();
  const last = new Map<string, Peer>();
  const stats = { skipped: 0 };
  const store = host.peerStore;
  const merge = store.merge.bind(store);

  const forget = (peer: string): void => {
    known.delete(peer);
    last.delete(peer);
  };
  host.addEventListener('peer:update', (e) => forget(e.detail.peer.id.toString()));
  // A deleted record sends no event.
  const del = store.delete?.bind(store);
  if (del) {
    store.delete = async (id: PeerId, options?: Parameters<PeerStore['delete']>[1]): Promise<void> => {
      forget(id.toString());
      return del(id, options);
    };
  }

  store.merge = async (id: PeerId, data: PeerData, options?: Parameters<PeerStore['merge']>[2]): Promise<Peer> => {
    const peer = id.toString();
    const protocols = onlyProtocols(data);
    if (protocols === undefined || peer === self) return merge(id, data, options);
    const t = now();
    const seen = known.get(peer);
    const cached = last.get(peer);
    if (seen && cached && protocols.every((p) => t - (seen.get(p) ?? -Infinity) < ttlMs)) {
      stats.skipped++;
      return cached;
    }
    const result = await merge(id, data, options);
    if (known.size >= maxPeers && !known.has(peer)) {
      known.clear();
      last.clear();
    }
    const entry = known.get(peer) ?? new Map<string, number>();
    for (const p of protocols) entry.set(p, t);
    known.set(peer, entry);
    last.set(peer, result);
    return result;
  };

  const cache: ProtocolMergeCache = {
    get skipped() {
      return stats.skipped;
    },
  };
  caches.set(host, cache);
  return cache;
}

/** The protocols of a merge that carries nothing else, or undefined. */
function onlyProtocols(data: PeerData): string[] | undefined {
  let protocols: string[] | undefined;
  for (const [k, v] of Object.entries(data)) {
    if (v === undefined) continue;
    if (k !== 'protocols' || !Array.isArray(v)) return undefined;
    protocols = v as string[];
  }
  return protocols && protocols.length > 0 ? protocols : undefined;
}
