import { printLines } from './printable.ts';
import { Command } from 'commander';
import { isHex } from '../../attestation/bytes.ts';
import { verifyReceipt } from '../../attestation/receipt-verify.ts';
import { verifyReceiptProof } from '../../attestation/receipt-proof.ts';
import { TLOG_PROOF_HEADER } from '../../attestation/tlog-proof.ts';
import { formatUsd } from '../../attestation/money.ts';
import { fail } from '../../attestation/result.ts';
import type { ReceiptPayload } from '../../attestation/receipt.ts';
import { CliError } from './cli-error.ts';
import { fsProblem } from '../fs-problem.ts';
import { readFd, readFileBytes } from '../read-text-file.ts';

const MAX_FILE = 8 << 20;

export function verifyCommand(): Command {
  return new Command('verify')
    .summary('verify one receipt or one proof bundle')
    .description('verify one receipt envelope (JSON) or one tlog-proof bundle')
    .argument('<file>', 'the envelope or bundle; - reads standard input')
    .option('--provider <id>', 'require this provider id (64 hex); otherwise the one the file names is used')
    .option('--json', 'print the result as JSON')
    .action((file: string, opts: { provider?: string; json?: boolean }) => {
      if (opts.provider !== undefined && !isHex(opts.provider, 32)) throw new CliError('--provider must be 64 lowercase hex characters', 2);
      const bytes = readInput(file);
      const kind: 'bundle' | 'receipt' = bytes.subarray(0, TLOG_PROOF_HEADER.length + 1).toString('latin1') === TLOG_PROOF_HEADER + '\n' ? 'bundle' : 'receipt';
      // Decoded strictly, as the library decodes what it is given as bytes: bytes that are not
      // UTF-8 are refused, never read as U+FFFD (s23 h3). (A byte-order mark is kept: the
      // verifier decides about it.)
      let text: string | undefined;
      try {
        text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
      } catch {
        text = undefined;
      }
      let result;
      if (text === undefined) result = fail(kind === 'bundle' ? 'bundle_malformed' : 'envelope_not_json', `the ${kind === 'bundle' ? 'bundle' : 'envelope'} is not valid UTF-8`);
      else if (kind === 'bundle') result = verifyReceiptProof(text, opts.provider ? { provider: opts.provider } : {});
      else result = verifyReceipt(text, { provider: opts.provider ?? providerOf(text) });
      if (opts.json) {
        process.stdout.write(JSON.stringify(result.ok ? { ok: true, kind, payload: payloadOf(result.value) } : { ok: false, kind, error: result.error }, null, 2) + '\n');
      } else if (result.ok) {
        const p = payloadOf(result.value);
        const where = 'checkpoint' in result.value ? `, included in the log at index ${result.value.index} under a checkpoint of size ${result.value.checkpoint.size}` : '';
        process.stdout.write(printLines([`OK ${kind}: seq ${p.seq} by ${p.provider}, ${p.status}, ${p.usage.input_tokens} in / ${p.usage.output_tokens} out, cost ${formatUsd(BigInt(p.cost_micro_usd))} USD${where}`]));
        if (!opts.provider) process.stderr.write('note: the provider key was taken from the file; pass --provider to pin it\n');
      } else {
        process.stdout.write(printLines([`FAIL ${kind}: ${result.error.code}: ${result.error.message}${result.error.field ? ` (field ${result.error.field})` : ''}`]));
      }
      process.exitCode = result.ok ? 0 : 1;
    });
}

function payloadOf(v: { payload: ReceiptPayload } | { receipt: { payload: ReceiptPayload } }): ReceiptPayload {
  return 'receipt' in v ? v.receipt.payload : v.payload;
}

/** The file (or standard input, `-`): a regular file, or a pipe read to its end (`verify <(sed -n 5p receipts.jsonl)`), at most MAX_FILE. */
function readInput(file: string): Buffer {
  try {
    return file === '-' ? readFd(0, MAX_FILE) : readFileBytes(file, { maxBytes: MAX_FILE, pipes: true });
  } catch (e) {
    throw new CliError(`cannot read ${file}: ${fsProblem(e)}`);
  }
}

/**
 * The provider a receipt envelope names, to verify it against: its signature's keyid, or (a keyid
 * is only a hint in DSSE: missing, empty or another name) the payload's `provider`, which only a
 * signature under that key can vouch for (s23 h3: a genuine receipt without a keyid was
 * signature_invalid). Anything unreadable yields a key nothing verifies under, and verifyReceipt
 * names what is wrong.
 */
function providerOf(text: string): string {
  const none = '0'.repeat(64);
  try {
    const env = JSON.parse(text) as { payload?: unknown; signatures?: { keyid?: unknown }[] };
    const k = env?.signatures?.[0]?.keyid;
    if (typeof k === 'string' && isHex(k, 32)) return k;
    const payload = typeof env?.payload === 'string' ? (JSON.parse(Buffer.from(env.payload, 'base64').toString('utf8')) as { provider?: unknown }) : undefined;
    return typeof payload?.provider === 'string' && isHex(payload.provider, 32) ? payload.provider : none;
  } catch {
    return none; // not JSON: verifyReceipt reports envelope_not_json
  }
}
