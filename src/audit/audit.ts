// `seller-node audit DIR`: replays an exported receipt log and checks everything it claims. The
// provider's signed price lists (prices/<version>.json) are verified first. Each receipt is
// verified on its own in worker threads (signature, canonical payload, fields, cost, and its
// price against the list of the version it cites); the main thread checks, in file order, what
// links them: seq continuity, the prev chain, the Merkle tree and the signed checkpoints over it.
// It stops at the first fault and names its seq.
import fs from 'node:fs';
import path from 'node:path';
import { Piscina } from 'piscina';
import { fromUtf8, isHex } from '../../attestation/bytes.ts';
import type { VerifyError, VerifyErrorCode } from '../../attestation/result.ts';
import { ReceiptChain, type LogSummary } from '../../attestation/log-verify.ts';
import { verifyPriceList, type PricedVersion } from '../../attestation/price-list.ts';
import { checkChunk, type CheckedChunk, type CheckTask } from './check-lines.ts';
import { accessProblem, fsProblem, isErrnoError } from '../fs-problem.ts';
import { DEFAULT_CHUNK_BYTES, readChunks } from './chunks.ts';

export type AuditErrorCode = VerifyErrorCode | 'export_missing_file' | 'export_unreadable' | 'export_malformed';

export interface AuditFault {
  code: AuditErrorCode;
  message: string;
  seq?: string;
  line?: number;
  field?: string;
}

export interface AuditReport {
  ok: boolean;
  dir: string;
  provider?: string;
  summary?: LogSummary;
  /** The price versions of the export's price lists, each verified (when the audit got that far). */
  priceVersions?: string[];
  fault?: AuditFault;
  seconds: number;
}

export interface AuditOptions {
  dir: string;
  /** Expected provider id; when given, an export by another key fails. */
  provider?: string;
  /** Worker threads for per-receipt checks (default 2; 0 = in-process). */
  threads?: number;
  /** Bytes of receipts.jsonl per worker task (default 1 MiB). */
  chunkBytes?: number;
  /**
   * Checkpoint files (or folders of them) the auditor got earlier from this provider and kept: the
   * log must still contain each unchanged (else `checkpoint_inconsistent`). Without them an audit
   * can tell that an export agrees with itself, not that it agrees with what was published before.
   */
  kept?: readonly string[];
}

const WORKER = new URL(import.meta.url.endsWith('.ts') ? './audit-worker.ts' : './audit-worker.js', import.meta.url);

export async function audit(opts: AuditOptions): Promise<AuditReport> {
  const started = performance.now();
  const done = (r: Omit<AuditReport, 'seconds' | 'dir'>): AuditReport => ({ ...r, dir: opts.dir, seconds: (performance.now() - started) / 1000 });
  const fault = (f: AuditFault, provider?: string) => done({ ok: false, fault: f, ...(provider ? { provider } : {}) });

  let st: fs.Stats | undefined;
  try {
    st = fs.statSync(opts.dir);
  } catch (e) {
    if ((e as { code?: unknown }).code !== 'ENOENT') return fault({ code: 'export_unreadable', message: `${opts.dir}: ${fsProblem(e)}` });
    st = undefined;
  }
  if (!st?.isDirectory()) return fault({ code: 'export_missing_file', message: `${opts.dir} is not a directory` });
  const dirProblem = accessProblem(opts.dir, fs.constants.R_OK | fs.constants.X_OK);
  if (dirProblem) return fault({ code: 'export_unreadable', message: `${opts.dir}: ${dirProblem}` });
  const pubFile = path.join(opts.dir, 'provider.pub');
  const receiptsFile = path.join(opts.dir, 'receipts.jsonl');
  for (const f of [pubFile, receiptsFile]) {
    const problem = accessProblem(f, fs.constants.R_OK);
    if (problem === undefined) continue;
    if (problem !== 'missing') return fault({ code: 'export_unreadable', message: `${f}: ${problem}` });
    // A node's data dir given by mistake: say what to run first.
    const dataDir = fs.existsSync(path.join(opts.dir, 'receipts.db')) ? `; ${opts.dir} looks like a node's data dir, not an export: run seller-node log export --data ${opts.dir} --out DIR, then audit DIR` : '';
    return fault({ code: 'export_missing_file', message: `${path.basename(f)} is missing from ${opts.dir}${dataDir}` });
  }
  const provider = readSmall(pubFile)?.trim();
  if (!isHex(provider, 32)) return fault({ code: 'export_malformed', message: 'provider.pub must hold 64 lowercase hex characters' });
  if (opts.provider !== undefined && opts.provider !== provider) {
    return fault({ code: 'provider_mismatch', message: `export is by provider ${provider}, expected ${opts.provider}` }, provider);
  }
  const receiptsStat = fs.statSync(receiptsFile);
  if (!receiptsStat.isFile()) return fault({ code: 'export_malformed', message: `${receiptsFile} is not a regular file` }, provider);
  const read = readCheckpoints(opts.dir);
  if ('code' in read) return fault(read, provider);
  const kept = readKept(opts.kept ?? []);
  if ('code' in kept) return fault(kept, provider);
  const checkpoints = read.notes;
  const prices = verifyExportPriceLists(opts.dir, provider);
  if ('code' in prices) return fault(prices, provider);

  // A log of one chunk is one task: checked here, without starting (and tearing down) workers.
  const size = receiptsStat.size;
  const oneChunk = size <= (opts.chunkBytes ?? DEFAULT_CHUNK_BYTES);
  const threads = oneChunk ? 0 : (opts.threads ?? 2);
  const pool = threads > 0 ? new Piscina({ filename: WORKER.href, minThreads: threads, maxThreads: threads }) : undefined;
  const run = (task: CheckTask): Promise<CheckedChunk> => (pool ? pool.run(task) : Promise.resolve(checkChunk(task)));
  const chain = new ReceiptChain();
  const inFlight: { firstLine: number; result: Promise<CheckedChunk> }[] = [];
  const maxInFlight = Math.max(2, threads * 2);
  let failure: AuditFault | undefined;
  let lines = 0;

  const consume = (firstLine: number, c: CheckedChunk): AuditFault | undefined => {
    for (let i = 0; i < c.count; i++) {
      const line = firstLine + i;
      const seq = c.seqs[i] || undefined;
      const error = c.failures[i];
      if (error) {
        const rejected = chain.reject(error, seq);
        if (!rejected.ok) return toFault(rejected.error, line, seq);
        continue;
      }
      const added = chain.add({
        seq: c.seqs[i]!,
        prev: c.prevs[i]!,
        payloadSha256: c.payloadHashes[i]!,
        leafHash: c.leaves.subarray(i * 32, i * 32 + 32),
        costMicroUsd: BigInt(c.costs[i]!),
        holdMicroUsd: BigInt(c.holds[i]!),
        status: c.statuses[i]!,
        ticketId: c.ticketIds[i]!,
        line,
      });
      if (!added.ok) return toFault(added.error, line, seq);
    }
    return undefined;
  };
  const drainTo = async (n: number) => {
    while (inFlight.length > n && !failure) {
      const next = inFlight.shift()!;
      failure = consume(next.firstLine, await next.result);
    }
  };

  try {
    for await (const chunk of readChunks(receiptsFile, opts.chunkBytes)) {
      if ('tooLong' in chunk) {
        await drainTo(0); // an earlier fault is the first one
        failure ??= { code: 'envelope_malformed', message: `line ${chunk.tooLong} is longer than 1 MiB`, line: chunk.tooLong };
        break;
      }
      lines += chunk.lines;
      inFlight.push({ firstLine: chunk.firstLine, result: run({ provider, bytes: chunk.bytes, prices: prices.lists }) });
      await drainTo(maxInFlight - 1);
      if (failure) break;
    }
    await drainTo(0);
  } catch (e) {
    failure ??= isErrnoError(e) ? { code: 'export_unreadable', message: `${receiptsFile}: ${fsProblem(e)}` } : { code: 'export_malformed', message: `could not read ${receiptsFile}: ${(e as Error).message}` };
  } finally {
    await Promise.allSettled(inFlight.map((f) => f.result));
    await pool?.destroy();
  }
  if (failure) {
    if (failure.code === 'price_list_missing' && !prices.folder) {
      failure.message += '; the export has no prices/ folder at all: it was written before exports carried the price lists, so export the log again';
    }
    return fault(failure, provider);
  }
  if (lines === 0 && checkpoints.length === 0) return fault({ code: 'log_empty', message: 'receipts.jsonl holds no receipts' }, provider);
  const finished = chain.finish(checkpoints, provider, kept.notes);
  if (!finished.ok) {
    // "checkpoint 3: …" names a note by its place in the list: name its file(s) instead.
    // (a gap or reorder is named at the line where the missing seq belongs, as other faults are)
    const f = toFault(finished.error, chain.gapLine);
    f.message = f.message.replace(/^checkpoint (\d+): /, (all, n: string) => {
      const [first, ...same] = read.files[Number(n) - 1] ?? [];
      return first === undefined ? all : `${first}${same.length ? ` (and ${same.join(', ')})` : ''}: `;
    });
    f.message = f.message.replace(/^kept checkpoint (\d+)/, (all, n: string) => {
      const file = kept.files[Number(n) - 1];
      return file === undefined ? all : `the checkpoint you kept in ${file}`;
    });
    return fault(f, provider);
  }
  return done({ ok: true, provider, summary: finished.value, priceVersions: prices.lists.map((l) => l.version) });
}

function toFault(e: VerifyError, line?: number, seq?: string): AuditFault {
  const s = e.seq ?? seq;
  return { code: e.code, message: e.message, ...(s !== undefined ? { seq: s } : {}), ...(line !== undefined ? { line } : {}), ...(e.field ? { field: e.field } : {}) };
}

/**
 * Whether the export has an entry at `p`: a symlink counts, dangling or looping (existsSync would
 * answer false, and the audit would pass over an unreadable checkpoint in silence: s23 h3), and is
 * then refused as unreadable.
 */
function present(p: string): boolean {
  return fs.lstatSync(p, { throwIfNoEntry: false }) !== undefined;
}

/** A small regular file's text, or undefined when it is not one or not UTF-8 (read strictly, as receipts.jsonl is: s28 review). */
function readSmall(file: string, max = 1 << 16): string | undefined {
  try {
    const st = fs.statSync(file);
    if (!st.isFile() || st.size > max) return undefined;
    return fromUtf8(fs.readFileSync(file));
  } catch {
    return undefined;
  }
}

/** Price list file names: `<version>.json` (a version is at most 64 of these characters). */
const PRICE_FILE = /^([A-Za-z0-9._:-]{1,64})\.json$/;

/**
 * Every `prices/<version>.json`, each verified as the provider's signed price list of the version
 * its name says (`price_list_invalid` names the first that is not). Dotfiles are skipped (editors'
 * and file managers' litter). No prices/ folder reads as no lists; `folder` tells the two apart.
 */
function verifyExportPriceLists(dir: string, provider: string): { lists: PricedVersion[]; folder: boolean } | AuditFault {
  const sub = path.join(dir, 'prices');
  if (!present(sub)) return { lists: [], folder: false };
  let names: string[];
  try {
    names = fs.readdirSync(sub).filter((n) => !n.startsWith('.')).sort();
  } catch {
    return { code: 'export_malformed', message: 'prices/ is not a readable directory' };
  }
  const lists: PricedVersion[] = [];
  for (const n of names) {
    const file = `prices/${n}`;
    const version = PRICE_FILE.exec(n)?.[1];
    if (version === undefined) return { code: 'price_list_invalid', message: `${file} is not named <price version>.json` };
    const text = readSmall(path.join(sub, n), 1 << 20);
    if (text === undefined) return { code: 'price_list_invalid', message: `${file} is not a readable UTF-8 file (at most 1 MiB)` };
    const v = verifyPriceList(text, { provider });
    if (!v.ok) return { code: 'price_list_invalid', message: `${file} is not a price list signed by the provider: ${v.error.code}: ${v.error.message}` };
    if (v.value.version !== version) return { code: 'price_list_invalid', message: `${file} holds price version ${v.value.version}` };
    lists.push({ version, models: v.value.models });
  }
  return { lists, folder: true };
}

/** The auditor's kept checkpoints: each path a note file, or a folder of them (dotfiles skipped). */
function readKept(paths: readonly string[]): { notes: string[]; files: string[] } | AuditFault {
  const files: string[] = [];
  for (const p of paths) {
    try {
      if (!fs.statSync(p).isDirectory()) files.push(p);
      else for (const n of fs.readdirSync(p).filter((n) => !n.startsWith('.')).sort()) files.push(path.join(p, n));
    } catch (e) {
      return { code: 'export_unreadable', message: `${p}: ${fsProblem(e)}` };
    }
  }
  const notes: string[] = [];
  for (const f of files) {
    const text = readSmall(f);
    if (text === undefined) return { code: 'checkpoint_malformed', message: `${f} is not a readable checkpoint (UTF-8, at most 64 KiB)` };
    notes.push(text);
  }
  return { notes, files };
}

/** `checkpoint` and `checkpoints/*`, deduplicated, with the files (relative to `dir`) each note came from. */
function readCheckpoints(dir: string): { notes: string[]; files: string[][] } | AuditFault {
  const files: string[] = [];
  if (present(path.join(dir, 'checkpoint'))) files.push(path.join(dir, 'checkpoint'));
  const sub = path.join(dir, 'checkpoints');
  if (present(sub)) {
    let names: string[];
    try {
      // (dotfiles skipped, as in prices/ and the --kept folders: editors' and file managers' litter)
      names = fs.readdirSync(sub).filter((n) => !n.startsWith('.')).sort();
    } catch {
      return { code: 'export_malformed', message: 'checkpoints/ is not a readable directory' };
    }
    for (const n of names) files.push(path.join(sub, n));
  }
  const notes = new Map<string, string[]>();
  for (const f of files) {
    const text = readSmall(f);
    if (text === undefined) return { code: 'checkpoint_malformed', message: `${path.relative(dir, f)} is not a readable checkpoint (UTF-8, at most 64 KiB)` };
    const from = notes.get(text);
    if (from) from.push(path.relative(dir, f));
    else notes.set(text, [path.relative(dir, f)]);
  }
  return { notes: [...notes.keys()], files: [...notes.values()] };
}
