// The signer pool: worker threads that sign batches of payloads so the event loop stays free.
// Payload bytes (and so seq and prev) are fixed by the caller before they arrive here; the pool
// only signs, serialises the envelope and hashes the leaf, all of which is deterministic, so a
// chunk whose worker dies is simply signed again in-process and nothing is lost or reordered.
import { Piscina } from 'piscina';
import { signBatch, SIGNED_ITEM_BYTES, type SignBatchTask } from './sign-batch.ts';

export interface SignedBatch {
  signatures: Uint8Array[];
  leafHashes: Uint8Array[];
}

export interface SignerPoolOptions {
  seed: Uint8Array;
  keyid: string;
  /** Worker threads; 0 signs in-process (for tools that sign a handful). Default: 2. */
  threads?: number;
  /** Payloads per worker task. Default 64. */
  chunk?: number;
}

// Workers load this file's sibling: .ts from source (Node strips the types), .js once built.
const WORKER_URL = new URL(import.meta.url.endsWith('.ts') ? './signer-worker.ts' : './signer-worker.js', import.meta.url);

export class SignerPool {
  readonly keyid: string;
  private readonly seed: Uint8Array;
  private readonly chunk: number;
  private pool: Piscina | undefined;
  private workerFailures = 0;

  constructor(opts: SignerPoolOptions) {
    if (opts.seed.length !== 32) throw new RangeError('an Ed25519 seed is 32 bytes');
    this.seed = opts.seed;
    this.keyid = opts.keyid;
    this.chunk = opts.chunk ?? 64;
    const threads = opts.threads ?? 2;
    if (threads > 0) {
      this.pool = new Piscina({
        filename: WORKER_URL.href,
        minThreads: threads,
        maxThreads: threads,
        idleTimeout: Infinity,
        workerData: { seed: this.seed },
      });
    }
  }

  /** Worker tasks that failed and were signed in-process instead. */
  get fallbacks(): number {
    return this.workerFailures;
  }

  async sign(payloadType: string, payloads: readonly Uint8Array[]): Promise<SignedBatch> {
    const parts: Promise<Uint8Array>[] = [];
    const per = this.pool ? Math.max(1, Math.min(this.chunk, Math.ceil(payloads.length / this.pool.maxThreads))) : payloads.length;
    for (let i = 0; i < payloads.length; i += per) parts.push(this.signChunk(task(payloadType, this.keyid, payloads.slice(i, i + per))));
    const signatures: Uint8Array[] = [];
    const leafHashes: Uint8Array[] = [];
    for (const out of await Promise.all(parts)) {
      for (let o = 0; o < out.length; o += SIGNED_ITEM_BYTES) {
        signatures.push(out.subarray(o, o + 64));
        leafHashes.push(out.subarray(o + 64, o + SIGNED_ITEM_BYTES));
      }
    }
    return { signatures, leafHashes };
  }

  private async signChunk(t: SignBatchTask): Promise<Uint8Array> {
    if (!this.pool) return signBatch(this.seed, t);
    try {
      return (await this.pool.run(t)) as Uint8Array;
    } catch {
      this.workerFailures++;
      return signBatch(this.seed, t);
    }
  }

  async close(): Promise<void> {
    const p = this.pool;
    this.pool = undefined;
    await p?.destroy();
  }
}

function task(payloadType: string, keyid: string, payloads: readonly Uint8Array[]): SignBatchTask {
  let total = 0;
  for (const p of payloads) total += p.length;
  const buf = new Uint8Array(total);
  const lengths = new Uint32Array(payloads.length);
  let off = 0;
  payloads.forEach((p, i) => {
    buf.set(p, off);
    off += p.length;
    lengths[i] = p.length;
  });
  return { payloadType, keyid, payloads: buf, lengths };
}
