// Lowers the scheduling priority of the calling worker thread (Linux: a thread has its own nice
// value, and /proc/thread-self names its id). Background signing then yields the CPU to the event
// loop that serves requests, instead of stretching its latency by whole scheduler time slices.
// Anywhere else, or without permission, it does nothing.
import fs from 'node:fs';
import os from 'node:os';

export function lowerThreadPriority(nice = 10): boolean {
  try {
    const tid = Number(fs.readlinkSync('/proc/thread-self').split('/').pop());
    if (!Number.isSafeInteger(tid) || tid <= 0) return false;
    os.setPriority(tid, Math.min(19, Math.max(os.getPriority(tid), nice)));
    return true;
  } catch {
    return false;
  }
}
