// A worker thread of the receipt log: signs a batch, then commits it to SQLite in its turn. Batches
// are numbered by the log in seq order and a shared counter says whose turn it is, so commits land
// in seq order even though the two workers sign at the same time. The commit is the fsync: when a
// task resolves, its receipts are on disk.
import { workerData } from 'node:worker_threads';
import { move } from 'piscina';
import { signBatch } from '../../attestation/sign-batch.ts';
import { makeInserter, openDb, type WriteBatch } from './log-writer.ts';

export interface LogTask extends WriteBatch {
  batch: number;
  payloadType: string;
  keyid: string;
}

const { seed, file, turn: turnBuffer, turnTimeoutMs } = workerData as { seed: Uint8Array; file: string; turn: SharedArrayBuffer; turnTimeoutMs: number };
// turn[0]: the next batch number allowed to commit; turn[1]: non-zero once any commit failed.
const turn = new Int32Array(turnBuffer);
const db = openDb(file);
const insert = makeInserter(db);

function waitForTurn(batch: number): void {
  const deadline = Date.now() + turnTimeoutMs;
  for (;;) {
    if (Atomics.load(turn, 1) !== 0) throw new Error('an earlier batch failed to commit');
    const current = Atomics.load(turn, 0);
    if (current === batch) return;
    if (Date.now() > deadline) throw new Error(`batch ${batch} waited too long for batch ${current} to commit`);
    Atomics.wait(turn, 0, current, 100);
  }
}

function passTurn(failed: boolean): void {
  if (failed) Atomics.store(turn, 1, 1);
  Atomics.add(turn, 0, 1);
  Atomics.notify(turn, 0);
}

export default function run(task: LogTask): unknown {
  let signed: Uint8Array;
  try {
    signed = signBatch(seed, { payloadType: task.payloadType, keyid: task.keyid, payloads: task.payloads, lengths: task.lengths });
  } catch (e) {
    // Let the batches before this one commit, then stop every batch after it.
    waitForTurn(task.batch);
    passTurn(true);
    throw e;
  }
  waitForTurn(task.batch);
  let failed = true;
  try {
    insert(task, signed);
    failed = false;
  } finally {
    passTurn(failed);
  }
  return move(signed);
}
