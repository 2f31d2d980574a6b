// The receipt log's writer thread: commits signed batches to SQLite in the order they arrive, one
// transaction (one fsync) each, and acknowledges each once it is on disk. Keeps fsync waits and
// SQLite work off the event loop and off the signing threads.
import { parentPort, workerData } from 'node:worker_threads';
import type { SignedBatch } from '../../attestation/sign-batch.ts';
import { makeInserter, openDb } from './log-writer.ts';
import { lowerThreadPriority } from '../../attestation/thread-priority.ts';

export type WriterRequest =
  | { type: 'commit'; batch: number; firstSeq: number; requestKeys: Float64Array; signed: SignedBatch }
  | { type: 'close' };
export type WriterReply = { type: 'committed'; batch: number } | { type: 'failed'; batch: number; message: string } | { type: 'closed' };

// The writer mostly waits on fsync; what it computes is small, and the event loop comes first.
lowerThreadPriority(5);
const db = openDb((workerData as { file: string }).file);
const insert = makeInserter(db); // (after one failure it commits nothing more)

parentPort!.on('message', (m: WriterRequest) => {
  if (m.type === 'close') {
    db.close();
    parentPort!.postMessage({ type: 'closed' } satisfies WriterReply);
    return;
  }
  let reply: WriterReply = { type: 'committed', batch: m.batch };
  try {
    insert(m.firstSeq, m.requestKeys, m.signed);
  } catch (e) {
    reply = { type: 'failed', batch: m.batch, message: (e as Error).message };
  }
  parentPort!.postMessage(reply);
});
