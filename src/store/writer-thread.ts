// The main-thread side of the receipt log's writer: a worker thread that commits batches in the
// order they are handed over, or (for small tools) the same commits done in-process.
import { Worker } from 'node:worker_threads';
import type Database from 'better-sqlite3';
import type { SignedBatch } from '../../attestation/sign-batch.ts';
import { FilesChangedError, makeInserter, type CommitMark, type Inserter } from './log-writer.ts';
import type { WriterReply, WriterRequest } from './log-writer-worker.ts';
import type { SqliteSeal } from './sqlite-seal.ts';

export interface BatchWriter {
  /**
   * Resolves once the batch is committed (fsynced), with where it is in the WAL. Batches commit in
   * call order. The batch's payload bytes may be moved to another thread for the commit: they are
   * the caller's again when it resolves (`signed.payloads`, possibly another array). Rejects with a
   * FilesChangedError when the log's files were changed in place.
   */
  commit(batch: number, firstSeq: number, requestKeys: Float64Array, signed: SignedBatch): Promise<CommitMark | undefined>;
  /** Commits nothing more; resolves once a commit under way has ended. */
  halt(): Promise<void>;
  close(): Promise<void>;
}

const WORKER_URL = new URL(import.meta.url.endsWith('.ts') ? './log-writer-worker.ts' : './log-writer-worker.js', import.meta.url);

export class WriterThread implements BatchWriter {
  private readonly worker: Worker;
  private readonly waiting = new Map<number, { signed: SignedBatch; resolve: (m: CommitMark | undefined) => void; reject: (e: Error) => void }>();
  private dead: Error | undefined;
  private closed = false;
  private closing: ((v: void) => void) | undefined;
  private halting: (() => void)[] = [];

  constructor(file: string, seal: SqliteSeal) {
    this.worker = new Worker(WORKER_URL, { workerData: { file, seal: seal.share() } });
    this.worker.on('message', (m: WriterReply) => {
      if (m.type === 'closed') return this.closing?.();
      if (m.type === 'halted') return this.halted();
      const w = this.waiting.get(m.batch);
      this.waiting.delete(m.batch);
      if (!w) return;
      if (m.type === 'committed') {
        w.signed.payloads = m.payloads;
        w.resolve(m.mark);
      } else w.reject(m.problem ? new FilesChangedError(m.problem) : new Error(m.message));
    });
    this.worker.on('error', (e: Error) => this.die(e));
    this.worker.on('exit', (code) => this.die(new Error(`the receipt writer thread exited (${code})`)));
  }

  private die(e: Error): void {
    this.dead ??= e;
    for (const w of this.waiting.values()) w.reject(this.dead);
    this.waiting.clear();
    this.halted();
    this.closing?.();
  }

  private halted(): void {
    for (const wake of this.halting.splice(0)) wake();
  }

  commit(batch: number, firstSeq: number, requestKeys: Float64Array, signed: SignedBatch): Promise<CommitMark | undefined> {
    if (this.dead) return Promise.reject(this.dead);
    return new Promise<CommitMark | undefined>((resolve, reject) => {
      this.waiting.set(batch, { signed, resolve, reject });
      // The payload bytes move to the writer (no copy), and come back with its reply.
      this.worker.postMessage({ type: 'commit', batch, firstSeq, requestKeys, signed } satisfies WriterRequest, [signed.payloads.buffer as ArrayBuffer]);
    });
  }

  halt(): Promise<void> {
    if (this.dead || this.closed) return Promise.resolve();
    return new Promise<void>((resolve) => {
      this.halting.push(resolve);
      this.worker.postMessage({ type: 'halt' } satisfies WriterRequest);
    });
  }

  async close(): Promise<void> {
    if (this.dead || this.closed) return;
    this.closed = true;
    await new Promise<void>((resolve) => {
      this.closing = resolve;
      this.worker.postMessage({ type: 'close' } satisfies WriterRequest);
    });
    await this.worker.terminate();
  }
}

export class InProcessWriter implements BatchWriter {
  private readonly insert: Inserter;
  constructor(db: Database.Database, seal: SqliteSeal) {
    this.insert = makeInserter(db, seal);
  }
  async commit(_batch: number, firstSeq: number, requestKeys: Float64Array, signed: SignedBatch): Promise<CommitMark | undefined> {
    return this.insert(firstSeq, requestKeys, signed);
  }
  async halt(): Promise<void> {
    this.insert.stop(new Error('the receipt log has stopped'));
  }
  async close(): Promise<void> {}
}
