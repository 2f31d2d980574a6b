// The latest checkpoint a receipt log signed, kept in a file beside the log ("receipts.checkpoint"
// beside "receipts.db"), so that a log that lost receipts it had signed for is noticed when it
// opens. On its own a log cannot tell: SQLite keeps the newest receipts, and the checkpoints over
// them, in its -wal file, so a -wal file deleted or cut short (or the whole database replaced by
// an older copy) leaves a shorter log that is consistent with itself. A node that served on from
// it would sign a second, different checkpoint for a size it had signed before: a fork that every
// auditor holding the first one proves.
//
// The file holds the signed note itself. It is written (a temporary file renamed over it) after
// each checkpoint, without an fsync: a checkpoint is only ever signed over durable receipts, so a
// file that a power cut leaves older, empty or missing only protects less; it never refuses a log
// that is whole. A file that does not verify under the log's key is reported, not trusted.
import path from 'node:path';
import { bytesEqual } from '../../attestation/bytes.ts';
import { receiptLogKey, verifyCheckpoint } from '../../attestation/checkpoint.ts';
import { writeAllSync, writeFileAtomic } from '../atomic-file.ts';
import { readTextFile } from '../read-text-file.ts';

/** receipts.db → receipts.checkpoint (a name no "receipts.db*" pattern takes with the database). */
export function headPath(dbPath: string): string {
  return siblingPath(dbPath, 'checkpoint');
}

/** receipts.db → receipts.<ext>, beside it. */
function siblingPath(dbPath: string, ext: string): string {
  return path.join(path.dirname(dbPath), `${path.basename(dbPath).replace(/\.db$/, '')}.${ext}`);
}

export type Head = { kind: 'none' } | { kind: 'unreadable'; why: string } | { kind: 'head'; size: number; rootHash: Uint8Array; note: string };

/** The checkpoint kept at `file`, verified under the provider's log key. */
export function readHead(file: string, providerId: string): Head {
  let text: string;
  try {
    text = readTextFile(file, 1 << 16);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { kind: 'none' };
    return { kind: 'unreadable', why: (e as Error).message };
  }
  if (text === '') return { kind: 'unreadable', why: 'it is empty' }; // (a rename persisted before its data)
  const v = verifyCheckpoint(text, receiptLogKey(providerId)!);
  if (!v.ok) return { kind: 'unreadable', why: `${v.error.code}: ${v.error.message}` };
  return { kind: 'head', size: v.value.size, rootHash: v.value.rootHash, note: text };
}

/** Keeps `note` at `file` (no fsync: see above). Throws on a file system error. */
export function writeHead(file: string, note: string): void {
  writeFileAtomic(file, (fd) => writeAllSync(fd, note), 0o600, { fsync: false });
}

/** Why a log of `size` receipts whose root at `head.size` is `rootAt` cannot be the log that signed `head`, or undefined when it can. */
export function headMismatch(head: { size: number; rootHash: Uint8Array }, size: number, rootAt: (size: number) => Uint8Array): string | undefined {
  if (size < head.size) return `it holds ${size} receipts, but this key signed a checkpoint over ${head.size}`;
  if (!bytesEqual(rootAt(head.size), head.rootHash)) return `its first ${head.size} receipts are not the ones this key signed a checkpoint over`;
  return undefined;
}

// The receipts the log has acknowledged, which the signed checkpoint may not cover yet (it is
// signed every 10 s or 1,000 receipts): "receipts.head" holds their count and the last one's
// payload hash, rewritten at most every 100 ms as receipts become durable (never ahead of them).
// Buyers hold receipts past the last checkpoint, so a log that lost them (its -wal deleted after a
// crash) must not sign others under the same seqs.

/** receipts.db → receipts.head. */
export function chainHeadPath(dbPath: string): string {
  return siblingPath(dbPath, 'head');
}

/** The count and last payload hash kept at `file`; undefined when there is none or it cannot be read (it only ever protects). */
export function readChainHead(file: string): { size: number; lastPayloadSha256: string } | undefined {
  let text: string;
  try {
    text = readTextFile(file, 1 << 16);
  } catch {
    return undefined;
  }
  const m = /^(0|[1-9][0-9]{0,15}) ([0-9a-f]{64})\n$/.exec(text);
  return m ? { size: Number(m[1]), lastPayloadSha256: m[2]! } : undefined;
}

export function writeChainHead(file: string, size: number, lastPayloadSha256: string): void {
  writeFileAtomic(file, (fd) => writeAllSync(fd, `${size} ${lastPayloadSha256}\n`), 0o600, { fsync: false });
}
