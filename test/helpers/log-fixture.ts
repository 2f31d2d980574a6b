// Receipt logs opened in temporary folders for the tamper and close tests, with what they said
// (onNotice) kept; `cleanup()` closes what is still open and removes the folders.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ReceiptLog, type ReceiptLogOptions } from '../../src/store/receipt-log.ts';
import { SqliteSeal } from '../../src/store/sqlite-seal.ts';
import { syntheticReceiptBody } from '../../src/store/synthetic.ts';

export type Notice = { m: string; level: 'warn' | 'error' };
export const seed = (): Uint8Array => new Uint8Array(crypto.randomBytes(32));
export const errorsOf = (notices: Notice[]): string[] => notices.filter((n) => n.level === 'error').map((n) => n.m);

export function logFixture(prefix: string) {
  const dirs: string[] = [];
  const logs: ReceiptLog[] = [];
  return {
    async cleanup(): Promise<void> {
      for (const l of logs.splice(0)) await l.close().catch(() => undefined);
      for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
    },
    tmp(): string {
      const d = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
      dirs.push(d);
      return d;
    },
    /** A log on `file` without signer threads or timed checkpoints, its notices pushed to `notices`. */
    open(file: string, s: Uint8Array, notices: Notice[], extra: Partial<ReceiptLogOptions> = {}): ReceiptLog {
      const l = ReceiptLog.open({ path: file, seed: s, threads: 0, checkpointIntervalMs: 0, onNotice: (m, level) => void notices.push({ m, level }), ...extra });
      logs.push(l);
      return l;
    },
    async closeLog(l: ReceiptLog): Promise<void> {
      logs.splice(logs.indexOf(l), 1);
      await l.close();
    },
  };
}

export async function fill(l: ReceiptLog, from: number, n: number): Promise<void> {
  for (let i = from; i < from + n; i++) await l.append(syntheticReceiptBody(i));
}

/** Appends receipts until some of them are not yet in the database file (its WAL holds them alone). */
export async function untilSomeOnlyInWal(l: ReceiptLog, file: string, from: number): Promise<number> {
  const seal = SqliteSeal.attach(file); // (the log's own descriptors: none is closed under SQLite)
  try {
    let n = from;
    for (;;) {
      const at = seal.index()!;
      if (at.mxFrame > at.nBackfill) return n;
      await l.append(syntheticReceiptBody(n++));
    }
  } finally {
    seal.release();
  }
}
