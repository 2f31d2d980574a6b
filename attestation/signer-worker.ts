// A piscina worker of the signer pool. The node's seed arrives once, in workerData.
import { workerData } from 'node:worker_threads';
import { move } from 'piscina';
import { signBatch, type SignBatchTask } from './sign-batch.ts';

const seed: Uint8Array = (workerData as { seed: Uint8Array }).seed;

export default function run(task: SignBatchTask): unknown {
  const out = signBatch(seed, task);
  return move(out);
}
