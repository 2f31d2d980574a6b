import { describe, expect, it } from 'vitest';
import { generateKeyPair } from '@libp2p/crypto/keys';
import { peerIdFromPrivateKey } from '@libp2p/peer-id';
import { ed25519PublicKey, ed25519RandomSeed, ed25519Sign, ed25519Verify } from '../attestation/ed25519.ts';
import { identityFromSeed } from '../src/identity.ts';
import {
  PeerIdentityError,
  libp2pPrivateKeyFromSeed,
  parsePeerId,
  peerIdFromProviderId,
  peerIdFromSeed,
  providerIdFromPeerId,
} from '../src/p2p/peer-id.ts';

const seed = Uint8Array.from({ length: 32 }, (_, i) => i * 7 + 1);

describe('PeerId from the node seed', () => {
  it('is deterministic: the same seed gives the same PeerId', () => {
    const a = peerIdFromSeed(seed);
    const b = peerIdFromSeed(Uint8Array.from(seed));
    expect(a.toString()).toBe(b.toString());
    expect(a.equals(b)).toBe(true);
    expect(peerIdFromSeed(ed25519RandomSeed()).equals(a)).toBe(false);
  });

  it("embeds exactly the receipt-signing public key", () => {
    const peerId = peerIdFromSeed(seed);
    expect(peerId.type).toBe('Ed25519');
    if (peerId.type !== 'Ed25519') return;
    expect(peerId.publicKey.raw).toEqual(ed25519PublicKey(seed));
    expect(peerId.toString()).toMatch(/^12D3KooW/); // identity-multihash Ed25519 peer id
  });

  it('the libp2p private key signs as the node key does (same key, not just same public half)', async () => {
    const key = libp2pPrivateKeyFromSeed(seed);
    const msg = new TextEncoder().encode('receipt bytes');
    const sig = await key.sign(msg);
    expect(Uint8Array.from(sig)).toEqual(Uint8Array.from(ed25519Sign(seed, msg))); // Ed25519 is deterministic
    expect(ed25519Verify(sig, msg, ed25519PublicKey(seed))).toBe(true);
  });

  it('maps to and from the provider id', () => {
    const identity = identityFromSeed(seed);
    const peerId = peerIdFromSeed(seed);
    expect(providerIdFromPeerId(peerId)).toBe(identity.providerId);
    expect(peerIdFromProviderId(identity.providerId).equals(peerId)).toBe(true);
    expect(parsePeerId(identity.providerId).equals(peerId)).toBe(true);
    expect(parsePeerId(peerId.toString()).equals(peerId)).toBe(true);
  });

  it('refuses bad seeds, bad provider ids and non-Ed25519 peers', async () => {
    expect(() => peerIdFromSeed(new Uint8Array(31))).toThrow(PeerIdentityError);
    expect(() => peerIdFromSeed(new Uint8Array(64))).toThrow(PeerIdentityError);
    const hex = identityFromSeed(seed).providerId;
    expect(() => peerIdFromProviderId(hex.toUpperCase())).toThrow(PeerIdentityError);
    expect(() => peerIdFromProviderId(hex.slice(2))).toThrow(PeerIdentityError);
    expect(() => parsePeerId('not-a-peer')).toThrow(PeerIdentityError);
    const secp = peerIdFromPrivateKey(await generateKeyPair('secp256k1'));
    expect(() => providerIdFromPeerId(secp)).toThrow(PeerIdentityError);
  });
});
