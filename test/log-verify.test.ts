import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { verifyCheckpointConsistency } from '../attestation/log-verify.ts';
import { EMPTY_ROOT } from '../attestation/merkle.ts';
import { signCheckpoint, receiptLogOrigin } from '../attestation/checkpoint.ts';
import { audit } from '../src/audit/audit.ts';
import { signPriceList, verifyPriceList } from '../attestation/price-list.ts';
import { readPriceLists, savePriceList } from '../src/data-dir.ts';
import { exportLog } from '../src/store/export.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';
import { syntheticPriceList, syntheticReceiptBody } from '../src/store/synthetic.ts';
import { buildLog, removeTemp, tempDir, randomSeed, providerIdOf, type BuiltLog } from './helpers/tamper-log.ts';

const temps: string[] = [];
afterEach(() => {
  for (const d of temps.splice(0)) removeTemp(d);
});

describe('verifyCheckpointConsistency (what a buyer checks between two checkpoints)', () => {
  test('an older checkpoint extends to a newer one with the log\'s proof; anything else is refused', async () => {
    const dir = tempDir();
    temps.push(dir);
    const seed = randomSeed();
    const log = ReceiptLog.open({ path: path.join(dir, 'r.db'), seed, threads: 0, checkpointIntervalMs: 0, checkpointEvery: 1000 });
    await Promise.all(Array.from({ length: 13 }, (_, i) => log.append(syntheticReceiptBody(i))));
    const older = log.checkpoint()!;
    await Promise.all(Array.from({ length: 20 }, (_, i) => log.append(syntheticReceiptBody(13 + i))));
    const newer = log.checkpoint()!;
    const proof = log.consistencyProof(13, 33);
    const id = log.providerId;
    expect(verifyCheckpointConsistency(older, newer, proof, id)).toMatchObject({ ok: true, value: { older: { size: 13 }, newer: { size: 33 } } });
    expect(verifyCheckpointConsistency(older, older, [], id).ok).toBe(true);
    expect(verifyCheckpointConsistency(newer, older, proof, id)).toMatchObject({ ok: false, error: { code: 'checkpoint_inconsistent' } });
    const bad = proof.map((h, i) => (i === 0 ? Uint8Array.from(h, (b, j) => (j === 0 ? b ^ 1 : b)) : h));
    expect(verifyCheckpointConsistency(older, newer, bad, id)).toMatchObject({ ok: false, error: { code: 'checkpoint_inconsistent' } });
    // The node signs a second, different tree of size 33: a fork.
    const origin = receiptLogOrigin(id);
    const forked = signCheckpoint({ origin, size: 33, rootHash: log.root(32) }, { name: origin, seed });
    expect(verifyCheckpointConsistency(newer, forked, [], id)).toMatchObject({ ok: false, error: { code: 'checkpoint_fork' } });
    expect(verifyCheckpointConsistency(older, newer, proof, '00'.repeat(32))).toMatchObject({ ok: false, error: { code: 'note_no_known_signature' } });
    // Size 0 has one root, the empty tree's, and from it (or to the same size) the proof is empty (s23 h3).
    const empty = signCheckpoint({ origin, size: 0, rootHash: EMPTY_ROOT }, { name: origin, seed });
    expect(verifyCheckpointConsistency(empty, newer, [], id).ok).toBe(true);
    const bogus = signCheckpoint({ origin, size: 0, rootHash: new Uint8Array(32).fill(7) }, { name: origin, seed });
    expect(verifyCheckpointConsistency(bogus, newer, [], id)).toMatchObject({ ok: false, error: { code: 'checkpoint_root_mismatch' } });
    expect(verifyCheckpointConsistency(empty, newer, [new Uint8Array(32), new Uint8Array(5)], id)).toMatchObject({ ok: false, error: { code: 'proof_size_mismatch' } });
    expect(verifyCheckpointConsistency(older, older, [proof[0]!], id)).toMatchObject({ ok: false, error: { code: 'proof_size_mismatch' } });
    await log.close();
  });
});

describe('export', () => {
  test('exporting into a folder that held another log leaves none of its checkpoints or price lists behind', async () => {
    const dir = tempDir();
    temps.push(dir);
    const seed = randomSeed();
    const log1 = ReceiptLog.open({ path: path.join(dir, 'one.db'), seed, threads: 0, checkpointIntervalMs: 0, checkpointEvery: 10 });
    await Promise.all(Array.from({ length: 30 }, (_, i) => log1.append(syntheticReceiptBody(i))));
    const out = path.join(dir, 'out');
    const list1 = syntheticPriceList(seed, log1.providerId).envelope;
    await exportLog(log1, out, [{ version: 'p-0123456789abcdef0123456789abcdef', text: JSON.stringify(list1) }]);
    await log1.close();
    const seed2 = randomSeed();
    const log2 = ReceiptLog.open({ path: path.join(dir, 'two.db'), seed: seed2, threads: 0, checkpointIntervalMs: 0, checkpointEvery: 4 });
    await Promise.all(Array.from({ length: 8 }, (_, i) => log2.append(syntheticReceiptBody(i))));
    const data2 = path.join(dir, 'data2');
    savePriceList(data2, syntheticPriceList(seed2, log2.providerId));
    await exportLog(log2, out, readPriceLists(data2));
    await log2.close();
    expect(fs.readdirSync(path.join(out, 'checkpoints')).sort()).toEqual(['4', '8']);
    expect(fs.readdirSync(path.join(out, 'prices'))).toEqual([`${syntheticPriceList(seed2, log2.providerId).payload.version}.json`]);
    expect(fs.readdirSync(out).filter((n) => n.endsWith('.tmp'))).toEqual([]);
    expect((await audit({ dir: out, threads: 0 })).ok).toBe(true);
  });

  test('carries every price list of the data dir, byte for byte, each verifying for the provider', async () => {
    const dir = tempDir();
    temps.push(dir);
    const seed = randomSeed();
    const id = providerIdOf(seed);
    const lists = [syntheticPriceList(seed, id), signPriceList(seed, id, [{ model: 'a/b', input_per_mtok: '1', output_per_mtok: '2' }])];
    for (const l of lists) savePriceList(dir, l);
    const log = ReceiptLog.open({ path: path.join(dir, 'receipts.db'), seed, threads: 0, checkpointIntervalMs: 0 });
    await log.append(syntheticReceiptBody(0));
    const out = path.join(dir, 'out');
    const s = await exportLog(log, out, readPriceLists(dir));
    await log.close();
    expect(s.priceLists).toBe(2);
    const names = lists.map((l) => `${l.payload.version}.json`).sort();
    expect(fs.readdirSync(path.join(out, 'prices')).sort()).toEqual(names);
    for (const n of names) {
      const text = fs.readFileSync(path.join(out, 'prices', n), 'utf8');
      expect(text).toBe(fs.readFileSync(path.join(dir, 'prices', n), 'utf8'));
      expect(verifyPriceList(text, { provider: id })).toMatchObject({ ok: true, value: { version: n.slice(0, -5) } });
    }
    const r = await audit({ dir: out, threads: 0 });
    expect(r.ok).toBe(true);
    expect(r.priceVersions!.sort()).toEqual(names.map((n) => n.slice(0, -5)));
  });

  test('a line that is not the canonical envelope (CRLF) is envelope_not_canonical', async () => {
    const b: BuiltLog = await buildLog({ count: 5, checkpointEvery: 5 });
    temps.push(b.root);
    const file = path.join(b.exportDir, 'receipts.jsonl');
    const lines = fs.readFileSync(file, 'utf8').split('\n');
    lines[2] = lines[2] + '\r';
    fs.writeFileSync(file, lines.join('\n'));
    const r = await audit({ dir: b.exportDir, threads: 0 });
    expect(r.fault).toMatchObject({ code: 'envelope_not_canonical', seq: '2', line: 3 });
  });

  test('a line with a field the envelope does not have (ignored by a reader, not signed) is envelope_not_canonical', async () => {
    const { verifyReceipt } = await import('../attestation/receipt-verify.ts');
    const b: BuiltLog = await buildLog({ count: 5, checkpointEvery: 5 });
    temps.push(b.root);
    const file = path.join(b.exportDir, 'receipts.jsonl');
    for (const extra of [(e: Record<string, unknown>) => ({ ...e, note: 'x' }), (e: Record<string, unknown>) => ({ ...e, signatures: (e.signatures as object[]).map((g) => ({ ...g, x: 1 })) })]) {
      const lines = b.lines.slice();
      lines[2] = JSON.stringify(extra(JSON.parse(lines[2]!) as Record<string, unknown>));
      fs.writeFileSync(file, lines.join('\n') + '\n');
      expect(verifyReceipt(lines[2]!, { provider: b.providerId }).ok).toBe(true); // one receipt: read as DSSE allows
      expect(verifyReceipt(lines[2]!, { provider: b.providerId, chain: true })).toMatchObject({ ok: false, error: { code: 'envelope_not_canonical' } });
      expect((await audit({ dir: b.exportDir, threads: 0 })).fault).toMatchObject({ code: 'envelope_not_canonical', seq: '2', line: 3 });
    }
  });

  test('a line in URL-safe base64 (a form DSSE lets a reader accept, its signature still good) is envelope_not_canonical', async () => {
    const b: BuiltLog = await buildLog({ count: 5, checkpointEvery: 5 });
    temps.push(b.root);
    const file = path.join(b.exportDir, 'receipts.jsonl');
    const lines = fs.readFileSync(file, 'utf8').split('\n');
    const env = JSON.parse(lines[1]!) as { payload: string; signatures: { sig: string }[] };
    const url = (t: string) => t.replaceAll('+', '-').replaceAll('/', '_').replace(/=+$/, '');
    expect(url(env.payload) + url(env.signatures[0]!.sig)).not.toBe(env.payload + env.signatures[0]!.sig);
    lines[1] = lines[1]!.replace(env.payload, url(env.payload)).replace(env.signatures[0]!.sig, url(env.signatures[0]!.sig));
    fs.writeFileSync(file, lines.join('\n'));
    const { verifyReceipt } = await import('../attestation/receipt-verify.ts');
    expect(verifyReceipt(lines[1]!, { provider: b.providerId }).ok).toBe(true); // the receipt itself verifies
    const r = await audit({ dir: b.exportDir, threads: 0 });
    expect(r.fault).toMatchObject({ code: 'envelope_not_canonical', seq: '1', line: 2 });
  });
});

describe('the verifier answers, never throws, on what callers really pass', () => {
  test('a provider id read with its newline or in capitals, missing arguments, hostile objects', async () => {
    const { verifyLog, checkCheckpoints } = await import('../attestation/log-verify.ts');
    const { verifyReceiptProof } = await import('../attestation/receipt-proof.ts');
    const { MerkleTree } = await import('../attestation/merkle.ts');
    const b: BuiltLog = await buildLog({ count: 3, checkpointEvery: 3 });
    temps.push(b.root);
    const note = fs.readFileSync(path.join(b.exportDir, 'checkpoint'), 'utf8');
    const pubText = fs.readFileSync(path.join(b.exportDir, 'provider.pub'), 'utf8');
    expect(pubText).toBe(`${b.providerId}\n`);
    for (const provider of [pubText, b.providerId.toUpperCase()]) {
      expect(verifyCheckpointConsistency(note, note, [], provider)).toMatchObject({ ok: false, error: { code: 'unknown_key' } });
      expect(verifyLog({ provider, receipts: [], checkpoints: [note] })).toMatchObject({ ok: false, error: { code: 'unknown_key' } });
      expect(checkCheckpoints([note], provider, new MerkleTree())).toMatchObject({ ok: false, error: { code: 'unknown_key' } });
    }
    const evil = { get payloadType(): string { throw new Error('boom'); }, payload: '', signatures: [{ sig: '' }] };
    expect(verifyPriceList(evil as never, { provider: b.providerId })).toMatchObject({ ok: false, error: { code: 'envelope_malformed' } });
    expect(verifyPriceList('{}', undefined as never)).toMatchObject({ ok: false, error: { code: 'options_invalid' } });
    {
      // Options given as null: read as none (the provider from the checkpoint's origin).
      const { MerkleTree, leafHash } = await import('../attestation/merkle.ts');
      const { formatProofBundle } = await import('../attestation/tlog-proof.ts');
      const { makeCheckpoint } = await import('./helpers/tamper-log.ts');
      const tree = MerkleTree.fromLeafHashes(b.lines.map((l) => leafHash(l)));
      const bundle = formatProofBundle({ index: 1, proof: tree.inclusionProof(1, b.lines.length), checkpointNote: makeCheckpoint(b.seed, b.origin, b.lines.length, tree.root(b.lines.length)), extra: new TextEncoder().encode(b.lines[1]!) });
      expect(verifyReceiptProof(bundle, null as never)).toMatchObject({ ok: true, value: { index: 1 } });
    }
    expect(verifyLog(undefined as never)).toMatchObject({ ok: false, error: { code: 'options_invalid' } });
    expect(verifyLog({ provider: b.providerId, receipts: 5 as never })).toMatchObject({ ok: false, error: { code: 'options_invalid' } });
    const throwing = { *[Symbol.iterator]() { yield b.lines[0]!; throw new Error('disk gone'); } };
    expect(verifyLog({ provider: b.providerId, receipts: throwing })).toMatchObject({ ok: false, error: { code: 'envelope_malformed', message: expect.stringContaining('disk gone') } });
  });
});

describe('verifyReceiptProof', () => {
  test('a bundle whose leaf is not its envelope\'s canonical line (a log the audit refuses) is envelope_not_canonical', async () => {
    const { verifyReceiptProof } = await import('../attestation/receipt-proof.ts');
    const { MerkleTree, leafHash } = await import('../attestation/merkle.ts');
    const { formatProofBundle } = await import('../attestation/tlog-proof.ts');
    const { makeCheckpoint } = await import('./helpers/tamper-log.ts');
    const b: BuiltLog = await buildLog({ count: 3, checkpointEvery: 3 });
    temps.push(b.root);
    const proveAt = (lines: string[], index: number) => {
      const tree = MerkleTree.fromLeafHashes(lines.map((l) => leafHash(l)));
      const note = makeCheckpoint(b.seed, b.origin, lines.length, tree.root(lines.length));
      return formatProofBundle({ index, proof: tree.inclusionProof(index, lines.length), checkpointNote: note, extra: new TextEncoder().encode(lines[index]!) });
    };
    expect(verifyReceiptProof(proveAt(b.lines, 1), { provider: b.providerId }).ok).toBe(true);
    const spaced = b.lines.map((l, i) => (i === 1 ? l.replace('{', '{ ') : l));
    expect(verifyReceiptProof(proveAt(spaced, 1), { provider: b.providerId })).toMatchObject({ ok: false, error: { code: 'envelope_not_canonical' } });
  });

  test("a pin given wrongly is options_invalid, never quietly dropped (another provider's bundle would verify); a pinned bundle of another provider is provider_mismatch", async () => {
    const { verifyReceiptProof } = await import('../attestation/receipt-proof.ts');
    const { MerkleTree, leafHash } = await import('../attestation/merkle.ts');
    const { formatProofBundle } = await import('../attestation/tlog-proof.ts');
    const { makeCheckpoint } = await import('./helpers/tamper-log.ts');
    const other: BuiltLog = await buildLog({ count: 2, checkpointEvery: 2 });
    temps.push(other.root);
    const tree = MerkleTree.fromLeafHashes(other.lines.map((l) => leafHash(l)));
    const foreign = formatProofBundle({ index: 0, proof: tree.inclusionProof(0, 2), checkpointNote: makeCheckpoint(other.seed, other.origin, 2, tree.root(2)), extra: new TextEncoder().encode(other.lines[0]!) });
    const mine = providerIdOf(randomSeed());
    expect(verifyReceiptProof(foreign).ok).toBe(true); // (unpinned: the bundle's own provider)
    for (const opts of [mine, { provder: mine }, { provider: undefined }, { provider: 7 }, [mine]]) {
      const r = verifyReceiptProof(foreign, opts as never);
      expect(r.ok ? 'ok' : r.error.code, JSON.stringify(opts) ?? String(opts)).toBe('options_invalid');
    }
    expect(verifyReceiptProof(foreign, { provider: mine })).toMatchObject({ ok: false, error: { code: 'provider_mismatch' } });
    expect(verifyReceiptProof(foreign, { provider: other.providerId }).ok).toBe(true);
  });
});

describe('the verifier functions answer hostile values, never throw', () => {
  test('proxies and getters that throw (null, a Symbol message) in checkpoint, Merkle, Ed25519, receipt and log checks', async () => {
    const { verifyCheckpoint } = await import('../attestation/checkpoint.ts');
    const { verifyInclusion, verifyConsistency } = await import('../attestation/merkle.ts');
    const { ed25519Verify } = await import('../attestation/ed25519.ts');
    const { verifyReceipt } = await import('../attestation/receipt-verify.ts');
    const { verifyLog } = await import('../attestation/log-verify.ts');
    const throwing = (thrown: unknown) => new Proxy(new Uint8Array(32), { get: () => { throw thrown; } });
    const hostile = [null, undefined, Symbol('s'), { message: Symbol('m') }, new Error('boom'), { get message(): string { throw new Error('again'); } }];
    const h32 = new Uint8Array(32);
    for (const thrown of hostile) {
      const bad = throwing(thrown);
      const getter = { get name(): string { throw thrown; }, publicKey: h32 };
      const answers = [
        verifyCheckpoint('origin\n1\nAA==\n\n— k sig\n', getter as never),
        verifyInclusion(0, 2, bad, [h32], h32),
        verifyInclusion(0, 2, h32, [bad], h32),
        verifyConsistency(1, 2, [bad], h32, h32),
        verifyReceipt({ get payload(): string { throw thrown; }, payloadType: 'x', signatures: [] } as never, { provider: 'ab'.repeat(32) }),
        verifyLog({ provider: 'ab'.repeat(32), receipts: { [Symbol.iterator]() { throw thrown; } } as never }),
      ];
      for (const a of answers) expect(a.ok, String(typeof thrown === 'symbol' ? 'symbol' : thrown)).toBe(false);
      expect(ed25519Verify(bad, h32, h32)).toBe(false);
      expect(verifyReceipt('{}', { provder: 'ab'.repeat(32) } as never)).toMatchObject({ ok: false, error: { code: 'options_invalid' } });
      // Options that cannot be read or used are the options' fault, named so (not the envelope's).
      expect(verifyReceipt('{}', { get provider(): string { throw thrown; } } as never)).toMatchObject({ ok: false, error: { code: 'options_invalid', message: expect.stringMatching(/^options could not be read: /) } });
      expect(ed25519Verify(new Uint8Array(64), h32, bad)).toBe(false);
    }
    expect(verifyReceipt('{}', { provider: undefined } as never)).toMatchObject({ ok: false, error: { code: 'options_invalid', message: expect.stringMatching(/provider is required/) } });
    expect(verifyReceipt('{}', { provider: 'ab'.repeat(32), chain: 'yes' } as never)).toMatchObject({ ok: false, error: { code: 'options_invalid' } });
  });

  test('every verifier taking a provider or a key: one given as undefined, misspelt or of the wrong type is options_invalid (nothing was checked); a malformed id is unknown_key', async () => {
    const { verifyCheckpoint, verifyRequestContract } = await import('../attestation/verifier.ts');
    const id = 'ab'.repeat(32);
    const code = (r: { ok: boolean; error?: { code: string } }) => (r.ok ? 'ok' : r.error!.code);
    for (const opts of [undefined, {}, { provider: undefined }, { provder: id }, { provider: id, extra: 1 }, { provider: 7 }]) {
      expect(code(verifyPriceList('{}', opts as never)), `verifyPriceList ${JSON.stringify(opts)}`).toBe('options_invalid');
      expect(code(verifyRequestContract('{}', opts as never)), `verifyRequestContract ${JSON.stringify(opts)}`).toBe('options_invalid');
    }
    expect(code(verifyPriceList('{}', { provider: 'AB'.repeat(32) }))).toBe('unknown_key');
    for (const p of [undefined, 7, null]) expect(code(verifyCheckpointConsistency('x', 'y', [], p as never)), String(p)).toBe('options_invalid');
    expect(code(verifyCheckpointConsistency('x', 'y', [], 'nothex'))).toBe('unknown_key');
    const key = { name: `${id}/receipts`, publicKey: new Uint8Array(32) };
    for (const k of [undefined, null, {}, { ...key, publicKey: 'ab' }, { ...key, name: 1 }, { ...key, orgin: 'x' }, { ...key, origin: 5 }]) {
      expect(code(verifyCheckpoint('note', k as never)), JSON.stringify(k) ?? String(k)).toBe('options_invalid');
    }
    expect(code(verifyCheckpoint('note', key))).not.toBe('options_invalid'); // (a usable key: the note itself is judged)
    // An origin pin given as undefined (an unset variable) pins nothing: refused, not dropped (s28 review).
    expect(code(verifyCheckpoint('note', { ...key, origin: undefined }))).toBe('options_invalid');
    // verifyLog: a misspelt or undefined pin would quietly skip the price and kept-checkpoint checks (s28 review).
    const { verifyLog } = await import('../attestation/verifier.ts');
    for (const input of [
      { provider: id, receipts: [], priceList: [] },
      { provider: id, receipts: [], price_lists: [] },
      { provider: id, receipts: [], keptCheckpoint: ['x'] },
      { provider: id, receipts: [], keptCheckpoints: undefined },
      { provider: id, receipts: [], priceLists: undefined },
      { provider: id, receipts: undefined },
      { provider: id },
      { provider: id, receipts: 'line' },
      { provider: id, receipts: [], checkpoints: 'note' },
      { provider: id, receipts: [], priceLists: 7 },
      { receipts: [] },
      { provider: 7, receipts: [] },
    ]) {
      expect(code(verifyLog(input as never)), JSON.stringify(input)).toBe('options_invalid');
    }
    expect(code(verifyLog({ provider: 'nothex', receipts: [] }))).toBe('unknown_key');
    expect(code(verifyLog({ provider: id, receipts: [] }))).toBe('log_empty'); // (usable options: the log itself is judged)
  });
});
