// Where the gateway dials a provider: its listed addresses, each pinned to the PeerId of its
// provider key, so that Noise authenticates exactly that key.
import { multiaddr, type Multiaddr } from '@multiformats/multiaddr';
import { peerIdFromProviderId } from '../p2p/peer-id.ts';
import { GatewayError } from './errors.ts';

/** The provider's multiaddrs, each ending in its PeerId (so Noise authenticates exactly that key). */
export function dialTarget(provider: string, peerId: string, addresses: readonly string[]): Multiaddr[] {
  let expected: string;
  try {
    expected = peerIdFromProviderId(provider).toString();
  } catch {
    throw new GatewayError(502, 'bad_market_response', 'the provider id is not an Ed25519 key');
  }
  if (peerId !== expected) throw new GatewayError(502, 'bad_market_response', `peer id ${peerId.slice(0, 80)} is not provider ${provider}'s`);
  const out: Multiaddr[] = [];
  for (const a of addresses) {
    try {
      const ma = multiaddr(a);
      const p2p = ma.getComponents().filter((c) => c.name === 'p2p');
      if (p2p.length === 0) out.push(ma.encapsulate(`/p2p/${expected}`));
      else if (p2p.at(-1)!.value === expected) out.push(ma);
    } catch {
      // not a multiaddr: skip it
    }
  }
  if (out.length === 0) throw new GatewayError(503, 'provider_unreachable', `provider ${provider} has no usable address`);
  return out;
}
