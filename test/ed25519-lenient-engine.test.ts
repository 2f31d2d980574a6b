// The key pre-checks of ed25519.ts are what refuse small-order and non-canonical keys under an
// OpenSSL that does not (3.0.x: Node 22 before 22.20, distro builds). Simulate one that checks only
// S < L and the cofactorless equation, as OpenSSL 3.0 does (here: accepts whatever noble's ZIP-215
// rule accepts, which includes small-order and non-canonical keys).
import * as ed from '@noble/ed25519';
import { describe, expect, test, vi } from 'vitest';

vi.mock('../attestation/platform.ts', async (orig) => {
  const real = (await orig()) as typeof import('../attestation/platform.ts');
  const n = real.nodeCrypto()!;
  return {
    ...real,
    nodeCrypto: () => ({
      ...n,
      // A lenient engine: ZIP-215 accepts small-order and non-canonical A.
      ed25519Verify: (pub: Uint8Array, msg: Uint8Array, sig: Uint8Array) => {
        try { return ed.verify(sig, msg, pub, { zip215: true }); } catch { return false; }
      },
    }),
  };
});

const { ed25519Verify, ed25519Sign, ed25519PublicKey } = await import('../attestation/ed25519.ts');
const P = 2n ** 255n - 19n;
const le = (n: bigint) => { const o = new Uint8Array(32); for (let i = 0; i < 32; i++) o[i] = Number((n >> BigInt(8 * i)) & 255n); return o; };
const forged = (r: bigint) => { const s = new Uint8Array(64); s.set(ed.Point.BASE.multiply(r).toBytes()); s.set(le(r), 32); return s; };

describe('the strict rule holds whatever the native engine lets through', () => {
  test('the identity key (small order): R = [r]B, S = r is refused', () => {
    expect(ed25519Verify(forged(777n), new TextEncoder().encode('any'), le(1n))).toBe(false);
  });
  test('the identity encoded non-canonically (y = 1 + p) is refused', () => {
    expect(ed25519Verify(forged(778n), new TextEncoder().encode('any'), le(1n + P))).toBe(false);
  });
  test('y = p exactly (the order-4 point y = 0, non-canonically) is refused', () => {
    expect(ed25519Verify(forged(779n), new TextEncoder().encode('any'), le(P))).toBe(false);
  });
  test('after a good key was seen (the key cache), a small-order key is still refused', () => {
    const seed = new Uint8Array(32).fill(9);
    const m = new TextEncoder().encode('good');
    expect(ed25519Verify(ed25519Sign(seed, m), m, ed25519PublicKey(seed))).toBe(true);
    expect(ed25519Verify(forged(780n), new TextEncoder().encode('any'), le(1n))).toBe(false);
  });
  test('a caller buffer that held a good key and now holds a small-order one is that key', () => {
    const seed = new Uint8Array(32).fill(11);
    const m = new TextEncoder().encode('good');
    const buf = ed25519PublicKey(seed).slice();
    expect(ed25519Verify(ed25519Sign(seed, m), m, buf)).toBe(true);
    buf.set(le(1n));
    expect(ed25519Verify(forged(781n), new TextEncoder().encode('any'), buf)).toBe(false);
  });
});
