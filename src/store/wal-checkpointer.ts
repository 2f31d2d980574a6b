// Checkpoints a WAL-mode SQLite file from a worker thread, so the connection that writes it (on the
// event loop) never runs one: its automatic checkpoint is off, and its owner runs one itself only
// should the worker fall behind (past FALLBACK_CHECKPOINT_PAGES), bounding the WAL all the same.
import { Worker } from 'node:worker_threads';
import type { CheckpointerReply, CheckpointerRequest } from './wal-checkpointer-worker.ts';
import type { SqliteSeal } from './sqlite-seal.ts';

const WORKER_URL = new URL(import.meta.url.endsWith('.ts') ? './wal-checkpointer-worker.ts' : './wal-checkpointer-worker.js', import.meta.url);

/** WAL pages past which the writer's owner checkpoints it itself, a fallback: 10,000 pages (~40 MiB of WAL). */
export const FALLBACK_CHECKPOINT_PAGES = 10_000;

export class WalCheckpointer {
  private readonly worker: Worker;
  private closed: Promise<void> | undefined;
  /** Resolves when the thread has ended, however it ended (a close, an error that killed it). */
  private readonly exited: Promise<void>;

  /**
   * Checkpoints `file` every `intervalMs`; `onError` is told a failure once a run of them (and the
   * thread's end, should it die). With `seal`, a checkpoint runs only while the files are as SQLite
   * left them (sqlite-seal.ts), and is skipped otherwise: whoever checks the seal says why.
   */
  constructor(file: string, opts: { intervalMs?: number; onError?: (message: string) => void; seal?: SqliteSeal } = {}) {
    const onError = opts.onError ?? (() => {});
    this.worker = new Worker(WORKER_URL, { workerData: { file, intervalMs: opts.intervalMs ?? 1000, seal: opts.seal?.share() } });
    this.worker.unref(); // (it never holds the process open)
    this.exited = new Promise<void>((resolve) => this.worker.once('exit', () => resolve()));
    this.worker.on('message', (m: CheckpointerReply) => {
      if (m.type === 'error') onError(m.message);
      else if (m.type === 'closed') void this.worker.terminate().catch(() => {});
    });
    this.worker.on('error', (e: Error) => onError(`the checkpoint thread failed: ${e.message}`));
  }

  /** Stops the thread (after a checkpoint under way, if any); resolves at once if it has already ended. */
  close(): Promise<void> {
    if (!this.closed) {
      try {
        this.worker.postMessage({ type: 'close' } satisfies CheckpointerRequest);
      } catch {
        // (the thread has ended: nothing to tell)
      }
      this.closed = this.exited;
    }
    return this.closed;
  }
}
