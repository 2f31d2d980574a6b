// Builds small exported receipt logs in temp dirs and tampers with them, for the audit tests.
// The provider seed is created here (not by `seller-node init`) so a test can re-sign receipts and
// checkpoints with the right key and show which check catches what.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fromBase64, toBase64, toHex, utf8 } from '../../attestation/bytes.ts';
import { canonicalize } from '../../attestation/canonical-json.ts';
import { receiptLogOrigin, signCheckpoint } from '../../attestation/checkpoint.ts';
import { serializeEnvelope, signEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import { ed25519PublicKey } from '../../attestation/ed25519.ts';
import { RECEIPT_PAYLOAD_TYPE } from '../../attestation/receipt.ts';
import { exportLog } from '../../src/store/export.ts';
import { ReceiptLog } from '../../src/store/receipt-log.ts';
import { readPriceLists, savePriceList } from '../../src/data-dir.ts';
import { syntheticPriceList, syntheticReceiptBody } from '../../src/store/synthetic.ts';
import type { ReceiptBody } from '../../attestation/receipt.ts';

export interface BuiltLog {
  /** Temp root holding the SQLite file and the export; remove with removeTemp(). */
  root: string;
  /** The export folder (receipts.jsonl, checkpoint, checkpoints/, provider.pub, prices/). */
  exportDir: string;
  seed: Uint8Array;
  providerId: string;
  /** The version of the synthetic price list (kept in the root as a node keeps it, and exported). */
  priceVersion: string;
  origin: string;
  /** The exported lines, in order. */
  lines: string[];
  /** Sizes of the exported checkpoints. */
  checkpointSizes: number[];
  /** Root of the whole log, base64 (as the audit summary prints it). */
  rootHash: string;
  /** Merkle roots at every size 0..count (raw bytes), for tests that need an old root. */
  roots: Uint8Array[];
  totalCostMicroUsd: bigint;
  totalHoldMicroUsd: bigint;
  byStatus: Record<string, number>;
}

export function tempDir(prefix = 'seller-node-test-'): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

export function removeTemp(dir: string | undefined): void {
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
}

export function randomSeed(): Uint8Array {
  return new Uint8Array(crypto.randomBytes(32));
}

export function providerIdOf(seed: Uint8Array): string {
  return toHex(ed25519PublicKey(seed));
}

/**
 * A node's data dir as `log fill` leaves it (the synthetic price list kept in prices/): appends
 * `body(i)` (default: synthetic receipts) for i < count in awaited groups of `checkpointEvery` (so
 * the log signs one checkpoint per group: sizes checkpointEvery, 2×checkpointEvery, ..., count) and
 * exports it with the data dir's price lists, as `log export` does.
 */
export async function buildLog(opts: { count?: number; checkpointEvery?: number; seed?: Uint8Array; root?: string; body?: (i: number) => ReceiptBody } = {}): Promise<BuiltLog> {
  const count = opts.count ?? 30;
  const every = opts.checkpointEvery ?? 10;
  const seed = opts.seed ?? randomSeed();
  const root = opts.root ?? tempDir();
  const exportDir = path.join(root, 'export');
  const body = opts.body ?? syntheticReceiptBody;
  const prices = syntheticPriceList(seed, providerIdOf(seed));
  savePriceList(root, prices);
  const log = ReceiptLog.open({ path: path.join(root, 'receipts.db'), seed, threads: 0, checkpointIntervalMs: 0, checkpointEvery: every });
  const roots: Uint8Array[] = [log.root(0)];
  let totalCost = 0n;
  let totalHold = 0n;
  const byStatus: Record<string, number> = {};
  try {
    for (let done = 0; done < count; ) {
      const n = Math.min(every, count - done);
      const group = [];
      for (let i = 0; i < n; i++) group.push(log.append(body(done + i)));
      for (const r of await Promise.all(group)) {
        totalCost += BigInt(r.payload.cost_micro_usd);
        totalHold += BigInt(r.payload.hold_micro_usd);
        byStatus[r.payload.status] = (byStatus[r.payload.status] ?? 0) + 1;
      }
      done += n;
    }
    for (let s = 1; s <= count; s++) roots.push(log.root(s));
    await exportLog(log, exportDir, readPriceLists(root));
  } finally {
    await log.close();
  }
  const providerId = providerIdOf(seed);
  return {
    root,
    exportDir,
    seed,
    providerId,
    priceVersion: prices.payload.version,
    origin: receiptLogOrigin(providerId),
    lines: readReceiptLines(exportDir),
    checkpointSizes: fs
      .readdirSync(path.join(exportDir, 'checkpoints'))
      .map(Number)
      .sort((a, b) => a - b),
    rootHash: toBase64(roots[count]!),
    roots,
    totalCostMicroUsd: totalCost,
    totalHoldMicroUsd: totalHold,
    byStatus,
  };
}

/** A fresh copy of the export to tamper with. */
export function copyExport(base: BuiltLog, into: string = tempDir()): string {
  const dir = path.join(into, 'export');
  fs.cpSync(base.exportDir, dir, { recursive: true });
  return dir;
}

export function readReceiptLines(dir: string): string[] {
  const text = fs.readFileSync(path.join(dir, 'receipts.jsonl'), 'utf8');
  const lines = text.split('\n');
  if (lines.at(-1) === '') lines.pop();
  return lines;
}

export function writeReceiptLines(dir: string, lines: readonly string[]): void {
  fs.writeFileSync(path.join(dir, 'receipts.jsonl'), lines.length ? lines.join('\n') + '\n' : '');
}

/** Applies `edit` to the line list of an export and writes it back. */
export function editLines(dir: string, edit: (lines: string[]) => string[] | void): string[] {
  const lines = readReceiptLines(dir);
  const out = edit(lines) ?? lines;
  writeReceiptLines(dir, out);
  return out;
}

export function envelopeOf(line: string): DsseEnvelope {
  return JSON.parse(line) as DsseEnvelope;
}

export function payloadBytesOf(line: string): Uint8Array {
  const b = fromBase64(envelopeOf(line).payload);
  if (!b) throw new Error('payload is not base64');
  return b;
}

/** The parsed payload of an envelope line (a plain object to edit). */
export function payloadOf(line: string): Record<string, any> {
  return JSON.parse(Buffer.from(payloadBytesOf(line)).toString('utf8')) as Record<string, any>;
}

/** Replaces the payload bytes but keeps the old signature (a forgery). */
export function withPayloadKeepSig(line: string, payload: Uint8Array | Record<string, unknown>): string {
  const env = envelopeOf(line);
  const bytes = payload instanceof Uint8Array ? payload : utf8(canonicalize(payload));
  return serializeEnvelope({ ...env, payload: toBase64(bytes) });
}

/**
 * Signs payload bytes (or the canonical JSON of an object) as a receipt envelope line. keyid
 * defaults to the public key of `seed`.
 */
export function signLine(payload: Uint8Array | Record<string, unknown>, seed: Uint8Array, keyid = providerIdOf(seed)): string {
  const bytes = payload instanceof Uint8Array ? payload : utf8(canonicalize(payload));
  return serializeEnvelope(signEnvelope(RECEIPT_PAYLOAD_TYPE, bytes, { keyid, seed }));
}

/** Flips one bit of the (first) signature, keeping it canonical base64. */
export function flipSignatureBit(line: string, byte = 0, bit = 0): string {
  const env = envelopeOf(line);
  const sig = fromBase64(env.signatures[0]!.sig)!.slice();
  sig[byte]! ^= 1 << bit;
  return serializeEnvelope({ ...env, signatures: [{ ...env.signatures[0]!, sig: toBase64(sig) }] });
}

/** A validly signed checkpoint note of `size` with `rootHash`, by `seed` under `origin`. */
export function makeCheckpoint(seed: Uint8Array, origin: string, size: number, rootHash: Uint8Array, name = origin): string {
  return signCheckpoint({ origin, size, rootHash }, { name, seed });
}

export function writeCheckpointFile(dir: string, name: string, note: string): void {
  fs.writeFileSync(path.join(dir, name), note);
}

/** Removes `checkpoint` and every file in `checkpoints/`. */
export function removeCheckpoints(dir: string): void {
  fs.rmSync(path.join(dir, 'checkpoint'), { force: true });
  fs.rmSync(path.join(dir, 'checkpoints'), { recursive: true, force: true });
}
