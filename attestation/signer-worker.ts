// A piscina worker of the signer pool. The node's seed arrives once, in workerData.
import { workerData } from 'node:worker_threads';
import { signPayloads, type BatchSignatures, type SignBatchTask } from './sign-batch.ts';
import { lowerThreadPriority } from './thread-priority.ts';
// piscina loads a task file with require() first, and Node 24's require() of an ES module aborted
// the whole process now and then (an assertion in CreateRequiredModuleFacade, seen in session 21's
// test runs). A module with a top-level await cannot be required: piscina imports it instead.
await Promise.resolve();

const { seed, nice } = workerData as { seed: Uint8Array; nice?: number };
if (nice !== undefined) lowerThreadPriority(nice);

export default function run(task: SignBatchTask): BatchSignatures {
  return signPayloads(seed, task);
}
