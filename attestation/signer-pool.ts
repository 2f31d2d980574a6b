// The signer pool: piscina worker threads that sign batches of canonical payloads, so the event
// loop stays free and every core signs. Signing is deterministic, so a batch whose worker fails is
// signed again in-process: the same bytes, nothing lost, nothing reordered.
import { Piscina } from 'piscina';
import { signBatch, type BatchSignatures, type SignBatchTask, type SignedBatch } from './sign-batch.ts';

export interface SignerPoolOptions {
  seed: Uint8Array;
  /** Worker threads; 0 signs on the calling thread. Default 2. */
  threads?: number;
  /**
   * Nice value for the worker threads (Linux), so that they yield to the event loop. Default 10;
   * undefined leaves them at the process's priority.
   */
  nice?: number | null;
  /** The worker module (default: signer-worker beside this file). Tests swap in a failing one. */
  workerUrl?: URL;
}

// Workers load this file's sibling: .ts from source (Node strips the types), .js once built.
const WORKER_URL = new URL(import.meta.url.endsWith('.ts') ? './signer-worker.ts' : './signer-worker.js', import.meta.url);

export class SignerPool {
  readonly threads: number;
  private readonly seed: Uint8Array;
  private pool: Piscina | undefined;
  private failures = 0;
  private inFlight = 0;

  constructor(opts: SignerPoolOptions) {
    if (opts.seed.length !== 32) throw new RangeError('an Ed25519 seed is 32 bytes');
    this.seed = opts.seed;
    this.threads = opts.threads ?? 2;
    if (this.threads > 0) {
      this.pool = new Piscina({ filename: (opts.workerUrl ?? WORKER_URL).href, minThreads: this.threads, maxThreads: this.threads, idleTimeout: Infinity, workerData: { seed: opts.seed, nice: opts.nice === null ? undefined : (opts.nice ?? 10) } });
    }
  }

  /** Batches a worker failed on and that were signed in-process instead. */
  get fallbacks(): number {
    return this.failures;
  }

  /** Batches on the worker threads right now. */
  get running(): number {
    return this.inFlight;
  }

  /**
   * Signs a batch on a worker thread. With `inline`, a small batch is signed on the calling thread
   * instead while no worker is busy: a lone receipt then costs tens of microseconds of this thread
   * rather than two thread hand-offs (hundreds, on a quiet machine whose cores sleep). Under load
   * the workers are busy and batches are large, so they still do the signing.
   */
  async sign(task: SignBatchTask, opts: { inline?: boolean } = {}): Promise<SignedBatch> {
    if (!this.pool || (opts.inline && this.inFlight === 0)) return signBatch(this.seed, task);
    this.inFlight++;
    try {
      // (the payloads are copied to the worker; it returns only what signing adds)
      const signed = (await this.pool.run(task)) as BatchSignatures;
      return { payloads: task.payloads, offsets: task.offsets, sigs: signed.sigs, leaves: signed.leaves };
    } catch {
      this.failures++;
      return signBatch(this.seed, task);
    } finally {
      this.inFlight--;
    }
  }

  async close(): Promise<void> {
    const p = this.pool;
    this.pool = undefined;
    await p?.destroy();
  }
}
