// Ed25519 (RFC 8032) with one strict verification rule, whichever engine computes it.
//
// The rule (docs/decisions.md §Ed25519): signature 64 bytes, public key 32 bytes; S < L; R and A
// canonical encodings (y < p, no "negative zero" x); A not of small order; and the cofactored group
// equation [8][S]B = [8]R + [8][k]A. This is @noble/ed25519's `zip215: false` branch exactly.
//
// The fast path asks Node's OpenSSL first. OpenSSL checks S < L and the cofactorless equation
// [S]B = R + [k]A by comparing R's bytes, which implies the cofactored one and a canonical R. After
// the cheap canonical and small-order checks below, an OpenSSL "valid" is therefore always a noble
// "valid"; an OpenSSL "invalid" is re-checked by noble, so both engines answer alike on every input.
import * as ed from '@noble/ed25519';
import { sha512 as nobleSha512 } from '@noble/hashes/sha2.js';
import { nodeCrypto } from './platform.ts';
import { bytesEqual, copyBytes, toHex } from './bytes.ts';

ed.hashes.sha512 = nobleSha512;

const native = nodeCrypto();

// Group order L, little-endian, for the S < L test without BigInt.
const L_LE = Uint8Array.from([
  0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
]);

/** True when the 32 little-endian bytes at `off` encode an integer below L. */
function scalarBelowL(b: Uint8Array, off: number): boolean {
  for (let i = 31; i >= 0; i--) {
    const x = b[off + i]!;
    const l = L_LE[i]!;
    if (x < l) return true;
    if (x > l) return false;
  }
  return false; // equal to L
}

/** True when the encoded y coordinate (sign bit cleared) is below p = 2^255 - 19. */
function canonicalY(b: Uint8Array): boolean {
  // y >= p only when bytes 1..30 are 0xff, byte 31 (sign cleared) is 0x7f and byte 0 >= 0xed.
  if ((b[31]! & 0x7f) !== 0x7f) return true;
  for (let i = 30; i >= 1; i--) if (b[i] !== 0xff) return true;
  return b[0]! < 0xed;
}

// Encodings of the eight points of small order (canonical y, both sign bits where x = 0 so the
// "negative zero" encodings are refused here too). Computed once from noble's own arithmetic.
const SMALL_ORDER = new Set<string>();
{
  // A generator of the torsion subgroup: the point of order 8 with the smallest encoding.
  const t8 = ed.Point.fromHex('26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05');
  let p = ed.Point.ZERO;
  for (let i = 0; i < 8; i++) {
    const enc = p.toBytes();
    SMALL_ORDER.add(toHex(enc));
    const neg = enc.slice();
    neg[31] = neg[31]! ^ 0x80;
    SMALL_ORDER.add(toHex(neg));
    p = p.add(t8);
  }
}

function wellFormed(signature: Uint8Array, publicKey: Uint8Array): boolean {
  return (
    signature instanceof Uint8Array &&
    publicKey instanceof Uint8Array &&
    signature.length === 64 &&
    publicKey.length === 32 &&
    scalarBelowL(signature, 32)
  );
}

/** Strict verification on @noble/ed25519 only (the browser path). */
export function ed25519VerifyNoble(signature: Uint8Array, message: Uint8Array, publicKey: Uint8Array): boolean {
  try {
    if (!wellFormed(signature, publicKey) || !(message instanceof Uint8Array)) return false;
    return ed.verify(signature, message, publicKey, { zip215: false });
  } catch {
    return false;
  }
}

// The last public key that passed the key checks, kept as a copy and compared by content.
let lastGoodKey: Uint8Array | undefined;

function acceptableKey(publicKey: Uint8Array): boolean {
  if (lastGoodKey && bytesEqual(lastGoodKey, publicKey)) return true;
  if (!canonicalY(publicKey) || SMALL_ORDER.has(toHex(publicKey))) return false;
  lastGoodKey = copyBytes(publicKey);
  return true;
}

/**
 * Strict Ed25519 verification (see the rule at the top of this file). Never throws: any malformed
 * input is simply invalid. Uses Node's OpenSSL where present and @noble/ed25519 elsewhere; both
 * give the same answer on every input.
 */
export function ed25519Verify(signature: Uint8Array, message: Uint8Array, publicKey: Uint8Array): boolean {
  try {
    return verifyStrict(signature, message, publicKey);
  } catch {
    return false; // (hostile values: a Proxy, a getter that throws)
  }
}

function verifyStrict(signature: Uint8Array, message: Uint8Array, publicKey: Uint8Array): boolean {
  return quick(signature, message, publicKey) ?? ed25519VerifyNoble(signature, message, publicKey);
}

/**
 * The answer of ed25519Verify when the fast path alone can give it: true or false; undefined when
 * only the cofactored re-check on noble (about 1 ms of JavaScript, 20 times OpenSSL's cost) can
 * say, which is whenever OpenSSL says "invalid" to a well-formed signature. Whoever verifies
 * signatures from strangers at a rate can bound that re-check's share of the CPU with this (a
 * forged signature always needs it; a signature made by an RFC 8032 signer never does, as its R is
 * exactly [r]B). Never throws.
 */
export function ed25519VerifyFast(signature: Uint8Array, message: Uint8Array, publicKey: Uint8Array): boolean | undefined {
  try {
    return quick(signature, message, publicKey);
  } catch {
    return false; // (hostile values, as in ed25519Verify)
  }
}

function quick(signature: Uint8Array, message: Uint8Array, publicKey: Uint8Array): boolean | undefined {
  if (!wellFormed(signature, publicKey) || !(message instanceof Uint8Array)) return false;
  if (!native) return undefined;
  if (!acceptableKey(publicKey)) return false;
  let valid = false;
  try {
    valid = native.ed25519Verify(publicKey, message, signature);
  } catch {
    valid = false;
  }
  return valid ? true : undefined;
}

/** Deterministic RFC 8032 signature by a 32-byte seed. Node's OpenSSL where present, noble elsewhere. */
export function ed25519Sign(seed: Uint8Array, message: Uint8Array): Uint8Array {
  if (seed.length !== 32) throw new RangeError('an Ed25519 seed is 32 bytes');
  if (native) return native.ed25519Sign(seed, message);
  return ed.sign(message, seed);
}

/** Signing on @noble/ed25519 only (what a browser uses); identical bytes to ed25519Sign. */
export function ed25519SignNoble(seed: Uint8Array, message: Uint8Array): Uint8Array {
  if (seed.length !== 32) throw new RangeError('an Ed25519 seed is 32 bytes');
  return ed.sign(message, seed);
}

export function ed25519PublicKey(seed: Uint8Array): Uint8Array {
  if (seed.length !== 32) throw new RangeError('an Ed25519 seed is 32 bytes');
  return ed.getPublicKey(seed);
}

/** A fresh random 32-byte seed from the platform's CSPRNG (Web Crypto, present in Node and browsers). */
export function ed25519RandomSeed(): Uint8Array {
  return globalThis.crypto.getRandomValues(new Uint8Array(32));
}
