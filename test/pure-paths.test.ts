// The browser paths, exercised in Node: no Buffer, no node:crypto. Every answer must equal the
// native one (computed here with Node directly).
import crypto from 'node:crypto';
import { beforeAll, describe, expect, test } from 'vitest';
import { LENIENT_BASE64 } from './helpers/base64-cases.ts';

const NodeBuffer = Buffer;
let bytes: typeof import('../attestation/bytes.ts');
let hash: typeof import('../attestation/hash.ts');
let ed: typeof import('../attestation/ed25519.ts');

beforeAll(async () => {
  const platform = await import('../attestation/platform.ts');
  platform.disableNativeCrypto();
  (globalThis as { Buffer?: unknown }).Buffer = undefined;
  try {
    bytes = await import('../attestation/bytes.ts');
    hash = await import('../attestation/hash.ts');
    ed = await import('../attestation/ed25519.ts');
  } finally {
    (globalThis as { Buffer?: unknown }).Buffer = NodeBuffer;
  }
});

describe('pure TypeScript paths give the native answers', () => {
  test('base64 and hex', () => {
    for (let n = 0; n < 40; n++) {
      const b = new Uint8Array(crypto.randomBytes(n));
      const s = bytes.toBase64(b);
      expect(s).toBe(NodeBuffer.from(b).toString('base64'));
      expect(bytes.fromBase64(s)).toEqual(b);
      expect(bytes.toHex(b)).toBe(NodeBuffer.from(b).toString('hex'));
    }
    for (const bad of LENIENT_BASE64) expect(bytes.fromBase64(bad), bad).toBeUndefined();
  });
  test('sha256 and sha512 (noble)', () => {
    const d = new Uint8Array(crypto.randomBytes(1000));
    expect(NodeBuffer.from(hash.sha256(d)).toString('hex')).toBe(crypto.createHash('sha256').update(d).digest('hex'));
    expect(NodeBuffer.from(hash.sha512(d)).toString('hex')).toBe(crypto.createHash('sha512').update(d).digest('hex'));
    const text = 'prev chain \u00e9\u{1F600} ' + crypto.randomBytes(20).toString('hex');
    expect(hash.sha256Hex(text)).toBe(crypto.createHash('sha256').update(text, 'utf8').digest('hex'));
  });
  test('Ed25519 sign and verify (noble) match node:crypto', () => {
    const { privateKey, publicKey } = crypto.generateKeyPairSync('ed25519');
    const seed = new Uint8Array(privateKey.export({ format: 'der', type: 'pkcs8' }).subarray(-32));
    const pub = new Uint8Array(publicKey.export({ format: 'der', type: 'spki' }).subarray(-32));
    const msg = new Uint8Array(crypto.randomBytes(100));
    const sig = ed.ed25519Sign(seed, msg);
    expect(NodeBuffer.from(sig).equals(crypto.sign(null, msg, privateKey))).toBe(true);
    expect(ed.ed25519Verify(sig, msg, pub)).toBe(true);
    sig[0]! ^= 1;
    expect(ed.ed25519Verify(sig, msg, pub)).toBe(false);
  });
  test('the public key of a seed matches node:crypto, also for a buffer reused for another seed', () => {
    const seed = new Uint8Array(crypto.randomBytes(32));
    const pubOf = (s: Uint8Array) => new Uint8Array(crypto.createPublicKey(crypto.createPrivateKey({ key: NodeBuffer.concat([NodeBuffer.from('302e020100300506032b657004220420', 'hex'), s]), format: 'der', type: 'pkcs8' })).export({ format: 'der', type: 'spki' }).subarray(-32));
    const first = ed.ed25519PublicKey(seed);
    expect(first).toEqual(pubOf(seed));
    first.fill(0); // the caller owns its copy
    expect(ed.ed25519PublicKey(seed)).toEqual(pubOf(seed));
    const other = seed.slice();
    seed.set(crypto.randomBytes(32)); // the same buffer, another seed
    expect(ed.ed25519PublicKey(seed)).toEqual(pubOf(seed));
    expect(ed.ed25519PublicKey(other)).toEqual(pubOf(other));
  });
});
