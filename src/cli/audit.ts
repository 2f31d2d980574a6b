import { printLines } from './printable.ts';
import { Command } from 'commander';
import { audit, type AuditReport } from '../audit/audit.ts';
import { formatUsd } from '../../attestation/money.ts';
import { isHex } from '../../attestation/bytes.ts';
import { CliError, intOption } from './cli-error.ts';
import { fsProblem, isErrnoError } from '../fs-problem.ts';
import fs from 'node:fs';
import path from 'node:path';
import { notRegularFile } from '../../adapters/model-file.ts';
import { withProbeTimeoutHint } from '../../adapters/model-probe.ts';
import { readRequestsFile, replay, replayFault, type ReplayReport } from '../audit/replay.ts';
import type { ReceiptPayload } from '../../attestation/receipt.ts';

export function auditCommand(): Command {
  return new Command('audit')
    .summary('check an exported receipt log, every receipt')
    .description('check an exported receipt log: signatures, seq and prev chain, Merkle tree, checkpoints, costs, prices against the signed price lists')
    .argument('<dir>', 'a folder written by `seller-node log export`')
    .option('--provider <id>', 'fail unless the export is by this provider id (64 hex)')
    .option('--threads <n>', 'worker threads for signature checks', intOption('--threads', 0, 64), 2)
    .option('--json', 'print the report as JSON')
    .option('--kept <path>', 'a checkpoint you got from this provider earlier (a note file, or a folder of them; repeatable): the log must still contain each unchanged', (v: string, all: string[]) => [...all, v], [] as string[])
    .option('--replay', 'also re-run the completed requests on the embedded runtime and compare response_sha256')
    .option('--model <file>', 'with --replay: the GGUF the node served (its SHA-256 must match the receipts)')
    .option('--requests <file>', 'with --replay: the request bodies, one {"request_id", "body": base64} a line')
    .option('--context <n>', 'with --replay: the context length the node served with', intOption('--context', 16, 4294967295))
    .option('--probe-timeout <s>', 'with --replay: seconds the model\'s load and run in a child process may take (default 600)', intOption('--probe-timeout', 1, 86_400))
    .action(async (dir: string, opts: { provider?: string; threads: number; json?: boolean; kept: string[]; replay?: boolean; model?: string; requests?: string; context?: number; probeTimeout?: number }) => {
      if (opts.provider !== undefined && !isHex(opts.provider, 32)) throw new CliError('--provider must be 64 lowercase hex characters', 2);
      if (!opts.replay) {
        const stray = (['model', 'requests', 'context', 'probeTimeout'] as const).find((k) => opts[k] !== undefined);
        if (stray) throw new CliError(`--${stray === 'probeTimeout' ? 'probe-timeout' : stray} is only used with --replay`, 2);
      }
      if (opts.replay && (!opts.model || !opts.requests)) throw new CliError(`--replay needs --model FILE and --requests FILE (missing ${!opts.model ? '--model' : '--requests'})`, 2);
      // The replay's inputs are checked before the audit, which can take a while on a large log.
      let requests: Map<string, Uint8Array> | undefined;
      if (opts.replay) {
        checkModelFile(opts.model!);
        requests = readInput(opts.requests!, '--requests', () => readRequestsFile(opts.requests!));
      }
      const report = await audit({ dir, threads: opts.threads, kept: opts.kept, ...(opts.provider ? { provider: opts.provider } : {}) });
      let replayed: ReplayReport | undefined;
      let replaySeconds = 0;
      if (report.ok && requests) {
        const t0 = performance.now();
        replayed = await replay({ receipts: receiptPayloads(dir), requests, modelPath: opts.model!, ...(opts.context ? { contextLength: opts.context } : {}), ...(opts.probeTimeout ? { probeTimeoutMs: opts.probeTimeout * 1000 } : {}) }).catch((e: unknown) => {
          const message = withProbeTimeoutHint(e, '--probe-timeout S');
          throw message === (e as Error).message ? e : new Error(message, { cause: e });
        });
        replaySeconds = (performance.now() - t0) / 1000;
        if (replayed.unused_requests) process.stderr.write(unusedWarning(replayed) + '\n');
      }
      const fault = replayed ? replayFault(replayed) : undefined;
      const ok = report.ok && !fault;
      if (opts.json) {
        process.stdout.write(JSON.stringify({ ...report, ok, ...(fault ? { fault } : {}), ...(replayed ? { replay: { ok: !fault, ...replayed } } : {}) }, null, 2) + '\n');
      } else if (!replayed) {
        process.stdout.write(formatReport(report));
      } else {
        // The verdict comes last, after the replay: nothing reads as a pass when the replay fails.
        const lines = formatReport(report).trimEnd().split('\n');
        lines.pop(); // the audit's own "OK (… s)"
        process.stdout.write(printLines([...lines, ...formatReplay(replayed, opts.context), fault ? `REPLAY FAILED: ${fault.message}` : `OK (${report.seconds.toFixed(2)} s; replay ${replaySeconds.toFixed(2)} s)`]));
      }
      process.exitCode = ok ? 0 : 1;
    });
}

/** Runs read, turning a file system error into "cannot read OPTION FILE: why" (exit 1, as verify). */
function readInput<T>(file: string, option: string, read: () => T): T {
  try {
    return read();
  } catch (e) {
    if (!isErrnoError(e)) throw e;
    throw new CliError(`cannot read ${option} ${file}: ${fsProblem(e)}`);
  }
}

/** A model file: a regular one (model-file.ts) this user may read. */
function checkModelFile(file: string): void {
  const not = readInput(file, '--model', () => notRegularFile(file));
  if (not === 'a folder') throw new CliError(`cannot read --model ${file}: it is a folder`);
  if (not !== undefined) throw new CliError(`cannot read --model ${file}: not a regular file (${not}); a model file is read twice, at random`);
  readInput(file, '--model', () => fs.accessSync(file, fs.constants.R_OK));
}

function unusedWarning(r: ReplayReport): string {
  const n = r.unused_requests;
  const ids = r.unused_request_ids.slice(0, 5);
  return `warning: ${n} request bod${n === 1 ? 'y matches' : 'ies match'} no receipt in the log (${ids.join(', ')}${n > ids.length ? ', …' : ''}); ${n === 1 ? 'it was' : 'they were'} not replayed`;
}

function formatReplay(r: ReplayReport, context: number | undefined): string[] {
  const skipped = Object.entries(r.skipped).map(([why, n]) => `${n} ${why}`).join(', ');
  const why = skipped ? ` (skipped: ${skipped})` : '';
  if (r.replayable === 0) return [`replay       nothing to replay: the log holds no completed chat, completion, responses or embedding receipt${why}`];
  const lines = [r.replayed === 0 && r.mismatches.length === 0 ? `replay       nothing replayed${why}` : `replay       ${r.matched} of ${r.replayed} responses reproduced byte for byte${why}`];
  for (const m of r.mismatches) {
    // Too small a context refuses a request whose max_tokens it cannot hold, and ends sooner one
    // that had none (it generates what the context leaves room for).
    const contextHint = context
      ? ` (hint: is --context ${context} smaller than the node's context?)`
      : " (hint: the replay used the default context, 4096 or the model's if smaller; pass the node's with --context)";
    const shorter = m.output_tokens !== undefined && m.output_tokens.replay < m.output_tokens.receipt;
    const hint = m.error_code === 'context_length_exceeded' || shorter ? contextHint : '';
    lines.push(`REPLAY MISMATCH at seq ${m.seq} (request ${m.request_id}): ${m.reason}${hint}`);
  }
  return lines;
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
    out.push('chain        ok (seq continuous, every prev hashes the payload before it, no ticket billed twice)');
    out.push(`costs        ok (every cost = usage × rates and within its hold; total ${formatUsd(BigInt(s.totalCostMicroUsd))} USD of ${formatUsd(BigInt(s.totalHoldMicroUsd))} USD held)`);
    const versions = r.priceVersions ?? [];
    out.push(`prices       ok (every receipt at its model's rates in the signed price list it cites; ${versions.length} price list${versions.length === 1 ? '' : 's'}${versions.length ? `: ${versions.slice(0, 5).join(', ')}${versions.length > 5 ? ', …' : ''}` : ''})`);
    out.push(`tree         root ${s.rootHash} at size ${s.size}`);
    out.push(
      s.latestCheckpoint
        ? `checkpoints  ${s.checkpoints} ok, pairwise consistent; latest covers ${s.latestCheckpoint.size} of ${s.size} receipts`
        : 'checkpoints  none in the export: the tree is not vouched for by a signed checkpoint',
    );
    out.push(
      s.keptCheckpoints
        ? `kept         ${s.keptCheckpoints} checkpoint${s.keptCheckpoints === 1 ? '' : 's'} you kept: each still in this log, unchanged`
        : 'kept         none given (--kept): this export agrees with itself; that it agrees with what the provider published before is not checked',
    );
    out.push(`OK (${r.seconds.toFixed(2)} s)`);
  } else if (r.fault) {
    const f = r.fault;
    const where = [f.seq !== undefined ? `seq ${f.seq}` : '', f.line !== undefined ? `line ${f.line}` : ''].filter(Boolean).join(', ');
    out.push(`FAIL${where ? ` at ${where}` : ''}: ${f.code}: ${f.message}${f.field ? ` (field ${f.field})` : ''}`);
  }
  return printLines(out);
}
