// Optional native speed-ups. The verifier must run in a browser, so nothing here imports a `node:`
// module: Node's crypto is looked up at run time through process.getBuiltinModule (Node 22.3+).
// Everything that uses it has a pure-TypeScript fallback that gives identical answers.

import { bytesEqual, concatBytes, copyBytes } from './bytes.ts';

/** The parts of node:crypto that this package uses. */
export interface NativeCrypto {
  /** The digest of bytes, or of a string's UTF-8 bytes. */
  hash(algorithm: 'sha256' | 'sha512', data: Uint8Array | string): Uint8Array;
  /** The digest as lowercase hex. */
  hashHex(algorithm: 'sha256' | 'sha512', data: Uint8Array | string): string;
  /** The digest of the parts laid end to end; strings count as their UTF-8 bytes. */
  hashParts(algorithm: 'sha256' | 'sha512', parts: readonly (Uint8Array | string)[]): Uint8Array;
  ed25519Sign(seed: Uint8Array, message: Uint8Array): Uint8Array;
  ed25519Verify(publicKey: Uint8Array, message: Uint8Array, signature: Uint8Array): boolean;
}

interface NodeHash {
  update(d: Uint8Array | string): NodeHash;
  digest(encoding: 'hex' | 'latin1'): string;
}

interface NodeCryptoModule {
  createHash(alg: string): NodeHash;
  hash?: (alg: string, data: Uint8Array | string, enc: 'hex' | 'latin1') => string;
  createPrivateKey(o: { key: Uint8Array; format: 'der'; type: 'pkcs8' }): unknown;
  createPublicKey(o: { key: Uint8Array; format: 'der'; type: 'spki' }): unknown;
  sign(alg: null, data: Uint8Array, key: unknown): Uint8Array;
  verify(alg: null, data: Uint8Array, key: unknown, sig: Uint8Array): boolean;
}

// DER prefixes that wrap a raw Ed25519 key (RFC 8410).
const PKCS8_PREFIX = Uint8Array.of(0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20);
const SPKI_PREFIX = Uint8Array.of(0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00);

let cached: NativeCrypto | null | undefined;
let disabled = false;

/** Node's crypto when running on Node, undefined in a browser (or after disableNativeCrypto). */
export function nodeCrypto(): NativeCrypto | undefined {
  if (disabled) return undefined;
  if (cached !== undefined) return cached ?? undefined;
  cached = null;
  const proc = (globalThis as { process?: { getBuiltinModule?: (id: string) => unknown } }).process;
  const mod = proc?.getBuiltinModule?.('node:crypto') as NodeCryptoModule | undefined;
  if (mod) cached = wrap(mod);
  return cached ?? undefined;
}

/** For tests: behave as in a browser from now on. Must be called before other modules load. */
export function disableNativeCrypto(): void {
  disabled = true;
}

/**
 * Node key objects by their raw bytes: the last key compared directly (a node signs with one key,
 * a log is checked against one), others in a bounded map. Keyed by content, never by object
 * identity: a caller may reuse a buffer for another key.
 */
function keyCache(make: (raw: Uint8Array) => unknown): (raw: Uint8Array) => unknown {
  const byId = new Map<string, unknown>();
  let lastBytes: Uint8Array | undefined;
  let lastKey: unknown;
  return (raw) => {
    if (lastBytes && bytesEqual(lastBytes, raw)) return lastKey;
    const id = keyId(raw);
    let key = byId.get(id);
    if (key === undefined) {
      if (byId.size >= 1024) byId.clear();
      key = make(raw);
      byId.set(id, key);
    }
    lastBytes = copyBytes(raw);
    lastKey = key;
    return key;
  };
}

function wrap(c: NodeCryptoModule): NativeCrypto {
  const privateKey = keyCache((seed) => c.createPrivateKey({ key: concatBytes(PKCS8_PREFIX, seed), format: 'der', type: 'pkcs8' }));
  const publicKey = keyCache((raw) => c.createPublicKey({ key: concatBytes(SPKI_PREFIX, raw), format: 'der', type: 'spki' }));
  // A digest taken as a latin1 string and copied out costs half what a Buffer result does (~0.3
  // against ~0.7 µs for a Merkle node's 65 bytes: Node allocates and wraps a Buffer per call), and
  // the tree hashes one node a receipt.
  const hash = c.hash
    ? (alg: string, data: Uint8Array | string) => bytesOfLatin1(c.hash!(alg, data, 'latin1'))
    : (alg: string, data: Uint8Array | string) => bytesOfLatin1(c.createHash(alg).update(data).digest('latin1'));

  return {
    hash,
    hashHex: c.hash ? (alg, data) => c.hash!(alg, data, 'hex') : (alg, data) => c.createHash(alg).update(data).digest('hex'),
    hashParts: (alg, parts) => {
      const h = c.createHash(alg);
      for (const p of parts) h.update(p);
      return bytesOfLatin1(h.digest('latin1'));
    },
    ed25519Sign(seed, message) {
      const s = c.sign(null, message, privateKey(seed));
      return new Uint8Array(s.buffer, s.byteOffset, s.byteLength);
    },
    ed25519Verify(raw, message, signature) {
      return c.verify(null, message, publicKey(raw), signature);
    },
  };
}

/** The bytes of a latin1 string (each character one byte). */
function bytesOfLatin1(s: string): Uint8Array {
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

function keyId(bytes: Uint8Array): string {
  let s = '';
  for (let i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]!);
  return s;
}
