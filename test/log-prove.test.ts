// `seller-node log prove`: receipt N's offline proof, the C2SP tlog-proof bundle the node's
// /service/log/1.0.0 inclusion op serves, which `seller-node verify` accepts. The CLI runs in
// child processes: `npm run build` first.
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { fromBase64, toBase64 } from '../attestation/bytes.ts';
import { formatUsd } from '../attestation/money.ts';
import { createKeyFile } from '../src/identity.ts';
import { receiptProofBundle } from '../src/store/proof-bundle.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticReceiptBody } from '../src/store/synthetic.ts';
import { assertCliBuilt, runCli, STACK_TRACE, type CliResult } from './helpers/cli-run.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';

const dir = tempDir('seller-node-prove-');
const open: ReceiptLog[] = [];
beforeAll(assertCliBuilt);
afterAll(async () => {
  for (const l of open) await l.close();
  removeTemp(dir);
});

/**
 * A data dir whose log is held open here, as a running node holds its own: `count` receipts,
 * a checkpoint every 10 (so the last `count % 10` are under none yet).
 */
async function nodeDir(name: string, count = 25): Promise<{ h: string; log: ReceiptLog }> {
  const h = path.join(dir, name);
  fs.mkdirSync(h, { recursive: true });
  const id = createKeyFile(path.join(h, 'node.key'));
  const log = ReceiptLog.open({ path: path.join(h, 'receipts.db'), seed: id.seed, threads: 0, checkpointIntervalMs: 0, checkpointEvery: 10 });
  open.push(log);
  await Promise.all(Array.from({ length: count }, (_, i) => log.append(syntheticReceiptBody(i))));
  return { h, log };
}

const prove = (h: string, ...args: string[]) => runCli(['log', 'prove', '--data', h, ...args]);

function expectError(r: CliResult, message: RegExp, code = 1): void {
  expect(r.code, r.stderr).toBe(code);
  expect(r.signal).toBeNull();
  expect(r.stdout).toBe('');
  expect(r.stderr).toMatch(message);
  expect(r.stderr).not.toMatch(STACK_TRACE);
}

/** `seller-node verify` of a bundle text, from a file. */
async function verify(text: string, name: string, ...args: string[]): Promise<CliResult> {
  const file = path.join(dir, name);
  fs.writeFileSync(file, text);
  return runCli(['verify', file, ...args]);
}

describe('log prove', () => {
  let h: string;
  let log: ReceiptLog;
  beforeAll(async () => {
    ({ h, log } = await nodeDir('node'));
    log.checkpoint(); // checkpoints 10, 20, 25
  });

  test('a receipt no checkpoint covers yet: it signs the one the node would, and the bundle verifies', async () => {
    const { h, log } = await nodeDir('uncovered');
    expect(log.checkpoints().map((c) => c.size)).toEqual([10, 20]);
    const r = await prove(h, '--seq', '22');
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(/^c2sp\.org\/tlog-proof@v1\nextra [A-Za-z0-9+/=]+\nindex 22\n/);
    // The checkpoint it signed is stored, and is the node's own (the node keeps it: same note).
    expect(log.checkpoints().map((c) => c.size)).toEqual([10, 20, 25]);
    expect(log.checkpoint()).toBe(log.latestCheckpoint()!.note);
    expect(r.stdout).toBe(receiptProofBundle(log, 22, log.latestCheckpoint()!));
    const b = syntheticReceiptBody(22);
    const v = await verify(r.stdout, 'seq-22.proof', '--provider', log.providerId);
    expect(v.code, v.stdout + v.stderr).toBe(0);
    expect(v.stdout).toBe(
      `OK bundle: seq 22 by ${log.providerId}, ${b.status}, ${b.usage.input_tokens} in / ${b.usage.output_tokens} out, cost ${formatUsd(BigInt(b.cost_micro_usd))} USD, included in the log at index 22 under a checkpoint of size 25\n`,
    );
  });

  test('to stdout by default: exactly the bundle the node\'s inclusion op serves', async () => {
    const r = await prove(h, '--seq', '13');
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(receiptProofBundle(log, 13, log.latestCheckpoint()!));
    expect((await verify(r.stdout, 'seq-13.proof')).stdout).toMatch(/^OK bundle: seq 13 .* at index 13 under a checkpoint of size 25\n$/);
  });

  test('--size and --out: under an older stored checkpoint, into a file', async () => {
    const out = path.join(dir, 'seq-3-of-10.proof');
    const r = await prove(h, '--seq', '3', '--size', '10', '--out', out);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(`wrote the proof of receipt 3 under the checkpoint of size 10 to ${out}\n`);
    const text = fs.readFileSync(out, 'utf8');
    expect(text).toBe(receiptProofBundle(log, 3, log.checkpoints()[0]!));
    const v = await runCli(['verify', out]);
    expect(v.code, v.stdout).toBe(0);
    expect(v.stdout).toMatch(/^OK bundle: seq 3 .* at index 3 under a checkpoint of size 10\n$/);
  });

  test('a bundle with one byte changed fails verify', async () => {
    const text = (await prove(h, '--seq', '13')).stdout;
    const lines = text.split('\n');
    const at = lines.indexOf('index 13') + 1; // the first inclusion-proof hash
    const hash = fromBase64(lines[at]!)!;
    hash[7] = hash[7]! ^ 0x01;
    lines[at] = toBase64(hash);
    const v = await verify(lines.join('\n'), 'seq-13-flipped.proof');
    expect(v.code).toBe(1);
    expect(v.stdout).toMatch(/^FAIL bundle: proof_root_mismatch: /);
    // And the receipt it carries, one byte changed: its inclusion no longer holds either.
    const receipt = Buffer.from(lines[1]!.slice('extra '.length), 'base64');
    const i = receipt.indexOf('"sig":"') + 8;
    receipt[i] = receipt[i]! ^ 0x01;
    const tampered = text.replace(lines[1]!, `extra ${receipt.toString('base64')}`);
    const w = await verify(tampered, 'seq-13-receipt-flipped.proof');
    expect(w.code).toBe(1);
    expect(w.stdout).toMatch(/^FAIL bundle: proof_root_mismatch: /);
  });

  test('--seq beyond the log, or not under the --size asked for', async () => {
    expectError(await prove(h, '--seq', '25'), /^seller-node: --seq 25 is not in the log: it holds seq 0\.\.24\n$/);
    expectError(await prove(h, '--seq', '13', '--size', '10'), /^seller-node: --seq 13 is not under a checkpoint of size 10: it covers seq 0\.\.9\n$/);
  });

  test('--size with no stored checkpoint of that size', async () => {
    expectError(await prove(h, '--seq', '3', '--size', '15'), /^seller-node: .* holds no signed checkpoint of size 15 \(the nearest stored: 10 and 20; the latest: 25\); leave out --size to use the latest\n$/);
    expectError(await prove(h, '--seq', '3', '--size', '99'), /holds no signed checkpoint of size 99 \(the nearest stored: 25; the latest: 25\)/);
  });

  test('usage errors exit 2', async () => {
    expectError(await prove(h), /required option '--seq <n>' not specified/, 2);
    expectError(await prove(h, '--seq', '-1'), /--seq must be a whole number, got "-1"/, 2);
    expectError(await prove(h, '--seq', '3', '--size', '0'), /--size must be between 1 and /, 2);
    expectError(await runCli(['log', 'prove', '--seq', '3']), /required option '--data <dir>' not specified/, 2);
  });
});

describe('log prove where there is nothing to prove', () => {
  test('a missing data dir: named, and not created', async () => {
    const missing = path.join(dir, 'missing');
    expectError(await prove(missing, '--seq', '0'), /^seller-node: --data .*missing: not found \(the node's data_dir; seller-node init --data DIR makes one\)\n$/);
    expect(fs.existsSync(missing)).toBe(false);
  });

  test('a data dir without a receipt log: named, and none created', async () => {
    const h = path.join(dir, 'no-log');
    fs.mkdirSync(h);
    createKeyFile(path.join(h, 'node.key'));
    expectError(await prove(h, '--seq', '0'), /^seller-node: .*no-log holds no receipt log \(receipts\.db\): nothing to prove\n$/);
    expect(fs.readdirSync(h)).toEqual(['node.key']);
  });

  test('an empty log', async () => {
    const { h } = await nodeDir('empty', 0);
    expectError(await prove(h, '--seq', '0'), /^seller-node: --seq 0 is not in the log: it holds no receipts\n$/);
  });
});
