// The receipt log's writer thread: commits signed batches to SQLite in the order they arrive, one
// transaction (one fsync) each, and acknowledges each once it is on disk. Keeps fsync waits and
// SQLite work off the event loop and off the signing threads. Before each commit (and each
// checkpoint) it looks whether the log's files were changed in place under it (sqlite-seal.ts).
import { parentPort, workerData } from 'node:worker_threads';
import type { SignedBatch } from '../../attestation/sign-batch.ts';
import { FilesChangedError, makeInserter, openDb, type CommitMark } from './log-writer.ts';
import { SqliteSeal, type SharedSeal } from './sqlite-seal.ts';
import { lowerThreadPriority } from '../../attestation/thread-priority.ts';

export type WriterRequest =
  | { type: 'commit'; batch: number; firstSeq: number; requestKeys: Float64Array; signed: SignedBatch }
  | { type: 'halt' }
  | { type: 'close' };
export type WriterReply =
  // (the payload bytes come back, moved: the log keeps the batch until the database file holds it)
  | { type: 'committed'; batch: number; mark: CommitMark | undefined; payloads: Uint8Array }
  | { type: 'failed'; batch: number; message: string; problem?: FilesChangedError['problem'] }
  | { type: 'halted' }
  | { type: 'closed' };

// The writer mostly waits on fsync; what it computes is small, and the event loop comes first.
lowerThreadPriority(5);
const { file, seal } = workerData as { file: string; seal: SharedSeal };
const db = openDb(file);
const insert = makeInserter(db, SqliteSeal.shared(seal)); // (after one failure it commits nothing more)

parentPort!.on('message', (m: WriterRequest) => {
  if (m.type === 'close') {
    db.close();
    parentPort!.postMessage({ type: 'closed' } satisfies WriterReply);
    return;
  }
  if (m.type === 'halt') {
    insert.stop(new Error('the receipt log has stopped'));
    parentPort!.postMessage({ type: 'halted' } satisfies WriterReply);
    return;
  }
  let reply: WriterReply;
  try {
    const mark = insert(m.firstSeq, m.requestKeys, m.signed);
    reply = { type: 'committed', batch: m.batch, mark, payloads: m.signed.payloads };
  } catch (e) {
    reply = { type: 'failed', batch: m.batch, message: (e as Error).message, ...(e instanceof FilesChangedError ? { problem: e.problem } : {}) };
  }
  parentPort!.postMessage(reply, reply.type === 'committed' ? [reply.payloads.buffer as ArrayBuffer] : []);
});
