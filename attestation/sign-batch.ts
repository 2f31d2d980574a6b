// The signing work of the receipt log, shared by its worker threads and its in-process mode: for
// each canonical payload, the Ed25519 signature over PAE and the Merkle leaf hash of the finished
// envelope line. Results are packed into a few flat buffers so a batch crosses the thread boundary
// as one transfer and lands in SQLite as one row.
import { toBase64, utf8 } from './bytes.ts';
import { envelopeLine, transientPae } from './dsse.ts';
import { ed25519Sign } from './ed25519.ts';
import { leafHash } from './merkle.ts';

export interface SignBatchTask {
  payloadType: string;
  keyid: string;
  /**
   * Canonical JSON payloads in seq order, joined by "\n" (canonical JSON never holds a raw
   * newline), so a batch crosses to a worker thread as one string copy.
   */
  payloads: string;
}

export interface SignedBatch {
  /** The UTF-8 payloads laid end to end; payload i is bytes offsets[i]..offsets[i+1]. */
  payloads: Uint8Array;
  offsets: Uint32Array;
  /** 64 bytes a payload. */
  sigs: Uint8Array;
  /** 32 bytes a payload: the Merkle leaf hash of its envelope line. */
  leaves: Uint8Array;
}

export function signBatch(seed: Uint8Array, task: SignBatchTask): SignedBatch {
  const encoded = task.payloads.split('\n').map((p) => utf8(p));
  const n = encoded.length;
  const offsets = new Uint32Array(n + 1);
  for (let i = 0; i < n; i++) offsets[i + 1] = offsets[i]! + encoded[i]!.length;
  const payloads = new Uint8Array(offsets[n]!);
  const sigs = new Uint8Array(n * 64);
  const leaves = new Uint8Array(n * 32);
  for (let i = 0; i < n; i++) {
    const bytes = encoded[i]!;
    payloads.set(bytes, offsets[i]);
    const sig = ed25519Sign(seed, transientPae(task.payloadType, bytes));
    sigs.set(sig, i * 64);
    leaves.set(leafHash(envelopeLine(toBase64(bytes), task.payloadType, task.keyid, toBase64(sig))), i * 32);
  }
  return { payloads, offsets, sigs, leaves };
}

/** Payload i and its signature, as views into the batch. */
export function batchItem(b: SignedBatch, i: number): { payload: Uint8Array; sig: Uint8Array; leaf: Uint8Array } {
  return {
    payload: b.payloads.subarray(b.offsets[i]!, b.offsets[i + 1]!),
    sig: b.sigs.subarray(i * 64, i * 64 + 64),
    leaf: b.leaves.subarray(i * 32, i * 32 + 32),
  };
}
