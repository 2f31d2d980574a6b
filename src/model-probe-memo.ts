// The verdicts of the model probe (adapters/model-probe.ts) that passed, kept in the data dir
// (`model-probes.json`) and for the life of the process, so that a restart on the same model file
// does not load it twice. A tolerant file: one that cannot be read or is not ours counts as empty
// (the model is probed again), and one that cannot be written is not a reason to refuse a start.
import fs from 'node:fs';
import path from 'node:path';
import type { ProbeMemo } from '../adapters/model-probe.ts';
import { writeFileAtomic } from './atomic-file.ts';
import { readTextFile } from './read-text-file.ts';

export const PROBE_MEMO_FILE = 'model-probes.json';
/** Verdicts kept: the latest this many (a node serves a few models; old files drop out). */
const KEEP = 64;
/** 64 verdicts take ~10 KB: a larger file is not one this node wrote. */
const MAX_BYTES = 1 << 20;

/** Verdicts of models this process started on (a second node started in it, as the tests do, shares them). */
const seen = new Set<string>();

export function dataDirProbeMemo(dataDir: string): ProbeMemo {
  const file = path.join(dataDir, PROBE_MEMO_FILE);
  const read = (): string[] => {
    try {
      // (only a regular file of a sane size: not a symlink to /dev/zero, a FIFO that never ends, 200 MB)
      const v = JSON.parse(readTextFile(file, MAX_BYTES)) as { passed?: unknown };
      return Array.isArray(v.passed) ? v.passed.filter((k): k is string => typeof k === 'string') : [];
    } catch {
      return [];
    }
  };
  return {
    known: (key) => seen.has(key) || read().includes(key),
    remember(key) {
      seen.add(key);
      const kept = read();
      if (kept.includes(key)) return;
      const passed = [...kept, key].slice(-KEEP);
      try {
        writeFileAtomic(file, (fd) => fs.writeSync(fd, `${JSON.stringify({ v: 1, passed }, null, 1)}\n`), 0o600, { fsync: false });
      } catch {
        // (a full disk: the next start probes again)
      }
    },
  };
}
