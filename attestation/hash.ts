// SHA-2 digests: Node's native implementation when present (found at run time, never imported, so
// browsers bundle this file unchanged), @noble/hashes otherwise. Both give the same bytes.
import { sha256 as nobleSha256, sha512 as nobleSha512 } from '@noble/hashes/sha2.js';
import { nodeCrypto } from './platform.ts';

const native = nodeCrypto();

export function sha256(data: Uint8Array): Uint8Array {
  if (native) return native.hash('sha256', data);
  return nobleSha256(data);
}

export function sha512(data: Uint8Array): Uint8Array {
  if (native) return native.hash('sha512', data);
  return nobleSha512(data);
}
