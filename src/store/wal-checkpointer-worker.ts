// The state store's WAL checkpoints, on a thread of their own (wal-checkpointer.ts): a checkpoint
// copies the WAL's pages into the database and fsyncs it, which on a slow disk takes long enough
// to stall every stream if it ran on the event loop, as SQLite's automatic checkpoint would.
import { parentPort, workerData } from 'node:worker_threads';
import Database from 'better-sqlite3';
import { lowerThreadPriority } from '../../attestation/thread-priority.ts';
import { SqliteSeal, type SharedSeal } from './sqlite-seal.ts';

export type CheckpointerRequest = { type: 'close' };
export type CheckpointerReply = { type: 'error'; message: string } | { type: 'closed' };

lowerThreadPriority(5);
const { file, intervalMs, seal: shared } = workerData as { file: string; intervalMs: number; seal?: SharedSeal };
// (files changed in place by another program: no checkpoint copies what is left into the database;
// the node's file watch, on the event loop, judges and says so)
const seal = shared && SqliteSeal.shared(shared);
let db: Database.Database | undefined;
let failing = false;
const timer = setInterval(() => {
  try {
    db ??= new Database(file, { fileMustExist: true, timeout: 1000 });
    // PASSIVE: copies what no reader still needs and never waits on the writer; the writer starts
    // the WAL over from its beginning once all of it has been copied.
    if (seal) seal.checkpoint(db);
    else db.pragma('wal_checkpoint(PASSIVE)');
    failing = false;
  } catch (e) {
    // Said once a run of failures (the writer's own fallback checkpoint still bounds the WAL).
    if (!failing) parentPort!.postMessage({ type: 'error', message: (e as Error).message } satisfies CheckpointerReply);
    failing = true;
  }
}, intervalMs);

parentPort!.on('message', (m: CheckpointerRequest) => {
  if (m.type !== 'close') return;
  clearInterval(timer);
  try {
    db?.close();
  } catch {}
  parentPort!.postMessage({ type: 'closed' } satisfies CheckpointerReply);
});
