// `seller-node demo-receipts`: the receipt toolkit end to end in a few seconds, in a temporary
// folder: a node key, signed receipts in the durable log, an export, a full audit, one receipt
// and one offline proof verified, and a tampered copy caught.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Command } from 'commander';
import { verifyReceipt } from '../../attestation/receipt-verify.ts';
import { verifyReceiptProof } from '../../attestation/receipt-proof.ts';
import { formatUsd } from '../../attestation/money.ts';
import { audit } from '../audit/audit.ts';
import { createKeyFile } from '../identity.ts';
import { dataDirPaths, readPriceLists, savePriceList } from '../data-dir.ts';
import { ReceiptLog } from '../store/receipt-log.ts';
import { exportLog } from '../store/export.ts';
import { receiptProofBundle } from '../store/proof-bundle.ts';
import { syntheticPriceList, syntheticReceiptBody } from '../store/synthetic.ts';
import { intOption } from './cli-error.ts';

export function demoReceiptsCommand(): Command {
  return new Command('demo-receipts')
    .summary('show the receipt toolkit on its own')
    .description('show the receipt toolkit alone: signed durable receipts, export, audit, proofs, a tampered copy caught')
    .option('--count <n>', 'receipts to sign', intOption('--count', 1, 10_000_000), 10_000)
    .option('--keep', 'keep the folder afterwards')
    .action(async (opts: { count: number; keep?: boolean }) => {
      const say = (s: string) => process.stdout.write(s + '\n');
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'seller-node-demo-'));
      try {
        const p = dataDirPaths(path.join(dir, 'node'));
        const id = createKeyFile(p.key);
        say(`node key       ${p.key} (mode 0600)\nprovider id    ${id.providerId}`);
        // The signed price list the synthetic receipts cite, kept as a node keeps its own.
        savePriceList(p.dir, syntheticPriceList(id.seed, id.providerId));
        const log = ReceiptLog.open({ path: p.receipts, seed: id.seed, checkpointIntervalMs: 0 });
        const t0 = performance.now();
        let last;
        for (let done = 0; done < opts.count; ) {
          const n = Math.min(2048, opts.count - done);
          const batch = Array.from({ length: n }, (_, i) => log.append(syntheticReceiptBody(done + i)));
          last = (await Promise.all(batch)).at(-1)!;
          done += n;
        }
        const s = (performance.now() - t0) / 1000;
        say(`signed         ${opts.count} receipts, durable on disk, in ${s.toFixed(2)} s (${Math.round(opts.count / s)}/s)`);
        const out = path.join(dir, 'export');
        const ex = await exportLog(log, out, readPriceLists(p.dir));
        say(`exported       ${ex.receipts} receipts + ${ex.checkpoints} signed checkpoints + ${ex.priceLists} signed price list to ${out}`);
        const seq = Number(last!.seq);
        const cp = log.latestCheckpoint()!;
        const bundle = receiptProofBundle(log, seq, cp);
        await log.close();

        const r = await audit({ dir: out });
        if (!r.ok) throw new Error(`audit failed: ${r.fault?.code}`);
        say(`audit          OK in ${r.seconds.toFixed(2)} s: signatures, seq + prev chain, Merkle root ${r.summary!.rootHash}, checkpoints, costs and prices (total ${formatUsd(BigInt(r.summary!.totalCostMicroUsd))} USD)`);
        const v = verifyReceipt(last!.line, { provider: id.providerId });
        say(`receipt ${seq}    ${v.ok ? 'verifies' : 'FAILS'} (${last!.payload.usage.input_tokens} in / ${last!.payload.usage.output_tokens} out, cost ${formatUsd(BigInt(last!.payload.cost_micro_usd))} USD)`);
        const b = verifyReceiptProof(bundle);
        say(`offline proof  ${b.ok ? `verifies: receipt ${seq} is in the log under the signed checkpoint of size ${b.value.checkpoint.size}` : `FAILS ${b.error.code}`}`);
        const lines = fs.readFileSync(path.join(out, 'receipts.jsonl'), 'utf8').split('\n');
        const env = JSON.parse(lines[1]!);
        const payload = JSON.parse(Buffer.from(env.payload, 'base64').toString('utf8'));
        payload.usage.output_tokens += 1;
        env.payload = Buffer.from(JSON.stringify(payload)).toString('base64');
        lines[1] = JSON.stringify(env);
        fs.writeFileSync(path.join(out, 'receipts.jsonl'), lines.join('\n'));
        const t = await audit({ dir: out });
        say(`tampered copy  audit says: ${t.ok ? 'OK (?!)' : `FAIL at seq ${t.fault!.seq}: ${t.fault!.code}`}`);
        say(`\ntry it yourself:\n  npx seller-node init --data ./mynode\n  npx seller-node log fill --data ./mynode --count 1000\n  npx seller-node log export --data ./mynode --out ./audit\n  npx seller-node audit ./audit`);
      } finally {
        if (opts.keep) say(`\nkept ${dir}`);
        else fs.rmSync(dir, { recursive: true, force: true });
      }
    });
}
