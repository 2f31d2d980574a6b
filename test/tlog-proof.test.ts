import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { formatProofBundle, MAX_PROOF_HASHES, parseProofBundle, TLOG_PROOF_HEADER, verifyProofBundle } from '../attestation/tlog-proof.ts';
import { receiptLogOrigin, signCheckpoint } from '../attestation/checkpoint.ts';
import { leafHash, MerkleTree } from '../attestation/merkle.ts';
import { concatBytes, fromBase64, toBase64, toHex, utf8 } from '../attestation/bytes.ts';
import { ed25519PublicKey, ed25519RandomSeed } from '../attestation/ed25519.ts';
import { REPO_ROOT } from './helpers/vectors.ts';

function errCode(r: { ok: boolean; error?: { code: string } }): string | undefined {
  return r.ok ? undefined : r.error?.code;
}

const SIZE = 37;
const leaves: Uint8Array[] = Array.from({ length: SIZE }, (_, i) => {
  const b = new Uint8Array(20 + ((i * 7) % 50));
  globalThis.crypto.getRandomValues(b);
  return b;
});
const tree = new MerkleTree();
for (const l of leaves) tree.append(leafHash(l));

const seed = ed25519RandomSeed();
const publicKey = ed25519PublicKey(seed);
const origin = receiptLogOrigin(toHex(publicKey));
const key = { name: origin, publicKey, origin };
const checkpointNote = signCheckpoint({ origin, size: SIZE, rootHash: tree.root() }, { name: origin, seed });

function bundleFor(index: number, withExtra: boolean, size = SIZE, note = checkpointNote): string {
  const b = { index, proof: tree.inclusionProof(index, size), checkpointNote: note };
  return formatProofBundle(withExtra ? { ...b, extra: leaves[index]! } : b);
}

const INDEXES = [0, 1, 2, 15, 16, 31, 32, 35, 36];

describe('formatProofBundle', () => {
  it('follows the tlog-proof layout exactly', () => {
    const idx = 5;
    const proof = tree.inclusionProof(idx, SIZE);
    const text = bundleFor(idx, true);
    const expected = [TLOG_PROOF_HEADER, `extra ${toBase64(leaves[idx]!)}`, `index ${idx}`, ...proof.map(toBase64), '', ''].join('\n') + checkpointNote;
    expect(text).toBe(expected);
    // Without extra data the extra line is omitted.
    expect(bundleFor(idx, false)).toBe(expected.replace(`extra ${toBase64(leaves[idx]!)}\n`, ''));
    // Zero-length extra data counts as none.
    expect(formatProofBundle({ index: idx, proof, checkpointNote, extra: new Uint8Array(0) })).toBe(bundleFor(idx, false));
  });

  it('refuses invalid input', () => {
    const proof = tree.inclusionProof(3, SIZE);
    expect(() => formatProofBundle({ index: -1, proof, checkpointNote })).toThrow(TypeError);
    expect(() => formatProofBundle({ index: 1.5, proof, checkpointNote })).toThrow(TypeError);
    expect(() => formatProofBundle({ index: 3, proof: [new Uint8Array(31)], checkpointNote })).toThrow(TypeError);
    expect(() => formatProofBundle({ index: 3, proof, checkpointNote: 'not a note' })).toThrow(TypeError);
  });
});

describe('parse and verify round trip', () => {
  for (const index of INDEXES) {
    it(`index ${index}: parses back, verifies with the leaf and self-contained`, () => {
      for (const withExtra of [false, true]) {
        const text = bundleFor(index, withExtra);
        const p = parseProofBundle(text);
        expect(p.ok).toBe(true);
        if (!p.ok) return;
        expect(p.value.index).toBe(index);
        expect(p.value.proof.map(toHex)).toEqual(tree.inclusionProof(index, SIZE).map(toHex));
        expect(p.value.checkpointNote).toBe(checkpointNote);
        expect(p.value.extra && toHex(p.value.extra)).toBe(withExtra ? toHex(leaves[index]!) : undefined);
        expect(formatProofBundle(p.value)).toBe(text);

        const v = verifyProofBundle(text, leaves[index]!, key);
        expect(v.ok).toBe(true);
        if (!v.ok) return;
        expect(v.value.index).toBe(index);
        expect(v.value.checkpoint.size).toBe(SIZE);
        expect(toHex(v.value.checkpoint.rootHash)).toBe(toHex(tree.root()));
        expect(toHex(v.value.leafHash)).toBe(toHex(leafHash(leaves[index]!)));

        const self = verifyProofBundle(text, undefined, key);
        if (withExtra) {
          expect(self.ok && toHex(self.value.leafData)).toBe(toHex(leaves[index]!));
        } else {
          expect(errCode(self)).toBe('bundle_malformed');
        }
        // Bytes in, same answer.
        expect(verifyProofBundle(utf8(text), leaves[index]!, key).ok).toBe(true);
      }
    });
  }

  it('a one-leaf tree has an empty proof', () => {
    const t1 = new MerkleTree();
    t1.append(leafHash(leaves[0]!));
    const note = signCheckpoint({ origin, size: 1, rootHash: t1.root() }, { name: origin, seed });
    const text = formatProofBundle({ index: 0, proof: [], checkpointNote: note, extra: leaves[0]! });
    expect(text.startsWith(`${TLOG_PROOF_HEADER}\nextra ${toBase64(leaves[0]!)}\nindex 0\n\n`)).toBe(true);
    expect(verifyProofBundle(text, undefined, key).ok).toBe(true);
  });
});

describe('verifyProofBundle failures', () => {
  const index = 17;
  const plain = bundleFor(index, false);
  const withExtra = bundleFor(index, true);

  it('control: both bundles verify', () => {
    expect(verifyProofBundle(plain, leaves[index]!, key).ok).toBe(true);
    expect(verifyProofBundle(withExtra, undefined, key).ok).toBe(true);
  });

  it('tampered leaf → proof_root_mismatch', () => {
    const bad = leaves[index]!.slice();
    bad[0] = bad[0]! ^ 1;
    expect(errCode(verifyProofBundle(plain, bad, key))).toBe('proof_root_mismatch');
    expect(errCode(verifyProofBundle(plain, leaves[index + 1]!, key))).toBe('proof_root_mismatch');
    // Tampered extra data in a self-contained bundle.
    const tampered = withExtra.replace(`extra ${toBase64(leaves[index]!)}`, `extra ${toBase64(bad)}`);
    expect(errCode(verifyProofBundle(tampered, undefined, key))).toBe('proof_root_mismatch');
  });

  it('extra data that differs from the given leaf → bundle_malformed', () => {
    expect(errCode(verifyProofBundle(withExtra, leaves[index + 1]!, key))).toBe('bundle_malformed');
  });

  it('wrong index: out of range → proof_index_out_of_range, in range → proof_root_mismatch or proof_size_mismatch', () => {
    expect(errCode(verifyProofBundle(plain.replace(`index ${index}\n`, `index ${SIZE}\n`), leaves[index]!, key))).toBe('proof_index_out_of_range');
    expect(errCode(verifyProofBundle(plain.replace(`index ${index}\n`, `index 9007199254740991\n`), leaves[index]!, key))).toBe('proof_index_out_of_range');
    // 16 and 17 have proofs of the same length (6): the computed root differs.
    expect(errCode(verifyProofBundle(plain.replace(`index ${index}\n`, 'index 16\n'), leaves[index]!, key))).toBe('proof_root_mismatch');
    // 36 (the lone last leaf) has a proof of length 1.
    expect(errCode(verifyProofBundle(plain.replace(`index ${index}\n`, 'index 36\n'), leaves[index]!, key))).toBe('proof_size_mismatch');
  });

  it('proof for another tree size → proof_size_mismatch', () => {
    // Inclusion proof in the 20-leaf tree (5 hashes) under the 37-leaf checkpoint (needs 6).
    expect(errCode(verifyProofBundle(bundleFor(3, true, 20), undefined, key))).toBe('proof_size_mismatch');
    // And the 37-leaf proof under a checkpoint of the 20-leaf tree.
    const note20 = signCheckpoint({ origin, size: 20, rootHash: tree.root(20) }, { name: origin, seed });
    const text = formatProofBundle({ index: 3, proof: tree.inclusionProof(3, SIZE), checkpointNote: note20, extra: leaves[3]! });
    expect(errCode(verifyProofBundle(text, undefined, key))).toBe('proof_size_mismatch');
    // Same proof length (size 33 vs 37 for index 3) but another tree: proof_root_mismatch.
    expect(errCode(verifyProofBundle(bundleFor(3, true, 33), undefined, key))).toBe('proof_root_mismatch');
  });

  it('wrong key → note_no_known_signature; wrong origin → checkpoint_origin_mismatch', () => {
    const other = ed25519PublicKey(ed25519RandomSeed());
    expect(errCode(verifyProofBundle(withExtra, undefined, { ...key, publicKey: other }))).toBe('note_no_known_signature');
    expect(errCode(verifyProofBundle(withExtra, undefined, { ...key, origin: receiptLogOrigin(toHex(other)) }))).toBe('checkpoint_origin_mismatch');
    expect(errCode(verifyProofBundle(withExtra, undefined, undefined as unknown as typeof key))).toBe('checkpoint_origin_mismatch');
  });

  it('tampered checkpoint → signature_invalid', () => {
    const forged = withExtra.replace(`\n${SIZE}\n`, `\n${SIZE + 1}\n`);
    expect(forged).not.toBe(withExtra);
    expect(errCode(verifyProofBundle(forged, undefined, key))).toBe('signature_invalid');
  });

  const hash0 = toBase64(tree.inclusionProof(index, SIZE)[0]!);
  const garbage: [string, string | Uint8Array][] = [
    ['empty', ''],
    ['random text', 'hello world\n'],
    ['only the header', `${TLOG_PROOF_HEADER}\n`],
    ['wrong header version', plain.replace(TLOG_PROOF_HEADER, 'c2sp.org/tlog-proof@v2')],
    ['header without newline', TLOG_PROOF_HEADER],
    ['missing index line', plain.replace(`index ${index}\n`, '')],
    ['index with leading zero', plain.replace(`index ${index}\n`, `index 0${index}\n`)],
    ['negative index', plain.replace(`index ${index}\n`, 'index -1\n')],
    ['index beyond 2^53 - 1', plain.replace(`index ${index}\n`, 'index 9007199254740992\n')],
    ['index with two spaces', plain.replace(`index ${index}\n`, `index  ${index}\n`)],
    ['index with tab', plain.replace(`index ${index}\n`, `index\t${index}\n`)],
    ['extra after index', plain.replace(`index ${index}\n`, `index ${index}\nextra AAAA\n`)],
    ['empty extra', plain.replace(`index ${index}\n`, `extra \nindex ${index}\n`)],
    ['extra not base64', plain.replace(`index ${index}\n`, `extra ***\nindex ${index}\n`)],
    ['two extra lines', withExtra.replace(`index ${index}\n`, `extra AAAA\nindex ${index}\n`)],
    ['31-byte proof hash', plain.replace(hash0, toBase64(fromBase64(hash0)!.subarray(0, 31)))],
    ['proof hash without padding', plain.replace(hash0, hash0.replace(/=$/, ''))],
    ['CRLF line endings', plain.replace(/\n/g, '\r\n')],
    ['missing blank line', plain.replace('\n\n', '\n')],
    ['missing checkpoint', plain.slice(0, plain.indexOf('\n\n') + 2)],
    ['checkpoint cut off', plain.slice(0, plain.indexOf('\n\n') + 2) + `${TLOG_PROOF_HEADER}`],
    ['too many proof hashes', plain.replace(`index ${index}\n`, `index ${index}\n` + `${hash0}\n`.repeat(MAX_PROOF_HASHES + 1))],
    ['invalid UTF-8', Uint8Array.of(0xff, 0xfe, 0x0a)],
    ['byte order mark before the header', concatBytes(Uint8Array.of(0xef, 0xbb, 0xbf), utf8(plain))],
  ];
  for (const [label, text] of garbage) {
    it(`garbage: ${label} → bundle_malformed or note_malformed, never a throw`, () => {
      const p = parseProofBundle(text);
      expect(p.ok).toBe(false);
      const r = verifyProofBundle(text, leaves[index]!, key);
      expect(['bundle_malformed', 'note_malformed']).toContain(errCode(r));
      expect(errCode(r)).toBe(errCode(p));
    });
  }

  it('a blank line right after the index moves the proof lines into the note: signature_invalid', () => {
    const text = plain.replace(`index ${index}\n`, `index ${index}\n\n`);
    const p = parseProofBundle(text);
    expect(p.ok && p.value.proof.length).toBe(0);
    expect(errCode(verifyProofBundle(text, leaves[index]!, key))).toBe('signature_invalid');
  });

  it('non-text input → bundle_malformed', () => {
    for (const bad of [undefined, null, 5, {}]) {
      expect(errCode(verifyProofBundle(bad as unknown as string, undefined, key))).toBe('bundle_malformed');
    }
  });

  it('no single-character change or truncation verifies, and none throws', () => {
    for (const text of [plain, withExtra]) {
      const leaf = text === plain ? leaves[index]! : undefined;
      for (let i = 0; i < text.length; i++) {
        const c = text[i] === 'A' ? 'B' : 'A';
        const mutated = text.slice(0, i) + c + text.slice(i + 1);
        expect(verifyProofBundle(mutated, leaf, key).ok, `change at ${i}`).toBe(false);
        expect(verifyProofBundle(text.slice(0, i), leaf, key).ok, `cut at ${i}`).toBe(false);
      }
    }
  });
});

describe('browser safety', () => {
  it('the note, checkpoint and tlog-proof modules import no node: module', () => {
    for (const f of ['note.ts', 'checkpoint.ts', 'tlog-proof.ts']) {
      const src = fs.readFileSync(path.join(REPO_ROOT, 'attestation', f), 'utf8');
      expect(src).not.toMatch(/from\s+['"]node:|import\(\s*['"]node:|require\(/);
    }
  });
});
