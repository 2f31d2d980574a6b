// What the gateway says when its records file fails. A full disk fails every request's record:
// said at once, then at most every 10 s per kind of failure with how many were not said, so a
// busy gateway writes a line every few seconds, not one a request (on what may be the full disk).
// Each kind (read, write, drop: a change given up) has its own pace, so one never hides another.
import { RepeatLimit } from '../ops/repeat-limit.ts';
import type { FileOp } from './records.ts';

export const RECORDS_FILE_ERROR = {
  read: 'request records file could not be read',
  write: 'request record not written to the records file (kept in memory, written again later)',
  drop: 'request record change given up unwritten: the records file has failed too long',
} as const;

interface ErrorLog {
  error(fields: Record<string, unknown>, msg: string): void;
}

export function recordsFileErrors(log: ErrorLog, everyMs = 10_000, now?: () => number): (e: Error, id: string, op: FileOp) => void {
  const limits = new Map<FileOp, RepeatLimit>();
  return (e, id, op) => {
    let limit = limits.get(op);
    if (!limit) limits.set(op, (limit = new RepeatLimit(everyMs, now)));
    const unsaid = limit.take();
    if (unsaid === undefined) return;
    log.error({ request_id: id, op, err: e.message, ...(unsaid > 0 ? { failures_since_last_line: unsaid } : {}) }, RECORDS_FILE_ERROR[op]);
  };
}
