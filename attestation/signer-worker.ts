// A piscina worker of the signer pool. The node's seed arrives once, in workerData.
import { workerData } from 'node:worker_threads';
import { signBatch, type SignBatchTask, type SignedBatch } from './sign-batch.ts';
import { lowerThreadPriority } from './thread-priority.ts';

const { seed, nice } = workerData as { seed: Uint8Array; nice?: number };
if (nice !== undefined) lowerThreadPriority(nice);

export default function run(task: SignBatchTask): SignedBatch {
  return signBatch(seed, task);
}
