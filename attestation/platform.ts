// Optional native speed-ups. The verifier must run in a browser, so nothing here imports a `node:`
// module: Node's crypto is looked up at run time through process.getBuiltinModule (Node 22.3+).
// Everything that uses it has a pure-TypeScript fallback that gives identical answers.

import { bytesEqual, copyBytes } from './bytes.ts';

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
  digest(): Uint8Array;
  digest(encoding: 'hex'): string;
}

interface NodeCryptoModule {
  createHash(alg: string): NodeHash;
  hash?: ((alg: string, data: Uint8Array | string, enc: 'buffer') => Uint8Array) & ((alg: string, data: Uint8Array | string, enc: 'hex') => string);
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

function wrap(c: NodeCryptoModule): NativeCrypto {
  const privateKeys = new Map<string, unknown>();
  const publicKeys = new Map<string, unknown>();
  const keyCacheLimit = 1024;
  const cache = (map: Map<string, unknown>, id: string, make: () => unknown) => {
    let k = map.get(id);
    if (k === undefined) {
      if (map.size >= keyCacheLimit) map.clear();
      k = make();
      map.set(id, k);
    }
    return k;
  };
  let lastSeed: Uint8Array | undefined;
  let lastPrivateKey: unknown;
  let lastPublicBytes: Uint8Array | undefined;
  let lastPublicKey: unknown;
  const hash = c.hash
    ? (alg: string, data: Uint8Array | string) => c.hash!(alg, data, 'buffer')
    : (alg: string, data: Uint8Array | string) => c.createHash(alg).update(data).digest();

  return {
    hash: (alg, data) => {
      const b = hash(alg, data);
      return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    },
    hashHex: c.hash ? (alg, data) => c.hash!(alg, data, 'hex') : (alg, data) => c.createHash(alg).update(data).digest('hex'),
    hashParts: (alg, parts) => {
      const h = c.createHash(alg);
      for (const p of parts) h.update(p);
      const b = h.digest();
      return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    },
    ed25519Sign(seed, message) {
      // Keyed by content, never by object identity: a caller may reuse a buffer for another key.
      // The last seed is compared directly: a node signs everything with one key.
      let key: unknown;
      if (lastSeed && bytesEqual(lastSeed, seed)) key = lastPrivateKey;
      else {
        key = cache(privateKeys, keyId(seed), () => c.createPrivateKey({ key: join(PKCS8_PREFIX, seed), format: 'der', type: 'pkcs8' }));
        lastSeed = copyBytes(seed);
        lastPrivateKey = key;
      }
      const s = c.sign(null, message, key);
      return new Uint8Array(s.buffer, s.byteOffset, s.byteLength);
    },
    ed25519Verify(publicKey, message, signature) {
      // The last key, compared by content (a caller may reuse a buffer): checking a log repeats one key.
      let key: unknown;
      if (lastPublicBytes && bytesEqual(lastPublicBytes, publicKey)) key = lastPublicKey;
      else {
        key = cache(publicKeys, keyId(publicKey), () => c.createPublicKey({ key: join(SPKI_PREFIX, publicKey), format: 'der', type: 'spki' }));
        lastPublicBytes = copyBytes(publicKey);
        lastPublicKey = key;
      }
      return c.verify(null, message, key, signature);
    },
  };
}

function join(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

function keyId(bytes: Uint8Array): string {
  let s = '';
  for (let i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]!);
  return s;
}
