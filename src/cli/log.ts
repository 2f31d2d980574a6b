import fs from 'node:fs';
import path from 'node:path';
import { Command } from 'commander';
import { lockDataDir } from '../data-dir-lock.ts';
import { openReceiptLog, readPriceLists, savePriceList } from '../data-dir.ts';
import { exportLog } from '../store/export.ts';
import { syntheticPriceList, syntheticReceiptBody } from '../store/synthetic.ts';
import { intOption } from './cli-error.ts';

function open(dir: string, opts: { threads?: number; checkpointEvery?: number } = {}) {
  return openReceiptLog(dir, { ...opts, checkpointIntervalMs: 0 });
}

export function logCommand(): Command {
  const log = new Command('log').description('the receipt log: fill it with test receipts, export it for auditors');
  log
    .command('fill')
    .description('append N synthetic but well-formed signed receipts (for tests and benchmarks)')
    .requiredOption('--data <dir>', 'data directory (from seller-node init)')
    .requiredOption('--count <n>', 'how many receipts to append', intOption('--count', 1, 100_000_000))
    .option('--checkpoint-every <n>', 'sign a checkpoint every N receipts', intOption('--checkpoint-every', 1), 1000)
    .option('--threads <n>', 'signer worker threads', intOption('--threads', 0, 64), 2)
    .action(async (opts: { data: string; count: number; checkpointEvery: number; threads: number }) => {
      // A writer, like a running node: never two on one folder. (A missing folder is open()'s error to name.)
      const lock = fs.existsSync(opts.data) ? lockDataDir(opts.data) : undefined;
      let rl;
      let identity;
      try {
        ({ log: rl, identity } = open(opts.data, { threads: opts.threads, checkpointEvery: opts.checkpointEvery }));
      } catch (e) {
        lock?.release();
        throw e;
      }
      const start = rl.size;
      const t0 = performance.now();
      try {
        // The list the synthetic receipts cite, kept like a node keeps its own: their export audits clean.
        savePriceList(opts.data, syntheticPriceList(identity.seed, identity.providerId));
        // Bounded windows keep memory flat for any count.
        for (let done = 0; done < opts.count; ) {
          const n = Math.min(4096, opts.count - done);
          const batch = [];
          for (let i = 0; i < n; i++) batch.push(rl.append(syntheticReceiptBody(start + done + i)));
          await Promise.all(batch);
          done += n;
        }
      } finally {
        try {
          await rl.close();
        } finally {
          lock?.release();
        }
      }
      const s = (performance.now() - t0) / 1000;
      process.stdout.write(`appended ${opts.count} receipts (seq ${start}..${start + opts.count - 1}) in ${s.toFixed(2)} s; log size ${start + opts.count}\n`);
    });
  log
    .command('export')
    .description('write receipts.jsonl, the checkpoints, provider.pub and the signed price lists to a folder for auditors')
    .requiredOption('--data <dir>', 'data directory')
    .requiredOption('--out <dir>', 'folder to write (created if missing)')
    .action(async (opts: { data: string; out: string }) => {
      const { log: rl } = open(opts.data, { threads: 0 });
      try {
        const s = await exportLog(rl, opts.out, readPriceLists(opts.data));
        process.stdout.write(`exported ${plural(s.receipts, 'receipt')}, ${plural(s.checkpoints, 'checkpoint')} and ${plural(s.priceLists, 'price list')} to ${path.resolve(opts.out)}\n`);
        if (s.priceLists === 0 && s.receipts > 0) {
          process.stderr.write(`seller-node: warning: ${opts.data} holds no signed price lists (prices/), so an audit of this export cannot price its receipts\n`);
        }
      } finally {
        await rl.close();
      }
    });
  return log;
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}
