// The libp2p identity of a node, derived from the node's own 32-byte Ed25519 seed: the key the Noise
// handshake authenticates is exactly the key that signs receipts. Provider id = lowercase hex of the
// 32-byte public key; the PeerId embeds that same public key (identity multihash), so each maps to the
// other without any lookup.
import { privateKeyFromRaw, publicKeyFromRaw } from '@libp2p/crypto/keys';
import { peerIdFromPrivateKey, peerIdFromPublicKey, peerIdFromString } from '@libp2p/peer-id';
import type { PeerId, PrivateKey } from '@libp2p/interface';
import { ed25519PublicKey } from '../../attestation/ed25519.ts';
import { bytesEqual, concatBytes, fromHex, isHex, toHex } from '../../attestation/bytes.ts';

export class PeerIdentityError extends Error {
  override name = 'PeerIdentityError';
}

/** The libp2p private key for the node's Ed25519 seed (libp2p's raw form is seed ‖ public key). */
export function libp2pPrivateKeyFromSeed(seed: Uint8Array): PrivateKey {
  if (!(seed instanceof Uint8Array) || seed.length !== 32) throw new PeerIdentityError('an Ed25519 seed is 32 bytes');
  const publicKey = ed25519PublicKey(seed);
  const key = privateKeyFromRaw(concatBytes(seed, publicKey));
  // libp2p takes the public half on trust; make sure it is the one our signer derives.
  if (key.type !== 'Ed25519' || !bytesEqual(key.publicKey.raw, publicKey)) {
    throw new PeerIdentityError('libp2p derived a different Ed25519 public key from the seed');
  }
  return key;
}

/** The PeerId of the node whose Ed25519 seed this is. */
export function peerIdFromSeed(seed: Uint8Array): PeerId {
  return peerIdFromPrivateKey(libp2pPrivateKeyFromSeed(seed));
}

/** Provider id (64 lowercase hex) of an Ed25519 PeerId; throws for any other key type. */
export function providerIdFromPeerId(peerId: PeerId): string {
  if (peerId.type !== 'Ed25519') throw new PeerIdentityError(`peer ${peerId.toString()} has a ${peerId.type} key, not Ed25519`);
  return toHex(peerId.publicKey.raw);
}

/** The PeerId for a provider id (64 lowercase hex of the Ed25519 public key). */
export function peerIdFromProviderId(providerId: string): PeerId {
  if (!isHex(providerId, 32)) throw new PeerIdentityError('a provider id is 64 lowercase hex characters');
  return peerIdFromPublicKey(publicKeyFromRaw(fromHex(providerId)));
}

/** True when the string looks like a provider id rather than a base58/CID PeerId string. */
function isProviderId(s: string): boolean {
  return isHex(s, 32);
}

/** A PeerId from either spelling: a provider id (hex) or libp2p's own string form. */
export function parsePeerId(s: string): PeerId {
  if (isProviderId(s)) return peerIdFromProviderId(s);
  try {
    return peerIdFromString(s);
  } catch {
    throw new PeerIdentityError(`not a peer id or provider id: ${s.slice(0, 80)}`);
  }
}
