// The signing work of the receipt log, shared by its worker threads and its in-process mode: for
// each canonical payload, the Ed25519 signature over PAE and the Merkle leaf hash of the finished
// envelope line. A batch travels as flat buffers (the payloads' bytes laid end to end, their
// offsets, the signatures, the leaf hashes): one copy across the thread boundary, one row in SQLite.
import { base64Slicer, toBase64 } from './bytes.ts';
import { envelopeLineMiddle, paeInScratch } from './dsse.ts';
import { ed25519Sign } from './ed25519.ts';
import { sha256Text } from './hash.ts';

export interface SignBatchTask {
  payloadType: string;
  keyid: string;
  /** The UTF-8 canonical payloads laid end to end, in seq order; payload i is bytes offsets[i]..offsets[i+1]. */
  payloads: Uint8Array;
  offsets: Uint32Array;
}

/** What signing adds to a batch. */
export interface BatchSignatures {
  /** 64 bytes a payload. */
  sigs: Uint8Array;
  /** 32 bytes a payload: the Merkle leaf hash of its envelope line. */
  leaves: Uint8Array;
}

export interface SignedBatch extends BatchSignatures {
  payloads: Uint8Array;
  offsets: Uint32Array;
}

/** Payloads laid end to end, as a batch holds them. */
export function packPayloads(parts: readonly Uint8Array[]): { payloads: Uint8Array; offsets: Uint32Array } {
  const offsets = new Uint32Array(parts.length + 1);
  for (let i = 0; i < parts.length; i++) offsets[i + 1] = offsets[i]! + parts[i]!.length;
  const payloads = new Uint8Array(offsets[parts.length]!);
  for (let i = 0; i < parts.length; i++) payloads.set(parts[i]!, offsets[i]);
  return { payloads, offsets };
}

// The PAE of one payload after another is built here (a receipt's is about a kilobyte); a larger
// one gets its own array.
const scratch = new Uint8Array(16 * 1024);

/** The signatures and leaf hashes of a batch (the worker threads return only these). */
export function signPayloads(seed: Uint8Array, task: SignBatchTask): BatchSignatures {
  const { payloads, offsets } = task;
  const n = offsets.length - 1;
  const sigs = new Uint8Array(n * 64);
  const leaves = new Uint8Array(n * 32);
  // A leaf is SHA-256(0x00 || envelope line); U+0000 is that byte in UTF-8, and the line is ASCII
  // but for its payload type and keyid (in the middle part, encoded as UTF-8 like the rest).
  const middle = envelopeLineMiddle(task.payloadType, task.keyid);
  const payloadB64 = base64Slicer(payloads);
  for (let i = 0; i < n; i++) {
    const start = offsets[i]!;
    const end = offsets[i + 1]!;
    const payload = payloads.subarray(start, end);
    const sig = ed25519Sign(seed, paeInScratch(scratch, task.payloadType, payload));
    sigs.set(sig, i * 64);
    leaves.set(sha256Text(`\u0000{"payload":"${payloadB64(start, end)}${middle}${toBase64(sig)}"}]}`), i * 32);
  }
  return { sigs, leaves };
}

/** A batch signed in-process: its payloads (the task's own arrays) with their signatures. */
export function signBatch(seed: Uint8Array, task: SignBatchTask): SignedBatch {
  return { payloads: task.payloads, offsets: task.offsets, ...signPayloads(seed, task) };
}

/** Payload i and its signature, as views into the batch. */
export function batchItem(b: SignedBatch, i: number): { payload: Uint8Array; sig: Uint8Array; leaf: Uint8Array } {
  return {
    payload: b.payloads.subarray(b.offsets[i]!, b.offsets[i + 1]!),
    sig: b.sigs.subarray(i * 64, i * 64 + 64),
    leaf: b.leaves.subarray(i * 32, i * 32 + 32),
  };
}
