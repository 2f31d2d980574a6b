import fs from 'node:fs';
import path from 'node:path';
import { Command } from 'commander';
import { lockDataDir } from '../data-dir-lock.ts';
import { writeAllSync, writeFileAtomic } from '../atomic-file.ts';
import { dataDirPaths, openReceiptLog, readPriceLists, savePriceList } from '../data-dir.ts';
import { accessProblem, fsProblem, isErrnoError } from '../fs-problem.ts';
import { isStoreError } from '../store/store-health.ts';
import { exportLog } from '../store/export.ts';
import { receiptProofBundle } from '../store/proof-bundle.ts';
import { IdentityError, type NodeIdentity } from '../identity.ts';
import type { ReceiptLog } from '../store/receipt-log.ts';
import { isSyntheticReceiptLine, syntheticPriceList, syntheticReceiptBody } from '../store/synthetic.ts';
import { CliError, intOption } from './cli-error.ts';

function open(dir: string, opts: { threads?: number; checkpointEvery?: number } = {}, keyFile?: string) {
  // (not "key file … not found": the folder itself is not there)
  if (accessProblem(dir) === 'missing') throw new CliError(missingDataDir(dir));
  try {
    return openReceiptLog(dir, { ...opts, checkpointIntervalMs: 0 }, keyFile);
  } catch (e) {
    // A node whose config keeps its key outside the data dir (`key:`): say so, not "create one".
    if (e instanceof IdentityError && / not found /.test(e.message) && keyFile === undefined) {
      throw new CliError(`${e.message.replace(/ \(create one with:.*\)$/, '')}: if the node's key is elsewhere (its config's "key"), pass --key FILE`);
    }
    // A damaged receipts.db (SQLite's message does not say which file).
    if (isStoreError(e)) throw new CliError(`${dataDirPaths(dir).receipts}: ${e.message}`);
    throw e;
  }
}

const missingDataDir = (dir: string): string => `--data ${dir}: not found (the node's data_dir; seller-node init --data DIR makes one)`;

const KEY_OPTION = ['--key <file>', "the node's key file (default: DIR/node.key; the config's \"key\" when it is elsewhere)"] as const;

/**
 * The first seq of `log` that `log fill` did not write, checking seq 0 and the last: fill refuses
 * any log where either is real, so a log whose ends are both synthetic was written by fill alone.
 */
function realReceiptSeq(log: ReceiptLog): number | undefined {
  if (log.size === 0) return undefined;
  for (const seq of new Set([0, log.size - 1])) {
    const line = log.lineBySeq(seq);
    if (line === undefined || !isSyntheticReceiptLine(line)) return seq;
  }
  return undefined;
}

export function logCommand(): Command {
  const log = new Command('log').summary('the receipt log: log fill, log prove, log export').description('the receipt log: fill it with test receipts, prove one receipt offline, export it for auditors');
  log
    .command('fill')
    .summary('append N synthetic test receipts')
    .description('append N synthetic but well-formed signed receipts (for tests and benchmarks), only to a log that holds no real ones')
    .requiredOption('--data <dir>', 'data directory (from seller-node init)')
    .requiredOption('--count <n>', 'how many receipts to append', intOption('--count', 1, 100_000_000))
    .option('--checkpoint-every <n>', 'sign a checkpoint every N receipts', intOption('--checkpoint-every', 1), 1000)
    .option('--threads <n>', 'signer worker threads', intOption('--threads', 0, 64), 2)
    .action(async (opts: { data: string; count: number; checkpointEvery: number; threads: number }) => {
      // A writer, like a running node: never two on one folder. (A missing folder is open()'s error to name.)
      const lock = fs.existsSync(opts.data) ? lockDataDir(opts.data) : undefined;
      try {
        const { log: rl, identity } = open(opts.data, { threads: opts.threads, checkpointEvery: opts.checkpointEvery });
        const start = rl.size;
        const t0 = performance.now();
        try {
          await appendSynthetic(rl, identity, opts.data, opts.count);
        } finally {
          await rl.close();
        }
        const s = (performance.now() - t0) / 1000;
        process.stdout.write(`appended ${opts.count} receipts (seq ${start}..${start + opts.count - 1}) in ${s.toFixed(2)} s; log size ${start + opts.count}\n`);
      } finally {
        lock?.release();
      }
    });
  log
    .command('prove')
    .summary("write one receipt's offline proof")
    .description("write receipt N's offline proof (a C2SP tlog-proof bundle, as the node's log service serves it) for seller-node verify")
    .requiredOption('--data <dir>', 'data directory')
    .requiredOption('--seq <n>', 'the receipt', intOption('--seq', 0))
    .option('--size <m>', 'prove it under the stored checkpoint of this size (default: the latest)', intOption('--size', 1))
    .option('--out <file>', 'write the bundle here (default: standard output)')
    .option(...KEY_OPTION)
    .action(async (opts: { data: string; seq: number; size?: number; out?: string; key?: string }) => {
      // Only reads, like log export: no lock, and nothing made where there is no log to prove from.
      const p = dataDirPaths(opts.data);
      const problem = accessProblem(p.receipts, fs.constants.R_OK);
      if (problem === 'missing') throw new CliError(fs.existsSync(p.dir) ? `${opts.data} holds no receipt log (${path.basename(p.receipts)}): nothing to prove` : missingDataDir(opts.data));
      if (problem) throw new CliError(`${p.receipts}: ${problem}`);
      const { log: rl } = open(opts.data, { threads: 0 }, opts.key);
      let bundle: string;
      let size: number;
      try {
        if (opts.seq >= rl.size) throw new CliError(`--seq ${opts.seq} is not in the log: it holds ${rl.size === 0 ? 'no receipts' : `seq 0..${rl.size - 1}`}`);
        let cp;
        if (opts.size !== undefined) {
          if (opts.seq >= opts.size) throw new CliError(`--seq ${opts.seq} is not under a checkpoint of size ${opts.size}: it covers seq 0..${opts.size - 1}`);
          cp = rl.checkpointAt(opts.size);
          if (!cp) throw new CliError(`${opts.data} holds no signed checkpoint of size ${opts.size} (${storedSizesNear(rl.checkpoints().map((c) => c.size), opts.size)}); leave out --size to use the latest`);
        } else {
          // As log export does: a checkpoint over every durable receipt unless the latest covers them
          // (the one the node signs for that size; closing the log would sign it anyway).
          rl.checkpoint();
          cp = rl.latestCheckpoint()!;
        }
        bundle = receiptProofBundle(rl, opts.seq, cp);
        size = cp.size;
      } finally {
        await rl.close();
      }
      if (opts.out === undefined) {
        process.stdout.write(bundle);
        return;
      }
      try {
        writeFileAtomic(opts.out, (fd) => writeAllSync(fd, bundle));
      } catch (e) {
        throw new CliError(`cannot write ${opts.out}: ${fsProblem(e)}`);
      }
      process.stdout.write(`wrote the proof of receipt ${opts.seq} under the checkpoint of size ${size} to ${path.resolve(opts.out)}\n`);
    });
  log
    .command('export')
    .summary('export the log to a folder for auditors')
    .description('write receipts.jsonl, the checkpoints, provider.pub and the signed price lists to a folder for auditors')
    .requiredOption('--data <dir>', 'data directory')
    .requiredOption('--out <dir>', 'folder to write (created if missing)')
    .option(...KEY_OPTION)
    .action(async (opts: { data: string; out: string; key?: string }) => {
      const { log: rl } = open(opts.data, { threads: 0 }, opts.key);
      try {
        let s: Awaited<ReturnType<typeof exportLog>>;
        try {
          s = await exportLog(rl, opts.out, readPriceLists(opts.data));
        } catch (e) {
          // A full disk or a folder it may not write: name where (a write on a descriptor names nothing).
          if (isErrnoError(e)) throw new CliError(`cannot write the export to ${opts.out}: ${fsProblem(e)}${typeof (e as { path?: unknown }).path === 'string' ? ` (${(e as { path: string }).path})` : ''}`);
          throw e;
        }
        process.stdout.write(`exported ${plural(s.receipts, 'receipt')}, ${plural(s.checkpoints, 'checkpoint')} and ${plural(s.priceLists, 'price list')} to ${path.resolve(opts.out)}\n`);
        if (s.priceLists === 0 && s.receipts > 0) {
          process.stderr.write(`seller-node: warning: ${opts.data} holds no signed price lists (prices/), so an audit of this export cannot price its receipts\n`);
        } else if (s.missingPriceVersions.length > 0) {
          const versions = s.missingPriceVersions.slice(0, 5).join(', ') + (s.missingPriceVersions.length > 5 ? `, and ${s.missingPriceVersions.length - 5} more` : '');
          process.stderr.write(`seller-node: warning: receipts cite price versions with no signed price list in ${opts.data}/prices (${versions}): an audit of this export fails at them with price_list_missing; starting the node once with those prices (and its key) saves their list\n`);
        }
      } finally {
        await rl.close();
      }
    });
  return log;
}

/** Appends `count` synthetic receipts after the log's last, and keeps the price list they cite. */
async function appendSynthetic(rl: ReceiptLog, identity: NodeIdentity, dir: string, count: number): Promise<void> {
  // Synthetic receipts signed with the node's key stay in its chain forever: only into a log
  // that holds nothing else (a fresh one, or one fill itself started).
  const real = realReceiptSeq(rl);
  if (real !== undefined) {
    throw new CliError(
      `${dir}'s receipt log holds real receipts (seq ${real} is not synthetic); log fill appends synthetic receipts signed with this node's key, which can never be removed: use a fresh data dir (seller-node init --data DIR)`,
    );
  }
  // The list the synthetic receipts cite, kept like a node keeps its own: their export audits clean.
  savePriceList(dir, syntheticPriceList(identity.seed, identity.providerId));
  // Bounded windows keep memory flat for any count.
  const start = rl.size;
  for (let done = 0; done < count; ) {
    const n = Math.min(4096, count - done);
    const batch = [];
    for (let i = 0; i < n; i++) batch.push(rl.append(syntheticReceiptBody(start + done + i)));
    await Promise.all(batch);
    done += n;
  }
}

/** The stored checkpoint sizes either side of `size`, for an error that names what there is. */
function storedSizesNear(sizes: number[], size: number): string {
  if (sizes.length === 0) return 'it holds none';
  const below = sizes.filter((s) => s < size).at(-1);
  const above = sizes.find((s) => s > size);
  const near = [below, above].filter((s) => s !== undefined);
  return `the nearest stored: ${near.join(' and ')}; the latest: ${sizes.at(-1)}`;
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}
