import crypto from 'node:crypto';
import * as ed from '@noble/ed25519';
import { describe, expect, test } from 'vitest';
import { fromHex, toHex } from '../attestation/bytes.ts';
import { ed25519PublicKey, ed25519Sign, ed25519SignNoble, ed25519Verify, ed25519VerifyNoble } from '../attestation/ed25519.ts';
import { ed25519Verify as exportedVerify } from '../attestation/verifier.ts';
import { readVectorJson } from './helpers/vectors.ts';

interface Vector { priv: string; pub: string; msg: string; sig: string }
const vectors = Object.values(readVectorJson<Record<string, Vector>>('ed25519', 'noble-ed25519', 'rfc8032-ed25519.json'));

const L = 2n ** 252n + 27742317777372353535851937790883648493n;
const P = 2n ** 255n - 19n;
const le = (n: bigint) => {
  const out = new Uint8Array(32);
  for (let i = 0; i < 32; i++) out[i] = Number((n >> BigInt(8 * i)) & 255n);
  return out;
};
const fromLe = (b: Uint8Array) => b.reduceRight((acc, x) => (acc << 8n) | BigInt(x), 0n);

describe('RFC 8032 §7.1 vectors', () => {
  test('there are four', () => expect(vectors.length).toBe(4));
  test.each(vectors.map((v, i) => [i, v] as const))('vector %i: both engines sign identically and verify', (_, v) => {
    const seed = fromHex(v.priv);
    const msg = fromHex(v.msg);
    expect(toHex(ed25519PublicKey(seed))).toBe(v.pub);
    expect(toHex(ed25519Sign(seed, msg))).toBe(v.sig);
    expect(toHex(ed25519SignNoble(seed, msg))).toBe(v.sig);
    expect(ed25519Verify(fromHex(v.sig), msg, fromHex(v.pub))).toBe(true);
    expect(ed25519VerifyNoble(fromHex(v.sig), msg, fromHex(v.pub))).toBe(true);
    expect(exportedVerify(fromHex(v.sig), msg, fromHex(v.pub))).toBe(true);
  });
});

/** Both engines, asserted equal, returning the common answer. */
function both(sig: Uint8Array, msg: Uint8Array, pub: Uint8Array): boolean {
  const a = ed25519Verify(sig, msg, pub);
  const b = ed25519VerifyNoble(sig, msg, pub);
  expect(a, `fast and noble disagree on sig=${toHex(sig)} pub=${toHex(pub)}`).toBe(b);
  return a;
}

describe('strict verification, fast path and noble agree', () => {
  const seed = fromHex(vectors[1]!.priv);
  const pub = fromHex(vectors[1]!.pub);
  const msg = fromHex(vectors[1]!.msg);
  const sig = fromHex(vectors[1]!.sig);

  test('every single-bit flip of signature, message and key is refused', () => {
    for (let bit = 0; bit < 512; bit++) {
      const s = sig.slice();
      s[bit >> 3]! ^= 1 << (bit & 7);
      expect(both(s, msg, pub)).toBe(false);
    }
    for (let bit = 0; bit < 256; bit++) {
      const k = pub.slice();
      k[bit >> 3]! ^= 1 << (bit & 7);
      expect(both(sig, msg, k)).toBe(false);
    }
    const m = msg.slice();
    m[0]! ^= 1;
    expect(both(sig, m, pub)).toBe(false);
  });

  test('S + L (malleated, non-canonical S) is refused', () => {
    const s = fromLe(sig.subarray(32)) + L;
    const bad = sig.slice();
    bad.set(le(s), 32);
    expect(both(bad, msg, pub)).toBe(false);
  });

  test('non-canonical public key encoding (y + p) is refused even though it decodes', () => {
    // y = 1 - p... take a key whose y < 19 so that y + p still fits in 255 bits.
    for (let y = 0n; y < 19n; y++) {
      const enc = le(y + P);
      expect(both(sig, msg, enc)).toBe(false);
    }
  });

  test('small-order public keys are refused, with a signature that holds for them', () => {
    // For A of small order and R = [r]B with S = r, the cofactorless equation holds when [k]A = 0.
    const small = new Set<string>();
    let p = ed.Point.fromHex('26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05');
    for (let i = 0; i < 8; i++) {
      small.add(toHex(p.toBytes()));
      p = p.add(ed.Point.fromHex('26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05'));
    }
    expect(small.size).toBe(8);
    for (const a of small) {
      const A = fromHex(a);
      const r = 12345n;
      const R = ed.Point.BASE.multiply(r).toBytes();
      const forged = new Uint8Array(64);
      forged.set(R);
      forged.set(le(r), 32);
      expect(both(forged, msg, A)).toBe(false);
      // x = 0 with the sign bit set ("negative zero") too.
      const neg = A.slice();
      neg[31]! ^= 0x80;
      expect(both(forged, msg, neg)).toBe(false);
    }
  });

  test('mixed-order key (A + torsion): cofactored rule accepts what OpenSSL alone rejects; both engines agree', () => {
    const T = ed.Point.fromHex('26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05');
    const a = 987654321987654321n;
    const Apoint = ed.Point.BASE.multiply(a).add(T);
    const A = Apoint.toBytes();
    let agreedValid = 0;
    for (let i = 0; i < 16; i++) {
      const m = new Uint8Array([i]);
      const r = 1000n + BigInt(i);
      const R = ed.Point.BASE.multiply(r).toBytes();
      const k = fromLe(crypto.createHash('sha512').update(R).update(A).update(m).digest()) % L;
      const S = (r + k * a) % L;
      const s = new Uint8Array(64);
      s.set(R);
      s.set(le(S), 32);
      const nodeSays = crypto.verify(null, m, crypto.createPublicKey({ key: Buffer.concat([Buffer.from('302a300506032b6570032100', 'hex'), A]), format: 'der', type: 'spki' }), s);
      // [8](SB - R - kA) = -[8k]T = 0, so the cofactored equation always holds.
      expect(both(s, m, A)).toBe(true);
      if (nodeSays) agreedValid++;
    }
    // OpenSSL's cofactorless check accepts only when k·T = 0 (k ≡ 0 mod 8): the fallback made the difference.
    expect(agreedValid).toBeLessThan(16);
  });

  test('random keys and messages: valid signatures verify, corrupted ones do not, engines agree', () => {
    for (let i = 0; i < 64; i++) {
      const s = new Uint8Array(crypto.randomBytes(32));
      const m = new Uint8Array(crypto.randomBytes(i * 7));
      const pk = ed25519PublicKey(s);
      const sg = ed25519Sign(s, m);
      expect(toHex(sg)).toBe(toHex(ed25519SignNoble(s, m)));
      expect(both(sg, m, pk)).toBe(true);
      const junk = new Uint8Array(crypto.randomBytes(64));
      expect(both(junk, m, pk)).toBe(false);
      expect(both(sg, m, new Uint8Array(crypto.randomBytes(32)))).toBe(false);
    }
  });

  test('wrong lengths and wrong types are invalid, never a throw', () => {
    expect(both(sig.subarray(0, 63), msg, pub)).toBe(false);
    expect(both(sig, msg, pub.subarray(0, 31))).toBe(false);
    expect(both(new Uint8Array(0), msg, pub)).toBe(false);
    expect(ed25519Verify('00' as unknown as Uint8Array, msg, pub)).toBe(false);
    expect(ed25519Verify(sig, 'hello' as unknown as Uint8Array, pub)).toBe(false);
    expect(ed25519Verify(sig, msg, null as unknown as Uint8Array)).toBe(false);
  });

  test('key caches follow the bytes, not the buffer: a reused buffer holding another key is that key', () => {
    const a = fromHex(vectors[0]!.priv);
    const b = fromHex(vectors[1]!.priv);
    const buf = a.slice();
    const m = new Uint8Array([1, 2, 3]);
    const sigA = ed25519Sign(buf, m);
    buf.set(b);
    expect(toHex(ed25519Sign(buf, m))).toBe(toHex(ed25519SignNoble(b, m)));
    const pub = fromHex(vectors[0]!.pub);
    expect(ed25519Verify(sigA, m, pub)).toBe(true);
    pub.set(fromHex(vectors[1]!.pub));
    expect(ed25519Verify(sigA, m, pub)).toBe(false);
  });

  test('the same holds for Node Buffers, whose slice() is a view and not a copy', () => {
    const a = Buffer.from(fromHex(vectors[0]!.priv));
    const m = new Uint8Array([4, 5, 6]);
    ed25519Sign(a, m);
    a.set(fromHex(vectors[1]!.priv));
    expect(toHex(ed25519Sign(a, m))).toBe(toHex(ed25519SignNoble(fromHex(vectors[1]!.priv), m)));
    const pub = Buffer.from(fromHex(vectors[0]!.pub));
    const sigA = ed25519SignNoble(fromHex(vectors[0]!.priv), m);
    expect(ed25519Verify(sigA, m, pub)).toBe(true);
    pub.set(fromHex(vectors[1]!.pub));
    expect(ed25519Verify(sigA, m, pub)).toBe(false);
  });

  test('sign refuses a seed of the wrong size', () => {
    expect(() => ed25519Sign(seed.subarray(1), msg)).toThrow(RangeError);
  });
});
