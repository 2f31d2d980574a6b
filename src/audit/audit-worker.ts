// Worker thread of `seller-node audit`.
import { checkChunk, type CheckTask } from './check-lines.ts';

export default function run(task: CheckTask) {
  return checkChunk(task);
}
