import { Command } from 'commander';
import { audit, type AuditReport } from '../audit/audit.ts';
import { formatUsd } from '../../attestation/money.ts';
import { isHex } from '../../attestation/bytes.ts';
import { CliError, intOption } from './cli-error.ts';

export function auditCommand(): Command {
  return new Command('audit')
    .description('check an exported receipt log: signatures, seq and prev chain, Merkle tree, checkpoints, costs')
    .argument('<dir>', 'a folder written by `seller-node log export`')
    .option('--provider <id>', 'fail unless the export is by this provider id (64 hex)')
    .option('--threads <n>', 'worker threads for signature checks', intOption('--threads', 0, 64), 2)
    .option('--json', 'print the report as JSON')
    .action(async (dir: string, opts: { provider?: string; threads: number; json?: boolean }) => {
      if (opts.provider !== undefined && !isHex(opts.provider, 32)) throw new CliError('--provider must be 64 lowercase hex characters', 2);
      const report = await audit({ dir, threads: opts.threads, ...(opts.provider ? { provider: opts.provider } : {}) });
      process.stdout.write(opts.json ? JSON.stringify(report, null, 2) + '\n' : formatReport(report));
      process.exitCode = report.ok ? 0 : 1;
    });
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
