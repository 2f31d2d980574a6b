// The signing work of the signer pool, shared by its worker threads and its in-process fallback:
// for each payload, the Ed25519 signature over PAE and the Merkle leaf hash of the finished
// envelope. Results are packed into one buffer (64-byte signature ‖ 32-byte leaf hash per payload)
// so a batch crosses the thread boundary as a single transfer.
import { toBase64 } from './bytes.ts';
import { pae, serializeEnvelope } from './dsse.ts';
import { ed25519Sign } from './ed25519.ts';
import { leafHash } from './merkle.ts';
import { utf8 } from './bytes.ts';

export interface SignBatchTask {
  payloadType: string;
  keyid: string;
  /** Payloads laid end to end; `lengths[i]` bytes each. */
  payloads: Uint8Array;
  lengths: Uint32Array;
}

export const SIGNED_ITEM_BYTES = 96;

export function signBatch(seed: Uint8Array, task: SignBatchTask): Uint8Array {
  const n = task.lengths.length;
  const out = new Uint8Array(n * SIGNED_ITEM_BYTES);
  let off = 0;
  for (let i = 0; i < n; i++) {
    const len = task.lengths[i]!;
    const payload = task.payloads.subarray(off, off + len);
    off += len;
    const sig = ed25519Sign(seed, pae(task.payloadType, payload));
    const line = serializeEnvelope({
      payload: toBase64(payload),
      payloadType: task.payloadType,
      signatures: [{ keyid: task.keyid, sig: toBase64(sig) }],
    });
    out.set(sig, i * SIGNED_ITEM_BYTES);
    out.set(leafHash(utf8(line)), i * SIGNED_ITEM_BYTES + 64);
  }
  return out;
}
