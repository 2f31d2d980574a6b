// audit() (src/audit/audit.ts) on real exports made by ReceiptLog + exportLog, clean and tampered
// one way at a time; and verifyLog (attestation/log-verify.ts), which must reach the same verdict.
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toBase64, toHex, utf8 } from '../attestation/bytes.ts';
import { canonicalize } from '../attestation/canonical-json.ts';
import { serializeEnvelope, type DsseEnvelope } from '../attestation/dsse.ts';
import { sha256 } from '../attestation/hash.ts';
import { verifyLog } from '../attestation/log-verify.ts';
import { priceVersion, signPriceList } from '../attestation/price-list.ts';
import { audit, type AuditReport } from '../src/audit/audit.ts';
import { SYNTHETIC_PRICE_LIST, syntheticPriceList, syntheticReceiptBody } from '../src/store/synthetic.ts';
import { repriced, writePriceFile } from './helpers/price-lists.ts';
import {
  buildLog,
  copyExport,
  editLines,
  flipSignatureBit,
  makeCheckpoint,
  payloadBytesOf,
  payloadOf,
  providerIdOf,
  randomSeed,
  readReceiptLines,
  removeCheckpoints,
  removeTemp,
  signLine,
  tempDir,
  withPayloadKeepSig,
  writeCheckpointFile,
  writeReceiptLines,
  type BuiltLog,
} from './helpers/tamper-log.ts';

const COUNT = 30;
let base: BuiltLog;
const temps: string[] = [];

beforeAll(async () => {
  base = await buildLog({ count: COUNT, checkpointEvery: 10 });
  temps.push(base.root);
});

afterAll(() => {
  for (const t of temps) removeTemp(t);
});

/** A fresh copy of the clean export. */
function fresh(): string {
  const t = tempDir();
  temps.push(t);
  return copyExport(base, t);
}

async function run(dir: string, opts: { threads?: number; chunkBytes?: number; provider?: string; kept?: string[] } = {}): Promise<AuditReport> {
  return audit({ dir, threads: 0, ...opts });
}

/** Asserts the audit failed with exactly this fault (seq and line compared as given; undefined = absent). */
function expectFault(r: AuditReport, code: string, where: { seq?: string; line?: number } = {}): void {
  expect(r.ok).toBe(false);
  expect(r.summary).toBeUndefined();
  expect(r.fault?.code, JSON.stringify(r.fault)).toBe(code);
  expect(r.fault?.seq).toBe(where.seq);
  expect(r.fault?.line).toBe(where.line);
  expect(typeof r.fault?.message).toBe('string');
}

/** Every checkpoint note of an export (as audit reads them: deduplicated). */
function notesOf(dir: string): string[] {
  const files: string[] = [];
  if (fs.existsSync(path.join(dir, 'checkpoint'))) files.push(path.join(dir, 'checkpoint'));
  const sub = path.join(dir, 'checkpoints');
  if (fs.existsSync(sub)) for (const n of fs.readdirSync(sub).sort()) files.push(path.join(sub, n));
  return [...new Set(files.map((f) => fs.readFileSync(f, 'utf8')))];
}

function verifyLogOf(dir: string) {
  return verifyLog({ provider: base.providerId, receipts: readReceiptLines(dir), checkpoints: notesOf(dir) });
}

function editPayload(line: string, edit: (p: Record<string, any>) => void): Record<string, any> {
  const p = payloadOf(line);
  edit(p);
  return p;
}

describe('audit: a clean export', () => {
  it('holds, with the counts, root and checkpoints of the log that was exported', async () => {
    expect(base.checkpointSizes).toEqual([10, 20, 30]);
    const r = await run(base.exportDir);
    expect(r.fault).toBeUndefined();
    expect(r.ok).toBe(true);
    expect(r.provider).toBe(base.providerId);
    expect(r.dir).toBe(base.exportDir);
    expect(r.summary).toEqual({
      receipts: COUNT,
      checkpoints: 3,
      size: COUNT,
      rootHash: base.rootHash,
      totalCostMicroUsd: base.totalCostMicroUsd.toString(),
      totalHoldMicroUsd: base.totalHoldMicroUsd.toString(),
      byStatus: base.byStatus,
      keptCheckpoints: 0,
      latestCheckpoint: { size: COUNT, rootHash: base.rootHash },
    });
    expect(r.priceVersions).toEqual([base.priceVersion]);
    expect(r.seconds).toBeGreaterThanOrEqual(0);
  });

  it('gives the same report with two worker threads and small chunks', async () => {
    const inProcess = await run(base.exportDir);
    const threaded = await run(base.exportDir, { threads: 2, chunkBytes: 4096 });
    expect(threaded.ok).toBe(true);
    expect(threaded.summary).toEqual(inProcess.summary);
  });

  it('holds when pinned to its own provider id, and fails provider_mismatch for another', async () => {
    expect((await run(base.exportDir, { provider: base.providerId })).ok).toBe(true);
    const other = providerIdOf(randomSeed());
    const r = await run(base.exportDir, { provider: other });
    expectFault(r, 'provider_mismatch');
    expect(r.fault!.message).toContain(other);
  });

  it('counts only the checkpoints, not the duplicate `checkpoint` file', async () => {
    const dir = fresh();
    fs.rmSync(path.join(dir, 'checkpoint'));
    const r = await run(dir);
    expect(r.ok).toBe(true);
    expect(r.summary!.checkpoints).toBe(3);
  });

  it('holds without any checkpoint, and says so in the summary', async () => {
    const dir = fresh();
    removeCheckpoints(dir);
    const r = await run(dir);
    expect(r.ok).toBe(true);
    expect(r.summary!.checkpoints).toBe(0);
    expect(r.summary!.latestCheckpoint).toBeUndefined();
    expect(r.summary!.rootHash).toBe(base.rootHash);
  });

  it('a `checkpoint` that is a dangling or looping symlink is refused as unreadable, not passed over as no checkpoint; dotfiles in checkpoints/ are litter, skipped (s23 h3)', async () => {
    for (const target of ['nowhere', 'checkpoint']) {
      const dir = fresh();
      removeCheckpoints(dir);
      fs.symlinkSync(target, path.join(dir, 'checkpoint'));
      const r = await run(dir);
      expect(r.ok, target).toBe(false);
      expect(r.fault, target).toMatchObject({ code: 'checkpoint_malformed', message: 'checkpoint is not a readable checkpoint (UTF-8, at most 64 KiB)' });
    }
    const dir = fresh();
    fs.writeFileSync(path.join(dir, 'checkpoints', '.300.swp'), 'editor litter');
    const r = await run(dir);
    expect(r.ok).toBe(true);
    expect(r.summary!.checkpoints).toBe(3);
  });

  it('an export of an empty log is log_empty', async () => {
    const t = tempDir();
    temps.push(t);
    const empty = await buildLog({ count: 0, root: t });
    expect(readReceiptLines(empty.exportDir)).toEqual([]);
    expect(fs.existsSync(path.join(empty.exportDir, 'checkpoint'))).toBe(false);
    expectFault(await run(empty.exportDir), 'log_empty');
  });
});

describe('audit: tampered receipts', () => {
  it('a payload field changed (old signature kept) is signature_invalid at its seq and line', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      const p = editPayload(l[7]!, (p) => (p.usage.output_tokens += 1));
      l[7] = withPayloadKeepSig(l[7]!, p);
    });
    expectFault(await run(dir), 'signature_invalid', { seq: '7', line: 8 });
  });

  it('one flipped signature bit is signature_invalid', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[12] = flipSignatureBit(l[12]!, 5, 3);
    });
    expectFault(await run(dir), 'signature_invalid', { seq: '12', line: 13 });
  });

  it('re-signed by another key under the provider keyid is signature_invalid', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[4] = signLine(payloadBytesOf(l[4]!), randomSeed(), base.providerId);
    });
    expectFault(await run(dir), 'signature_invalid', { seq: '4', line: 5 });
  });

  it('re-signed by another key naming itself as keyid is unknown_key', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[4] = signLine(payloadBytesOf(l[4]!), randomSeed());
    });
    expectFault(await run(dir), 'unknown_key', { seq: '4', line: 5 });
  });

  it('a truncated line is envelope_not_json at its line (no seq can be read)', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[6] = l[6]!.slice(0, Math.floor(l[6]!.length / 2));
    });
    expectFault(await run(dir), 'envelope_not_json', { line: 7 });
  });

  it('a non-JSON line is envelope_not_json', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[21] = 'hello, auditor';
    });
    expectFault(await run(dir), 'envelope_not_json', { line: 22 });
  });

  it('a JSON line that is not an envelope is envelope_malformed', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[2] = '[1,2,3]';
    });
    expectFault(await run(dir), 'envelope_malformed', { line: 3 });
  });

  it('a payload with whitespace added, correctly signed, is payload_not_canonical', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      const text = JSON.stringify(payloadOf(l[3]!), null, 1);
      l[3] = signLine(new TextEncoder().encode(text), base.seed);
    });
    expectFault(await run(dir), 'payload_not_canonical', { seq: '3', line: 4 });
  });

  it('a payload with its keys reordered, correctly signed, is payload_not_canonical', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      const p = payloadOf(l[15]!);
      const reversed = Object.fromEntries(Object.entries(p).reverse());
      l[15] = signLine(new TextEncoder().encode(JSON.stringify(reversed)), base.seed);
    });
    expectFault(await run(dir), 'payload_not_canonical', { seq: '15', line: 16 });
  });

  it('a wrong cost, correctly signed, is cost_mismatch', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[9] = signLine(editPayload(l[9]!, (p) => (p.cost_micro_usd = String(BigInt(p.cost_micro_usd) + 1n))), base.seed);
    });
    expectFault(await run(dir), 'cost_mismatch', { seq: '9', line: 10 });
  });

  it('a cost above its hold, correctly signed, is cost_exceeds_hold', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[9] = signLine(
        editPayload(l[9]!, (p) => {
          expect(BigInt(p.cost_micro_usd)).toBeGreaterThan(0n);
          p.hold_micro_usd = String(BigInt(p.cost_micro_usd) - 1n);
        }),
        base.seed,
      );
    });
    expectFault(await run(dir), 'cost_exceeds_hold', { seq: '9', line: 10 });
  });

  it('a receipt naming another provider, signed by the provider, is provider_mismatch', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[1] = signLine(editPayload(l[1]!, (p) => (p.provider = providerIdOf(randomSeed()))), base.seed);
    });
    expectFault(await run(dir), 'provider_mismatch', { seq: '1', line: 2 });
  });

  it('an invalid field, correctly signed, is payload_invalid naming the field', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[8] = signLine(editPayload(l[8]!, (p) => (p.status = 'refunded')), base.seed);
    });
    const r = await run(dir);
    expectFault(r, 'payload_invalid', { seq: '8', line: 9 });
    expect(r.fault!.field).toBe('status');
  });
});

describe('audit: the sequence and the hash chain', () => {
  it('a deleted line is seq_gap naming the missing seq', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l.splice(5, 1);
    });
    // (named at the line where seq 5 belongs, which now holds seq 6: s30 review)
    expectFault(await run(dir), 'seq_gap', { seq: '5', line: 6 });
  });

  it('a deleted first line is seq_gap at seq 0', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l.shift();
    });
    expectFault(await run(dir), 'seq_gap', { seq: '0', line: 1 });
  });

  it('a deleted last line is caught by the checkpoints: checkpoint_size_exceeds_log', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l.pop();
    });
    const r = await run(dir);
    expectFault(r, 'checkpoint_size_exceeds_log');
    expect(r.fault!.message).toContain('size 30');
  });

  it('a duplicated line is seq_duplicate at the copy', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l.splice(15, 0, l[14]!);
    });
    expectFault(await run(dir), 'seq_duplicate', { seq: '14', line: 16 });
  });

  it('a line repeated far later is seq_duplicate at the repeat', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l.push(l[3]!);
    });
    expectFault(await run(dir), 'seq_duplicate', { seq: '3', line: 31 });
  });

  it('two adjacent lines swapped is seq_out_of_order naming the seq that came late', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      [l[17], l[18]] = [l[18]!, l[17]!];
    });
    expectFault(await run(dir), 'seq_out_of_order', { seq: '17', line: 18 });
  });

  it('two distant lines swapped is seq_out_of_order', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      [l[10], l[20]] = [l[20]!, l[10]!];
    });
    expectFault(await run(dir), 'seq_out_of_order', { seq: '10', line: 11 });
  });

  it('a receipt re-signed with a wrong prev is prev_mismatch at its seq', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[11] = signLine(editPayload(l[11]!, (p) => (p.prev = toHex(sha256(new TextEncoder().encode('not the previous payload'))))), base.seed);
    });
    expectFault(await run(dir), 'prev_mismatch', { seq: '11', line: 12 });
  });

  it('a receipt edited and validly re-signed breaks the next prev: prev_mismatch at the next seq', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[11] = signLine(editPayload(l[11]!, (p) => (p.request_id = 'req-rewritten')), base.seed);
    });
    expectFault(await run(dir), 'prev_mismatch', { seq: '12', line: 13 });
  });

  it('the last receipt edited and validly re-signed is caught by the checkpoint: checkpoint_root_mismatch', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[29] = signLine(editPayload(l[29]!, (p) => (p.request_id = 'req-rewritten')), base.seed);
    });
    const r = await run(dir);
    expectFault(r, 'checkpoint_root_mismatch');
    expect(r.fault!.message).toContain('size 30');
  });

  it('a receipt forked at the same seq (a valid variant after the original) is seq_duplicate', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l.splice(6, 0, signLine(editPayload(l[5]!, (p) => (p.request_id = 'req-fork')), base.seed));
    });
    expectFault(await run(dir), 'seq_duplicate', { seq: '5', line: 7 });
  });

  it('an earlier receipt fault is reported before a later chain fault', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[3] = flipSignatureBit(l[3]!);
      l.splice(20, 1);
    });
    expectFault(await run(dir), 'signature_invalid', { seq: '3', line: 4 });
  });

  it('a line whose signature fails is named by where it stands, not by the seq its edited payload claims (s28 review)', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[3] = withPayloadKeepSig(l[3]!, editPayload(l[3]!, (p) => (p.seq = '49')));
    });
    const r = await run(dir);
    expectFault(r, 'signature_invalid', { seq: '3', line: 4 });
    expect(r.fault!.message).toContain('claims seq 49');
    expect(verifyLogOf(dir)).toMatchObject({ ok: false, error: { code: 'signature_invalid', seq: '3' } });
  });

  it('after a gap, a forged line that only claims the missing seq leaves it a gap, not a reorder (s28 review)', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      const [gone] = l.splice(5, 1);
      l.push(flipSignatureBit(gone!));
    });
    expectFault(await run(dir), 'seq_gap', { seq: '5', line: 6 });
    expect(verifyLogOf(dir)).toMatchObject({ ok: false, error: { code: 'seq_gap', seq: '5' } });
  });

  it('a gap is reported before a later bad signature (the first fault wins)', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[20] = flipSignatureBit(l[20]!);
      l.splice(5, 1);
    });
    // (named at the line where seq 5 belongs, which now holds seq 6: s30 review)
    expectFault(await run(dir), 'seq_gap', { seq: '5', line: 6 });
  });
});

describe('audit: checkpoints', () => {
  it('two validly signed checkpoints of one size with different roots are checkpoint_fork', async () => {
    const dir = fresh();
    writeCheckpointFile(dir, 'checkpoints/20.fork', makeCheckpoint(base.seed, base.origin, 20, base.roots[19]!));
    const r = await run(dir);
    expectFault(r, 'checkpoint_fork');
    expect(r.fault!.message).toContain('size 20');
  });

  it('a fork through the `checkpoint` file alone is checkpoint_fork too', async () => {
    const dir = fresh();
    writeCheckpointFile(dir, 'checkpoint', makeCheckpoint(base.seed, base.origin, 30, base.roots[29]!));
    expectFault(await run(dir), 'checkpoint_fork');
  });

  it('a validly signed checkpoint whose root is not the log root is checkpoint_root_mismatch', async () => {
    const dir = fresh();
    writeCheckpointFile(dir, 'checkpoints/20', makeCheckpoint(base.seed, base.origin, 20, base.roots[19]!));
    const r = await run(dir);
    expectFault(r, 'checkpoint_root_mismatch');
    expect(r.fault!.message).toContain('size 20');
  });

  it('a checkpoint of a size the log does not reach is checkpoint_size_exceeds_log', async () => {
    const dir = fresh();
    writeCheckpointFile(dir, 'checkpoints/31', makeCheckpoint(base.seed, base.origin, 31, base.roots[30]!));
    const r = await run(dir);
    expectFault(r, 'checkpoint_size_exceeds_log');
    expect(r.fault!.message).toContain('size 31');
  });

  it('a size-0 checkpoint of the empty root is accepted', async () => {
    const dir = fresh();
    writeCheckpointFile(dir, 'checkpoints/0', makeCheckpoint(base.seed, base.origin, 0, base.roots[0]!));
    const r = await run(dir);
    expect(r.ok).toBe(true);
    expect(r.summary!.checkpoints).toBe(4);
  });

  it('a checkpoint signed by another key under the provider origin is note_no_known_signature', async () => {
    const dir = fresh();
    writeCheckpointFile(dir, 'checkpoint', makeCheckpoint(randomSeed(), base.origin, 30, base.roots[30]!));
    expectFault(await run(dir), 'note_no_known_signature');
  });

  it('a checkpoint of another key own log is note_no_known_signature', async () => {
    const dir = fresh();
    const other = randomSeed();
    writeCheckpointFile(dir, 'checkpoint', makeCheckpoint(other, `${providerIdOf(other)}/receipts`, 30, base.roots[30]!));
    expectFault(await run(dir), 'note_no_known_signature');
  });

  it('a checkpoint by the provider key for another origin is checkpoint_origin_mismatch', async () => {
    const dir = fresh();
    writeCheckpointFile(dir, 'checkpoint', makeCheckpoint(base.seed, 'example.com/other-log', 30, base.roots[30]!, base.origin));
    expectFault(await run(dir), 'checkpoint_origin_mismatch');
  });

  it('a checkpoint whose text was edited after signing is signature_invalid', async () => {
    const dir = fresh();
    const file = path.join(dir, 'checkpoints', '20');
    const note = fs.readFileSync(file, 'utf8');
    fs.writeFileSync(file, note.replace('\n20\n', '\n19\n'));
    const r = await run(dir);
    expectFault(r, 'signature_invalid');
    expect(r.fault!.message).toMatch(/^checkpoints\/20: /); // the file, not its place in a list
  });

  it('a stray file in checkpoints/ is named by its path', async () => {
    const dir = fresh();
    fs.writeFileSync(path.join(dir, 'checkpoints', 'abc'), 'not a note\n');
    const r = await run(dir);
    expect(r.ok).toBe(false);
    expect(r.fault!.message).toMatch(/^checkpoints\/abc: /);
  });

  it('an unreadable checkpoint file is checkpoint_malformed', async () => {
    const dir = fresh();
    fs.mkdirSync(path.join(dir, 'checkpoints', 'not-a-file'));
    expectFault(await run(dir), 'checkpoint_malformed');
  });

  it('a checkpoint file that is not UTF-8 is checkpoint_malformed, said so (read strictly, as receipts.jsonl is: s28 review)', async () => {
    const dir = fresh();
    const bytes = fs.readFileSync(path.join(dir, 'checkpoint'));
    const at = bytes.indexOf(0x0a) + 1; // (after the origin line: a lone 0xFF byte where a lenient read gives U+FFFD)
    fs.writeFileSync(path.join(dir, 'checkpoint'), Buffer.concat([bytes.subarray(0, at), Buffer.from([0xff, 0x0a]), bytes.subarray(at)]));
    const r = await run(dir);
    expectFault(r, 'checkpoint_malformed');
    expect(r.fault!.message).toBe('checkpoint is not a readable checkpoint (UTF-8, at most 64 KiB)');
  });
});

describe('audit: the export folder', () => {
  it('a missing folder is export_missing_file', async () => {
    expectFault(await run(path.join(base.root, 'no-such-export')), 'export_missing_file');
  });

  it('a missing provider.pub is export_missing_file', async () => {
    const dir = fresh();
    fs.rmSync(path.join(dir, 'provider.pub'));
    const r = await run(dir);
    expectFault(r, 'export_missing_file');
    expect(r.fault!.message).toContain('provider.pub');
  });

  it('a missing receipts.jsonl is export_missing_file', async () => {
    const dir = fresh();
    fs.rmSync(path.join(dir, 'receipts.jsonl'));
    const r = await run(dir);
    expectFault(r, 'export_missing_file');
    expect(r.fault!.message).toContain('receipts.jsonl');
  });

  it("a node's data dir given instead of an export says to export it first", async () => {
    const dir = fs.mkdtempSync(path.join(base.root, 'datadir-'));
    fs.writeFileSync(path.join(dir, 'receipts.db'), '');
    const r = await run(dir);
    expectFault(r, 'export_missing_file');
    expect(r.fault!.message).toBe(`provider.pub is missing from ${dir}; ${dir} looks like a node's data dir, not an export: run seller-node log export --data ${dir} --out DIR, then audit DIR`);
    // An export folder missing a file gets no such hint.
    const other = fresh();
    fs.rmSync(path.join(other, 'provider.pub'));
    expect((await run(other)).fault!.message).toBe(`provider.pub is missing from ${other}`);
  });

  it('a provider.pub that is not hex is export_malformed', async () => {
    const dir = fresh();
    fs.writeFileSync(path.join(dir, 'provider.pub'), 'not a key\n');
    expectFault(await run(dir), 'export_malformed');
  });

  it('a provider.pub in upper-case hex is export_malformed', async () => {
    const dir = fresh();
    fs.writeFileSync(path.join(dir, 'provider.pub'), base.providerId.toUpperCase() + '\n');
    expectFault(await run(dir), 'export_malformed');
  });

  it('a provider.pub naming another key fails on the first thing checked by it: the price list, else the first receipt (unknown_key)', async () => {
    const dir = fresh();
    fs.writeFileSync(path.join(dir, 'provider.pub'), providerIdOf(randomSeed()) + '\n');
    const r = await run(dir);
    expectFault(r, 'price_list_invalid');
    expect(r.fault!.message).toContain('unknown_key');
    fs.rmSync(path.join(dir, 'prices'), { recursive: true });
    expectFault(await run(dir), 'unknown_key', { seq: '0', line: 1 });
  });

  it('a 2 MiB line is envelope_malformed at its line', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[10] = 'x'.repeat(2 << 20);
    });
    const r = await run(dir);
    expectFault(r, 'envelope_malformed', { line: 11 });
    expect(r.fault!.message).toContain('1 MiB');
  });

  it('a line of exactly 1 MiB is read; one byte more is envelope_malformed', async () => {
    const pad = (l: string[], i: number, size: number) => void (l[i] = ' '.repeat(size - l[i]!.length) + l[i]);
    const ok = fresh();
    // A padded line is read and verified (its signature holds) but is not the canonical line the
    // Merkle leaf commits to; one byte past 1 MiB it is not read at all.
    editLines(ok, (l) => pad(l, 10, 1 << 20));
    expectFault(await run(ok), 'envelope_not_canonical', { line: 11, seq: '10' });
    const bad = fresh();
    editLines(bad, (l) => pad(l, 10, (1 << 20) + 1));
    expectFault(await run(bad), 'envelope_malformed', { line: 11 });
  });

  it('a 2 MiB last line without a final newline is envelope_malformed', async () => {
    const dir = fresh();
    fs.appendFileSync(path.join(dir, 'receipts.jsonl'), '{' + ' '.repeat(2 << 20));
    expectFault(await run(dir), 'envelope_malformed', { line: 31 });
  });

  it('a fault before a 2 MiB line is the one reported', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[2] = flipSignatureBit(l[2]!);
      l[10] = 'x'.repeat(2 << 20);
    });
    expectFault(await run(dir, { chunkBytes: 4096 }), 'signature_invalid', { seq: '2', line: 3 });
  });

  it('an empty receipts.jsonl without checkpoints is log_empty', async () => {
    const dir = fresh();
    writeReceiptLines(dir, []);
    removeCheckpoints(dir);
    expectFault(await run(dir), 'log_empty');
  });

  it('an empty receipts.jsonl with the checkpoints still there is checkpoint_size_exceeds_log', async () => {
    const dir = fresh();
    writeReceiptLines(dir, []);
    expectFault(await run(dir), 'checkpoint_size_exceeds_log');
  });

  it('a blank line after the last receipt is envelope_not_json at that line', async () => {
    const dir = fresh();
    fs.appendFileSync(path.join(dir, 'receipts.jsonl'), '\n');
    expectFault(await run(dir), 'envelope_not_json', { line: 31 });
  });
});

describe('audit with worker threads', () => {
  it('names the same fault as in-process, across chunks', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l[25] = flipSignatureBit(l[25]!);
    });
    expectFault(await run(dir, { threads: 2, chunkBytes: 4096 }), 'signature_invalid', { seq: '25', line: 26 });
    expectFault(await run(dir, { threads: 2, chunkBytes: 4096 }), 'signature_invalid', { seq: '25', line: 26 });
  });

  it('reports chain faults in file order', async () => {
    const dir = fresh();
    editLines(dir, (l) => {
      l.splice(15, 0, l[14]!);
      l[27] = flipSignatureBit(l[27]!);
    });
    expectFault(await run(dir, { threads: 2, chunkBytes: 4096 }), 'seq_duplicate', { seq: '14', line: 16 });
  });
});

describe('verifyLog agrees with audit', () => {
  const cases: [string, (dir: string) => void][] = [
    ['clean', () => {}],
    ['cost_mismatch', (d) => editLines(d, (l) => void (l[9] = signLine(editPayload(l[9]!, (p) => (p.cost_micro_usd = String(BigInt(p.cost_micro_usd) + 1n))), base.seed)))],
    ['seq_gap', (d) => editLines(d, (l) => void l.splice(5, 1))],
    ['seq_duplicate', (d) => editLines(d, (l) => void l.splice(15, 0, l[14]!))],
    ['seq_out_of_order', (d) => editLines(d, (l) => void ([l[17], l[18]] = [l[18]!, l[17]!]))],
    ['prev_mismatch', (d) => editLines(d, (l) => void (l[11] = signLine(editPayload(l[11]!, (p) => (p.request_id = 'req-x')), base.seed)))],
    ['checkpoint_fork', (d) => writeCheckpointFile(d, 'checkpoints/20.fork', makeCheckpoint(base.seed, base.origin, 20, base.roots[19]!))],
    ['checkpoint_root_mismatch', (d) => writeCheckpointFile(d, 'checkpoints/20', makeCheckpoint(base.seed, base.origin, 20, base.roots[19]!))],
    ['checkpoint_size_exceeds_log', (d) => editLines(d, (l) => void l.pop())],
    ['note_no_known_signature', (d) => writeCheckpointFile(d, 'checkpoint', makeCheckpoint(randomSeed(), base.origin, 30, base.roots[30]!))],
    ['envelope_not_json', (d) => editLines(d, (l) => void (l[6] = l[6]!.slice(0, 50)))],
    ['log_empty', (d) => (writeReceiptLines(d, []), removeCheckpoints(d))],
  ];
  for (const [name, tamper] of cases) {
    it(`${name}: same verdict, code and seq`, async () => {
      const dir = fresh();
      tamper(dir);
      const a = await run(dir);
      const v = verifyLogOf(dir);
      if (name === 'clean') {
        expect(a.ok).toBe(true);
        expect(v.ok).toBe(true);
        expect(v.ok && v.value).toEqual(a.summary);
        return;
      }
      expect(a.fault?.code).toBe(name);
      expect(v.ok).toBe(false);
      expect(!v.ok && v.error.code).toBe(name);
      expect(!v.ok && v.error.seq).toBe(a.fault!.seq);
    });
  }

  // Faults found before the payload is read: both name the seq the line claims (peekSeq).
  const early: [string, (dir: string) => void, string][] = [
    ['signature_invalid', (d) => editLines(d, (l) => void (l[12] = flipSignatureBit(l[12]!))), '12'],
    ['unknown_key', (d) => editLines(d, (l) => void (l[4] = signLine(payloadBytesOf(l[4]!), randomSeed()))), '4'],
    ['payload_not_canonical', (d) => editLines(d, (l) => void (l[3] = signLine(new TextEncoder().encode(JSON.stringify(payloadOf(l[3]!), null, 1)), base.seed))), '3'],
  ];
  for (const [name, tamper, seq] of early) {
    it(`${name}: same code and seq`, async () => {
      const dir = fresh();
      tamper(dir);
      const a = await run(dir);
      const v = verifyLogOf(dir);
      expect([a.fault?.code, a.fault?.seq]).toEqual([name, seq]);
      expect(!v.ok && [v.error.code, v.error.seq]).toEqual([name, seq]);
    });
  }
});

describe('audit: every price against the signed price lists', () => {
  // Rates the node never published: a receipt signed at them is consistent in itself (its cost is
  // usage × these rates, within its hold), so only the price list can catch it.
  const HIGHER = { input_per_mtok: '150000', output_per_mtok: '900000' };
  let mispriced: BuiltLog;

  beforeAll(async () => {
    mispriced = await buildLog({ count: COUNT, checkpointEvery: 10, body: (i) => (i === 7 ? repriced(syntheticReceiptBody(i), HIGHER) : syntheticReceiptBody(i)) });
    temps.push(mispriced.root);
  });

  /** A fresh copy of an export folder. */
  function copyOf(dir: string): string {
    const t = tempDir();
    temps.push(t);
    fs.cpSync(dir, path.join(t, 'export'), { recursive: true });
    return path.join(t, 'export');
  }

  const priceFile = (dir: string) => path.join(dir, 'prices', `${base.priceVersion}.json`);

  it('a receipt signed at rates other than its price list, chain and cost intact, is price_mismatch at its seq', async () => {
    // Everything a receipt carries within itself holds: without the lists, the log verifies.
    expect(verifyLog({ provider: mispriced.providerId, receipts: mispriced.lines, checkpoints: notesOf(mispriced.exportDir) }).ok).toBe(true);
    const r = await run(mispriced.exportDir);
    expectFault(r, 'price_mismatch', { seq: '7', line: 8 });
    expect(r.fault!.field).toBe('price.rates');
    expect(r.fault!.message).toContain('"output_per_mtok":"900000"');
    expect(r.fault!.message).toContain(`price list ${mispriced.priceVersion}`);
    expect(r.fault!.message).toContain('"output_per_mtok":"600000"');
  });

  it('names the same receipt with worker threads and small chunks', async () => {
    expectFault(await run(mispriced.exportDir, { threads: 2, chunkBytes: 4096 }), 'price_mismatch', { seq: '7', line: 8 });
  });

  it('a receipt for a model its price list does not have is price_mismatch', async () => {
    const e = await buildLog({ count: 10, checkpointEvery: 10, body: (i) => (i === 4 ? { ...syntheticReceiptBody(i), model: 'synthetic/unlisted' } : syntheticReceiptBody(i)) });
    temps.push(e.root);
    const r = await run(e.exportDir);
    expectFault(r, 'price_mismatch', { seq: '4', line: 5 });
    expect(r.fault!.field).toBe('model');
    expect(r.fault!.message).toContain('synthetic/unlisted');
  });

  it('a receipt citing a price version no list in the export has is price_list_missing', async () => {
    const unpublished = priceVersion([{ model: 'synthetic/tiny-llama', ...HIGHER }]);
    const e = await buildLog({ count: 15, checkpointEvery: 10, body: (i) => (i === 12 ? repriced(syntheticReceiptBody(i), HIGHER, unpublished) : syntheticReceiptBody(i)) });
    temps.push(e.root);
    const r = await run(e.exportDir);
    expectFault(r, 'price_list_missing', { seq: '12', line: 13 });
    expect(r.fault!.message).toContain(unpublished);
    expect(r.fault!.message).not.toContain('no prices/ folder');
  });

  it('an export with no prices/ folder (written before exports carried them) is price_list_missing at the first receipt, saying so', async () => {
    const dir = fresh();
    fs.rmSync(path.join(dir, 'prices'), { recursive: true });
    const r = await run(dir);
    expectFault(r, 'price_list_missing', { seq: '0', line: 1 });
    expect(r.fault!.message).toContain(base.priceVersion);
    expect(r.fault!.message).toContain('no prices/ folder');
  });

  it('an empty prices/ folder is price_list_missing at the first receipt', async () => {
    const dir = fresh();
    fs.rmSync(priceFile(dir));
    const r = await run(dir);
    expectFault(r, 'price_list_missing', { seq: '0', line: 1 });
    expect(r.fault!.message).not.toContain('no prices/ folder');
  });

  it('an empty log is log_empty, prices or not', async () => {
    const dir = fresh();
    writeReceiptLines(dir, []);
    removeCheckpoints(dir);
    fs.rmSync(path.join(dir, 'prices'), { recursive: true });
    expectFault(await run(dir), 'log_empty');
  });

  it('a price list edited after signing (cheaper rates, the signature kept) is price_list_invalid', async () => {
    const dir = fresh();
    const env = JSON.parse(fs.readFileSync(priceFile(dir), 'utf8')) as DsseEnvelope;
    const payload = JSON.parse(Buffer.from(env.payload, 'base64').toString('utf8'));
    payload.models[0].output_per_mtok = '1';
    fs.writeFileSync(priceFile(dir), serializeEnvelope({ ...env, payload: toBase64(utf8(canonicalize(payload))) }));
    const r = await run(dir);
    expectFault(r, 'price_list_invalid');
    expect(r.fault!.message).toContain(`prices/${base.priceVersion}.json`);
    expect(r.fault!.message).toContain('signature_invalid');
  });

  it("another provider's price list (the same prices, its own key) is price_list_invalid", async () => {
    const other = randomSeed();
    const dir = fresh();
    // Same prices, so the same version: only the key tells it from the provider's.
    writePriceFile(dir, syntheticPriceList(other, providerIdOf(other)));
    const r = await run(dir);
    expectFault(r, 'price_list_invalid');
    expect(r.fault!.message).toContain('unknown_key');
  });

  it('a list signed by the provider key that names another provider, or signed by another key under its id, is price_list_invalid', async () => {
    const named = fresh();
    const forOther = signPriceList(base.seed, providerIdOf(randomSeed()), SYNTHETIC_PRICE_LIST);
    writePriceFile(named, { ...forOther, envelope: { ...forOther.envelope, signatures: [{ ...forOther.envelope.signatures[0]!, keyid: base.providerId }] } });
    const r1 = await run(named);
    expectFault(r1, 'price_list_invalid');
    expect(r1.fault!.message).toContain('provider_mismatch');
    const forged = fresh();
    writePriceFile(forged, signPriceList(randomSeed(), base.providerId, SYNTHETIC_PRICE_LIST));
    const r2 = await run(forged);
    expectFault(r2, 'price_list_invalid');
    expect(r2.fault!.message).toContain('signature_invalid');
  });

  it('a list filed under another version is price_list_invalid', async () => {
    const dir = fresh();
    fs.renameSync(priceFile(dir), path.join(dir, 'prices', 'p-00000000000000000000000000000000.json'));
    const r = await run(dir);
    expectFault(r, 'price_list_invalid');
    expect(r.fault!.message).toContain(`holds price version ${base.priceVersion}`);
  });

  it('garbage, a folder, a stray or an oversized file in prices/ is price_list_invalid; dotfiles are ignored; the audit always answers', async () => {
    const cases: [string, (dir: string) => void][] = [
      ['garbage', (d) => fs.writeFileSync(priceFile(d), Buffer.from([0, 1, 2, 255, 254, 10]))],
      ['not an envelope', (d) => fs.writeFileSync(priceFile(d), '[1,2,3]')],
      ['a folder', (d) => fs.mkdirSync(path.join(d, 'prices', 'p-1.json'))],
      ['a stray file', (d) => fs.writeFileSync(path.join(d, 'prices', 'notes.txt'), 'hello')],
      ['a 2 MiB file', (d) => fs.writeFileSync(path.join(d, 'prices', 'p-2.json'), ' '.repeat(2 << 20))],
    ];
    for (const [name, tamper] of cases) {
      const dir = fresh();
      tamper(dir);
      const r = await run(dir);
      expect(r.fault?.code, name).toBe('price_list_invalid');
    }
    const dir = fresh();
    fs.writeFileSync(path.join(dir, 'prices', '.DS_Store'), 'x');
    expect((await run(dir)).ok).toBe(true);
    const unreadable = fresh();
    fs.rmSync(path.join(unreadable, 'prices'), { recursive: true });
    fs.writeFileSync(path.join(unreadable, 'prices'), 'not a folder');
    expectFault(await run(unreadable), 'export_malformed');
  });

  it('the first fault in file order is the one named', async () => {
    const sigFirst = copyOf(mispriced.exportDir);
    editLines(sigFirst, (l) => void (l[3] = flipSignatureBit(l[3]!)));
    expectFault(await run(sigFirst), 'signature_invalid', { seq: '3', line: 4 });
    const priceFirst = copyOf(mispriced.exportDir);
    editLines(priceFirst, (l) => void l.splice(20, 1));
    expectFault(await run(priceFirst, { threads: 2, chunkBytes: 4096 }), 'price_mismatch', { seq: '7', line: 8 });
    const gapFirst = copyOf(mispriced.exportDir);
    editLines(gapFirst, (l) => void l.splice(5, 1));
    expectFault(await run(gapFirst), 'seq_gap', { seq: '5', line: 6 });
  });
});

describe('verifyLog with price lists', () => {
  const listsOf = (dir: string) => fs.readdirSync(path.join(dir, 'prices')).map((n) => fs.readFileSync(path.join(dir, 'prices', n), 'utf8'));

  it('agrees with audit on a clean log, from list texts or envelope objects', async () => {
    const a = await run(base.exportDir);
    const texts = listsOf(base.exportDir);
    for (const priceLists of [texts, texts.map((t) => JSON.parse(t) as DsseEnvelope)]) {
      const v = verifyLog({ provider: base.providerId, receipts: base.lines, checkpoints: notesOf(base.exportDir), priceLists });
      expect(v.ok && v.value).toEqual(a.summary);
    }
  });

  it('names a mispriced receipt as audit does, and a version without a list', async () => {
    const e = await buildLog({ count: 12, checkpointEvery: 10, body: (i) => (i === 7 ? repriced(syntheticReceiptBody(i), { input_per_mtok: '1', output_per_mtok: '2' }) : syntheticReceiptBody(i)) });
    temps.push(e.root);
    const v = verifyLog({ provider: e.providerId, receipts: e.lines, priceLists: listsOf(e.exportDir) });
    expect(v).toMatchObject({ ok: false, error: { code: 'price_mismatch', seq: '7', field: 'price.rates' } });
    expect((await run(e.exportDir)).fault).toMatchObject({ code: 'price_mismatch', seq: '7' });
    expect(verifyLog({ provider: e.providerId, receipts: e.lines, priceLists: [] })).toMatchObject({ ok: false, error: { code: 'price_list_missing', seq: '0' } });
  });

  it('refuses a forged list as price_list_invalid, naming its place', () => {
    const other = randomSeed();
    const lists = [...listsOf(base.exportDir), serializeEnvelope(syntheticPriceList(other, providerIdOf(other)).envelope)];
    const v = verifyLog({ provider: base.providerId, receipts: base.lines, priceLists: lists });
    expect(v).toMatchObject({ ok: false, error: { code: 'price_list_invalid' } });
    expect(!v.ok && v.error.message).toMatch(/^price list #2: unknown_key: /);
  });
});

describe('audit against the checkpoints an auditor kept (a provider that re-signs everything)', () => {
  /** The base export's checkpoint files, copied to a folder the auditor keeps. */
  function keptFolder(): string {
    const t = tempDir();
    temps.push(t);
    for (const n of fs.readdirSync(path.join(base.exportDir, 'checkpoints'))) fs.copyFileSync(path.join(base.exportDir, 'checkpoints', n), path.join(t, n));
    return t;
  }

  it('a later export that extends the log passes; one cut short or rewritten (every checkpoint re-signed) passes alone but not against what was kept', async () => {
    const kept = keptFolder();
    const bodyOf = (rewrite: boolean) => (i: number) => (rewrite && i === 5 ? { ...syntheticReceiptBody(i), request_id: 'req-rewritten' } : syntheticReceiptBody(i));
    const later = async (count: number, rewrite = false) => {
      const b = await buildLog({ count, checkpointEvery: 10, seed: base.seed, body: bodyOf(rewrite) });
      temps.push(b.root);
      return b;
    };
    const extended = await later(40);
    const r = await run(extended.exportDir, { kept: [kept] });
    expect(r.ok).toBe(true);
    expect(r.summary!.keptCheckpoints).toBe(3);
    const cut = await later(20);
    const rewritten = await later(40, true);
    for (const [name, b, message] of [
      ['cut', cut, /covers 30 receipts, this log holds 20/],
      ['rewritten', rewritten, /does not match this log's first 10 receipts: the provider rewrote its history/],
    ] as const) {
      expect((await run(b.exportDir)).ok, `${name} alone`).toBe(true); // it agrees with itself
      const f = (await run(b.exportDir, { kept: [kept] })).fault;
      expect(f, name).toMatchObject({ code: 'checkpoint_inconsistent', message: expect.stringMatching(message) });
      expect(f!.message, name).toContain(`the checkpoint you kept in ${kept}/`);
      // verifyLog, with the kept notes, says the same.
      const v = verifyLog({ provider: b.providerId, receipts: b.lines, checkpoints: notesOf(b.exportDir), keptCheckpoints: fs.readdirSync(kept).map((n) => fs.readFileSync(path.join(kept, n), 'utf8')) });
      expect(v, name).toMatchObject({ ok: false, error: { code: 'checkpoint_inconsistent' } });
    }
    // A kept note that is not the provider's (or not a note) is named too.
    const other = randomSeed();
    const foreign = path.join(kept, 'foreign');
    fs.writeFileSync(foreign, makeCheckpoint(other, base.origin, 10, base.roots[10]!));
    expect((await run(extended.exportDir, { kept: [foreign] })).fault).toMatchObject({ code: 'note_no_known_signature', message: expect.stringContaining(foreign) });
    expect((await run(extended.exportDir, { kept: [path.join(kept, 'nope')] })).fault).toMatchObject({ code: 'export_unreadable' });
  });

  it('two receipts for one ticket are billing twice: named at the second; two tickets for one request id are not (the market gives request ids)', async () => {
    const b = await buildLog({ count: 12, checkpointEvery: 10, body: (i) => (i === 9 ? { ...syntheticReceiptBody(i), ticket_id: syntheticReceiptBody(8).ticket_id } : syntheticReceiptBody(i)) });
    temps.push(b.root);
    expect((await run(b.exportDir)).fault).toMatchObject({ code: 'ticket_billed_twice', seq: '9', line: 10, message: expect.stringContaining('already billed by seq 8') });
    expect(verifyLog({ provider: b.providerId, receipts: b.lines })).toMatchObject({ ok: false, error: { code: 'ticket_billed_twice', seq: '9' } });
    const sameRequest = await buildLog({ count: 12, checkpointEvery: 10, body: (i) => (i === 9 ? { ...syntheticReceiptBody(i), request_id: syntheticReceiptBody(8).request_id } : syntheticReceiptBody(i)) });
    temps.push(sameRequest.root);
    expect((await run(sameRequest.exportDir)).ok).toBe(true);
  });

  it('a receipts.jsonl that is not a regular file (a FIFO) is refused at once, never waited on', async () => {
    const dir = fresh();
    const file = path.join(dir, 'receipts.jsonl');
    fs.rmSync(file);
    const { execFileSync } = await import('node:child_process');
    execFileSync('mkfifo', [file]);
    expect((await run(dir)).fault).toMatchObject({ code: 'export_malformed', message: expect.stringContaining('not a regular file') });
  });

  it('a line that is not UTF-8 is envelope_not_json, not read leniently', async () => {
    const dir = fresh();
    const file = path.join(dir, 'receipts.jsonl');
    const bytes = fs.readFileSync(file);
    const lines = bytes.toString('utf8').split('\n');
    // An extra signature by an unknown key whose keyid holds the byte 0xFF.
    const env = JSON.parse(lines[4]!) as DsseEnvelope;
    const withSig = JSON.stringify({ ...env, signatures: [...env.signatures, { keyid: 'K', sig: env.signatures[0]!.sig }] });
    const at = Buffer.byteLength(withSig.slice(0, withSig.lastIndexOf('"K"') + 1));
    const line = Buffer.from(withSig);
    line[at] = 0xff;
    fs.writeFileSync(file, Buffer.concat([Buffer.from(lines.slice(0, 4).join('\n') + '\n'), line, Buffer.from('\n' + lines.slice(5).join('\n'))]));
    expect((await run(dir)).fault).toMatchObject({ code: 'envelope_not_json', line: 5, message: expect.stringContaining('UTF-8') });
  });
});

describe('audit reads the last line even without its newline', () => {
  const roots: string[] = [];
  afterAll(() => roots.forEach((r) => fs.rmSync(r, { recursive: true, force: true })));
  it('an export whose receipts.jsonl lacks the final newline audits every receipt', async () => {
    const b = await buildLog({ count: 5, checkpointEvery: 100 });
    roots.push(b.root);
    const file = path.join(b.exportDir, 'receipts.jsonl');
    fs.writeFileSync(file, fs.readFileSync(file, 'utf8').replace(/\n$/, ''));
    const r = await audit({ dir: b.exportDir, threads: 0 });
    expect(r.ok).toBe(true);
    expect(r.summary?.receipts).toBe(5);
  });
});
