import { Command } from 'commander';
import { audit, type AuditReport } from '../audit/audit.ts';
import { formatUsd } from '../../attestation/money.ts';
import { isHex } from '../../attestation/bytes.ts';
import { CliError, intOption } from './cli-error.ts';
import fs from 'node:fs';
import path from 'node:path';
import { readRequestsFile, replay, type ReplayReport } from '../audit/replay.ts';
import type { ReceiptPayload } from '../../attestation/receipt.ts';

export function auditCommand(): Command {
  return new Command('audit')
    .description('check an exported receipt log: signatures, seq and prev chain, Merkle tree, checkpoints, costs, prices against the signed price lists')
    .argument('<dir>', 'a folder written by `seller-node log export`')
    .option('--provider <id>', 'fail unless the export is by this provider id (64 hex)')
    .option('--threads <n>', 'worker threads for signature checks', intOption('--threads', 0, 64), 2)
    .option('--json', 'print the report as JSON')
    .option('--replay', 'also re-run the completed requests on the embedded runtime and compare response_sha256')
    .option('--model <file>', 'with --replay: the GGUF the node served (its SHA-256 must match the receipts)')
    .option('--requests <file>', 'with --replay: the request bodies, one {"request_id", "body": base64} a line')
    .option('--context <n>', 'with --replay: the context length the node served with', intOption('--context', 16, 4294967295))
    .action(async (dir: string, opts: { provider?: string; threads: number; json?: boolean; replay?: boolean; model?: string; requests?: string; context?: number }) => {
      if (opts.provider !== undefined && !isHex(opts.provider, 32)) throw new CliError('--provider must be 64 lowercase hex characters', 2);
      if (opts.replay && (!opts.model || !opts.requests)) throw new CliError('--replay needs --model FILE and --requests FILE', 2);
      const report = await audit({ dir, threads: opts.threads, ...(opts.provider ? { provider: opts.provider } : {}) });
      let replayed: ReplayReport | undefined;
      if (report.ok && opts.replay) {
        const requests = readRequestsFile(opts.requests!);
        replayed = await replay({ receipts: receiptPayloads(dir), requests, modelPath: opts.model!, ...(opts.context ? { contextLength: opts.context } : {}) });
      }
      process.stdout.write(opts.json ? JSON.stringify({ ...report, ...(replayed ? { replay: replayed } : {}) }, null, 2) + '\n' : formatReport(report) + (replayed ? formatReplay(replayed) : ''));
      process.exitCode = report.ok && (!replayed || replayed.mismatches.length === 0) ? 0 : 1;
    });
}

function formatReplay(r: ReplayReport): string {
  const skipped = Object.entries(r.skipped).map(([why, n]) => `${n} ${why}`).join(', ');
  const lines = [`replay       ${r.matched} of ${r.replayed} responses reproduced byte for byte${skipped ? ` (skipped: ${skipped})` : ''}`];
  for (const m of r.mismatches) lines.push(`REPLAY MISMATCH at seq ${m.seq} (request ${m.request_id}): ${m.reason}`);
  return lines.join('\n') + '\n';
}

/** The (already audited) receipt payloads of an export, in seq order. */
function receiptPayloads(dir: string): ReceiptPayload[] {
  return fs
    .readFileSync(path.join(dir, 'receipts.jsonl'), 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(Buffer.from((JSON.parse(line) as { payload: string }).payload, 'base64').toString('utf8')) as ReceiptPayload);
}

function formatReport(r: AuditReport): string {
  const out = [`audit of ${r.dir}`];
  if (r.provider) out.push(`provider     ${r.provider}`);
  if (r.ok && r.summary) {
    const s = r.summary;
    const statuses = Object.entries(s.byStatus).map(([k, v]) => `${v} ${k}`).join(', ');
    out.push(`receipts     ${s.receipts}${s.receipts ? ` (seq 0..${s.receipts - 1})` : ''}${statuses ? `: ${statuses}` : ''}`);
    out.push('signatures   ok (strict Ed25519, canonical payloads, every field valid)');
    out.push('chain        ok (seq continuous, every prev hashes the payload before it)');
    out.push(`costs        ok (every cost = usage × rates and within its hold; total ${formatUsd(BigInt(s.totalCostMicroUsd))} USD of ${formatUsd(BigInt(s.totalHoldMicroUsd))} USD held)`);
    const versions = r.priceVersions ?? [];
    out.push(`prices       ok (every receipt at its model's rates in the signed price list it cites; ${versions.length} price list${versions.length === 1 ? '' : 's'}${versions.length ? `: ${versions.slice(0, 5).join(', ')}${versions.length > 5 ? ', …' : ''}` : ''})`);
    out.push(`tree         root ${s.rootHash} at size ${s.size}`);
    out.push(
      s.latestCheckpoint
        ? `checkpoints  ${s.checkpoints} ok, pairwise consistent; latest covers ${s.latestCheckpoint.size} of ${s.size} receipts`
        : 'checkpoints  none in the export: the tree is not vouched for by a signed checkpoint',
    );
    out.push(`OK (${r.seconds.toFixed(2)} s)`);
  } else if (r.fault) {
    const f = r.fault;
    const where = [f.seq !== undefined ? `seq ${f.seq}` : '', f.line !== undefined ? `line ${f.line}` : ''].filter(Boolean).join(', ');
    out.push(`FAIL${where ? ` at ${where}` : ''}: ${f.code}: ${f.message}${f.field ? ` (field ${f.field})` : ''}`);
  }
  return out.join('\n') + '\n';
}
