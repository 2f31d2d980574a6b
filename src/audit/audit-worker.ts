// Worker thread of `seller-node audit`.
import { checkLines, type CheckTask } from './check-lines.ts';

export default function run(task: CheckTask) {
  return checkLines(task);
}
