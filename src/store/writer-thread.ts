// The main-thread side of the receipt log's writer: a worker thread that commits batches in the
// order they are handed over, or (for small tools) the same commits done in-process.
import { Worker } from 'node:worker_threads';
import type Database from 'better-sqlite3';
import type { SignedBatch } from '../../attestation/sign-batch.ts';
import { makeInserter } from './log-writer.ts';
import type { WriterReply, WriterRequest } from './log-writer-worker.ts';

export interface BatchWriter {
  /**
   * Resolves once the batch is committed (fsynced). Batches commit in call order. The batch's
   * payload bytes may be handed over, not copied: the caller must not read them afterwards.
   */
  commit(batch: number, firstSeq: number, requestKeys: Float64Array, signed: SignedBatch): Promise<void>;
  close(): Promise<void>;
}

const WORKER_URL = new URL(import.meta.url.endsWith('.ts') ? './log-writer-worker.ts' : './log-writer-worker.js', import.meta.url);

export class WriterThread implements BatchWriter {
  private readonly worker: Worker;
  private readonly waiting = new Map<number, { resolve: () => void; reject: (e: Error) => void }>();
  private dead: Error | undefined;
  private closing: ((v: void) => void) | undefined;

  constructor(file: string) {
    this.worker = new Worker(WORKER_URL, { workerData: { file } });
    this.worker.on('message', (m: WriterReply) => {
      if (m.type === 'closed') return this.closing?.();
      const w = this.waiting.get(m.batch);
      this.waiting.delete(m.batch);
      if (m.type === 'committed') w?.resolve();
      else w?.reject(new Error(m.message));
    });
    this.worker.on('error', (e: Error) => this.die(e));
    this.worker.on('exit', (code) => this.die(new Error(`the receipt writer thread exited (${code})`)));
  }

  private die(e: Error): void {
    this.dead ??= e;
    for (const w of this.waiting.values()) w.reject(this.dead);
    this.waiting.clear();
    this.closing?.();
  }

  commit(batch: number, firstSeq: number, requestKeys: Float64Array, signed: SignedBatch): Promise<void> {
    if (this.dead) return Promise.reject(this.dead);
    return new Promise<void>((resolve, reject) => {
      this.waiting.set(batch, { resolve, reject });
      // The payload bytes move to the writer (no copy): the log keeps the payload text instead.
      this.worker.postMessage({ type: 'commit', batch, firstSeq, requestKeys, signed } satisfies WriterRequest, [signed.payloads.buffer as ArrayBuffer]);
    });
  }

  async close(): Promise<void> {
    if (this.dead) return;
    await new Promise<void>((resolve) => {
      this.closing = resolve;
      this.worker.postMessage({ type: 'close' } satisfies WriterRequest);
    });
    await this.worker.terminate();
  }
}

export class InProcessWriter implements BatchWriter {
  private readonly insert: ReturnType<typeof makeInserter>;
  constructor(db: Database.Database) {
    this.insert = makeInserter(db);
  }
  async commit(_batch: number, firstSeq: number, requestKeys: Float64Array, signed: SignedBatch): Promise<void> {
    this.insert(firstSeq, requestKeys, signed);
  }
  async close(): Promise<void> {}
}
