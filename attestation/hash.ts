// SHA-2 digests: Node's native implementation when present (found at run time, never imported, so
// browsers bundle this file unchanged), @noble/hashes otherwise. Both give the same bytes.
import { sha256 as nobleSha256, sha512 as nobleSha512 } from '@noble/hashes/sha2.js';
import { nodeCrypto } from './platform.ts';
import { toHex, utf8 } from './bytes.ts';

const native = nodeCrypto();

export function sha256(data: Uint8Array): Uint8Array {
  if (native) return native.hash('sha256', data);
  return nobleSha256(data);
}

/** SHA-256 of a string's UTF-8 bytes. */
export function sha256Text(s: string): Uint8Array {
  if (native) return native.hash('sha256', s);
  return nobleSha256(utf8(s));
}

/** SHA-256 as lowercase hex, of bytes or of a string's UTF-8 bytes. */
export function sha256Hex(data: Uint8Array | string): string {
  if (native) return native.hashHex('sha256', data);
  return toHex(nobleSha256(typeof data === 'string' ? utf8(data) : data));
}

/** SHA-256 of the parts laid end to end; strings count as their UTF-8 bytes. */
export function sha256Parts(...parts: (Uint8Array | string)[]): Uint8Array {
  if (native) return native.hashParts('sha256', parts);
  const h = nobleSha256.create();
  for (const p of parts) h.update(typeof p === 'string' ? utf8(p) : p);
  return h.digest();
}

export function sha512(data: Uint8Array): Uint8Array {
  if (native) return native.hash('sha512', data);
  return nobleSha512(data);
}
