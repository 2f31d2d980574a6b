// RFC 9162 Merkle tree and proof verification: transparency-dev/merkle vectors, the reference tree,
// cross-checks against a naive recursive implementation, negative cases and hashing cost.
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import { describe, expect, test, vi } from 'vitest';
import { fromBase64, fromHex, toHex, utf8 } from '../attestation/bytes.ts';
import {
  EMPTY_ROOT,
  MerkleTree,
  leafHash,
  nodeHash,
  rootFromInclusion,
  verifyConsistency,
  verifyInclusion,
} from '../attestation/merkle.ts';
import type { VerifyResult } from '../attestation/result.ts';
import { readVectorJson, vectorPath } from './helpers/vectors.ts';

// Count every SHA-256 the module computes (for the cost tests at the end).
const hashCalls = vi.hoisted(() => ({ n: 0 }));
vi.mock('../attestation/hash.ts', async (importOriginal) => {
  const mod = await importOriginal<typeof import('../attestation/hash.ts')>();
  return {
    ...mod,
    sha256: (data: Uint8Array) => {
      hashCalls.n++;
      return mod.sha256(data);
    },
  };
});

const DIR = ['merkle', 'transparency-dev-merkle'];

// ---------------------------------------------------------------------------------------------
// Naive RFC 9162 §2.1 implementation, straight from the recursive definitions, hashing with
// node:crypto directly (independent of attestation/hash.ts). Works on leaf hashes D[lo:hi].

function H(...parts: Uint8Array[]): Uint8Array {
  const h = createHash('sha256');
  for (const p of parts) h.update(p);
  return new Uint8Array(h.digest());
}
const naiveLeaf = (data: Uint8Array) => H(Uint8Array.of(0), data);

class Naive {
  private memo = new Map<string, Uint8Array>();
  readonly leaves: Uint8Array[];
  constructor(leaves: Uint8Array[]) {
    this.leaves = leaves;
  }

  /** The largest power of two smaller than n. */
  static k(n: number): number {
    let k = 1;
    while (k * 2 < n) k *= 2;
    return k;
  }

  /** MTH(D[lo:hi]) (memoised: the random-tree checks ask for overlapping ranges a lot). */
  mth(lo: number, hi: number): Uint8Array {
    const n = hi - lo;
    if (n === 0) return H();
    if (n === 1) return this.leaves[lo]!;
    const key = `${lo}:${hi}`;
    let h = this.memo.get(key);
    if (!h) {
      const k = Naive.k(n);
      h = H(Uint8Array.of(1), this.mth(lo, lo + k), this.mth(lo + k, hi));
      this.memo.set(key, h);
    }
    return h;
  }

  /** PATH(m, D[lo:hi]). */
  path(m: number, lo: number, hi: number): Uint8Array[] {
    const n = hi - lo;
    if (n === 1) return [];
    const k = Naive.k(n);
    if (m < k) return [...this.path(m, lo, lo + k), this.mth(lo + k, hi)];
    return [...this.path(m - k, lo + k, hi), this.mth(lo, lo + k)];
  }

  /** PROOF(m, D[0:n]) = SUBPROOF(m, D[0:n], true). */
  proof(m: number, n: number): Uint8Array[] {
    return this.subproof(m, 0, n, true);
  }

  private subproof(m: number, lo: number, hi: number, b: boolean): Uint8Array[] {
    const n = hi - lo;
    if (m === n) return b ? [] : [this.mth(lo, hi)];
    const k = Naive.k(n);
    if (m <= k) return [...this.subproof(m, lo, lo + k, b), this.mth(lo + k, hi)];
    return [...this.subproof(m - k, lo + k, hi, false), this.mth(lo, lo + k)];
  }
}

const hex = (hs: Uint8Array[]) => hs.map(toHex);

/** The error code of a result, or 'ok'. */
function code(r: VerifyResult<unknown>): string {
  return r.ok ? 'ok' : r.error.code;
}

/** Deterministic PRNG (mulberry32) so failures reproduce. */
function rng(seed: number): (n: number) => number {
  return (n) => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = seed;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return Math.floor((((t ^ (t >>> 14)) >>> 0) / 4294967296) * n);
  };
}

function flipBit(proof: Uint8Array[], i: number): Uint8Array[] {
  const out = proof.map((p) => p.slice());
  out[i]![0]! ^= 0x10;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Reference tree

interface ReferenceTree {
  leafInputsHex: string[];
  rootHashesBySize: string[];
  nodeHashesByLevel: string[][];
  hasherVectors: { desc: string; want: string; input_hex?: string; input_ascii?: string; left_ascii?: string; right_ascii?: string }[];
}
const ref = readVectorJson<ReferenceTree>(...DIR, 'reference_tree.json');
const refLeaves = ref.leafInputsHex.map((h) => naiveLeaf(fromHex(h)));
const refTree = MerkleTree.fromLeafHashes(ref.leafInputsHex.map((h) => leafHash(fromHex(h))));
const refNaive = new Naive(refLeaves);

describe('hashing', () => {
  test('reference hasher vectors', () => {
    expect(ref.hasherVectors).toHaveLength(4);
    for (const v of ref.hasherVectors) {
      let got: Uint8Array;
      if (v.desc === 'empty tree root') got = EMPTY_ROOT;
      else if (v.input_hex !== undefined) got = leafHash(fromHex(v.input_hex));
      else if (v.input_ascii !== undefined) got = leafHash(utf8(v.input_ascii));
      else got = nodeHash(utf8(v.left_ascii!), utf8(v.right_ascii!));
      expect(toHex(got), v.desc).toBe(v.want);
    }
  });

  test('leafHash and nodeHash use the 0x00 / 0x01 prefixes', () => {
    const a = leafHash(utf8('a'));
    const b = leafHash(utf8('b'));
    expect(toHex(a)).toBe(toHex(H(Uint8Array.of(0), utf8('a'))));
    expect(toHex(nodeHash(a, b))).toBe(toHex(H(Uint8Array.of(1), a, b)));
    expect(toHex(nodeHash(a, b))).not.toBe(toHex(nodeHash(b, a)));
  });
});

describe('reference tree (8 leaves)', () => {
  test('roots for sizes 0..8', () => {
    expect(ref.rootHashesBySize).toHaveLength(9);
    expect(refTree.size).toBe(8);
    for (let n = 0; n <= 8; n++) {
      expect(toHex(refTree.root(n)), `size ${n}`).toBe(ref.rootHashesBySize[n]);
      expect(toHex(refNaive.mth(0, n)), `naive size ${n}`).toBe(ref.rootHashesBySize[n]);
    }
    expect(toHex(refTree.root())).toBe(ref.rootHashesBySize[8]);
  });

  test('stored leaf hashes and complete subtrees match nodeHashesByLevel', () => {
    ref.nodeHashesByLevel.forEach((level, k) => {
      level.forEach((want, i) => {
        const w = 2 ** k;
        // A complete subtree is the root of its own leaves; check it both ways.
        expect(toHex(MerkleTree.fromLeafHashes(refLeaves.slice(i * w, (i + 1) * w)).root()), `level ${k} node ${i}`).toBe(want);
        if (k === 0) expect(toHex(refTree.leafHashAt(i))).toBe(want);
      });
    });
  });

  test('inclusion proofs for every (index, size) equal the naive PATH and verify', () => {
    let checked = 0;
    for (let n = 1; n <= 8; n++) {
      for (let i = 0; i < n; i++) {
        const proof = refTree.inclusionProof(i, n);
        expect(hex(proof), `PATH(${i}, ${n})`).toEqual(hex(refNaive.path(i, 0, n)));
        const root = fromHex(ref.rootHashesBySize[n]!);
        expect(code(verifyInclusion(i, n, refLeaves[i]!, proof, root)), `verify ${i}/${n}`).toBe('ok');
        const computed = rootFromInclusion(i, n, refLeaves[i]!, proof);
        expect(computed.ok && toHex(computed.value)).toBe(ref.rootHashesBySize[n]);
        checked++;
      }
    }
    expect(checked).toBe(36);
  });

  test('consistency proofs for every 1 <= size1 <= size2 <= 8 equal the naive PROOF and verify', () => {
    let checked = 0;
    for (let n = 1; n <= 8; n++) {
      for (let m = 1; m <= n; m++) {
        const proof = refTree.consistencyProof(m, n);
        expect(hex(proof), `PROOF(${m}, ${n})`).toEqual(hex(refNaive.proof(m, n)));
        const r1 = fromHex(ref.rootHashesBySize[m]!);
        const r2 = fromHex(ref.rootHashesBySize[n]!);
        expect(code(verifyConsistency(m, n, proof, r1, r2)), `verify ${m}->${n}`).toBe('ok');
        if (m < n) expect(code(verifyConsistency(m, n, proof, r2, r1)), `swapped roots ${m}->${n}`).toBe('proof_root_mismatch');
        checked++;
      }
    }
    expect(checked).toBe(36);
  });

  test('known proofs from the RFC 6962 test suite', () => {
    // transparency-dev/merkle proof tests: PATH(5, D[8]) and PROOF(6, D[8]).
    expect(hex(refTree.inclusionProof(5, 8))).toEqual([
      'bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b',
      'ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0',
      'd37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7',
    ]);
    expect(hex(refTree.consistencyProof(6, 8))).toEqual([
      '0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a',
      'ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0',
      'd37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7',
    ]);
  });
});

// ---------------------------------------------------------------------------------------------
// transparency-dev/merkle vector files: every one, wantErr must match exactly.

function listJson(kind: string): string[] {
  return (fs.readdirSync(vectorPath(...DIR, kind), { recursive: true }) as string[])
    .filter((f) => f.endsWith('.json'))
    .sort();
}
const inclusionFiles = listJson('inclusion');
const consistencyFiles = listJson('consistency');

function b64(s: string): Uint8Array {
  const out = fromBase64(s);
  if (!out) throw new Error(`bad base64 in vector: ${s}`);
  return out;
}
const b64List = (l: string[] | null) => (l ?? []).map(b64);

interface InclusionVector { leafIdx: number; treeSize: number; root: string; leafHash: string; proof: string[] | null; desc: string; wantErr: boolean }
interface ConsistencyVector { size1: number; size2: number; root1: string; root2: string; proof: string[] | null; desc: string; wantErr: boolean }

// For negative vectors whose name says what was broken, the reason we must give.
const EXPECTED_CODE: [RegExp, string][] = [
  [/modified-proof|random-root|swapped-roots|\/empty-root\.json$/, 'proof_root_mismatch'],
  [/trailing-|preceding-|removed-component|inserted-component|truncated-proof|empty-proof/, 'proof_size_mismatch'],
  [/wrong-leaf|wrong-root|empty-leaf/, 'proof_malformed'],
];
function expectedCode(file: string): string | undefined {
  return EXPECTED_CODE.find(([re]) => re.test(`/${file}`))?.[1];
}

describe('transparency-dev/merkle vectors', () => {
  test('all 196 vector files are found', () => {
    expect(inclusionFiles).toHaveLength(98);
    expect(consistencyFiles).toHaveLength(98);
  });

  test.each(inclusionFiles)('inclusion/%s', (file) => {
    const v = readVectorJson<InclusionVector>(...DIR, 'inclusion', file);
    const proof = b64List(v.proof);
    const r = verifyInclusion(v.leafIdx, v.treeSize, b64(v.leafHash), proof, b64(v.root));
    expect(r.ok, `${v.desc}: ${code(r)}`).toBe(!v.wantErr);
    const want = v.wantErr && !file.startsWith('additional/') && !file.startsWith('single-entry/') ? expectedCode(file) : undefined;
    if (want) expect(code(r)).toBe(want);
    // Happy paths over the reference leaves: our tree produces exactly this proof.
    if (!v.wantErr && v.treeSize <= 8 && v.root === Buffer.from(ref.rootHashesBySize[v.treeSize]!, 'hex').toString('base64')) {
      expect(hex(refTree.inclusionProof(v.leafIdx, v.treeSize))).toEqual(hex(proof));
    }
  });

  test.each(consistencyFiles)('consistency/%s', (file) => {
    const v = readVectorJson<ConsistencyVector>(...DIR, 'consistency', file);
    const proof = b64List(v.proof);
    const r = verifyConsistency(v.size1, v.size2, proof, b64(v.root1), b64(v.root2));
    expect(r.ok, `${v.desc}: ${code(r)}`).toBe(!v.wantErr);
    const want = v.wantErr && !file.startsWith('additional/') ? expectedCode(file) : undefined;
    if (want) expect(code(r)).toBe(want);
    if (!v.wantErr && v.size2 <= 8 && v.size1 > 0 && v.root2 === Buffer.from(ref.rootHashesBySize[v.size2]!, 'hex').toString('base64')) {
      expect(hex(refTree.consistencyProof(v.size1, v.size2))).toEqual(hex(proof));
    }
  });
});

// ---------------------------------------------------------------------------------------------
// A larger random tree against the naive implementation.

describe('1000-leaf tree', () => {
  const rand = rng(9162);
  const leaves = Array.from({ length: 1000 }, (_, i) => naiveLeaf(utf8(`receipt ${i} ${rand(1e9)}`)));
  const tree = MerkleTree.fromLeafHashes(leaves);
  const naive = new Naive(leaves);

  test('root of every size 0..1000 equals the naive MTH', () => {
    for (let n = 0; n <= 1000; n++) expect(toHex(tree.root(n)), `size ${n}`).toBe(toHex(naive.mth(0, n)));
  });

  test('sampled inclusion proofs equal the naive PATH and verify', () => {
    for (let s = 0; s < 400; s++) {
      const n = 1 + rand(1000);
      const i = s % 10 === 0 ? n - 1 : rand(n);
      const proof = tree.inclusionProof(i, n);
      expect(hex(proof), `PATH(${i}, ${n})`).toEqual(hex(naive.path(i, 0, n)));
      expect(code(verifyInclusion(i, n, leaves[i]!, proof, naive.mth(0, n))), `${i}/${n}`).toBe('ok');
    }
  });

  test('sampled consistency proofs equal the naive PROOF and verify', () => {
    for (let s = 0; s < 400; s++) {
      const n = 1 + rand(1000);
      const m = s % 10 === 0 ? n : s % 10 === 1 ? 2 ** rand(Math.floor(Math.log2(n)) + 1) : 1 + rand(n);
      const proof = tree.consistencyProof(m, n);
      expect(hex(proof), `PROOF(${m}, ${n})`).toEqual(hex(naive.proof(m, n)));
      expect(code(verifyConsistency(m, n, proof, naive.mth(0, m), naive.mth(0, n))), `${m}->${n}`).toBe('ok');
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Negative cases, each with its distinct code.

describe('appendFrom', () => {
  test('a batch of leaf hashes laid end to end, appended by offset, builds the same tree as append; a range past the end is refused', () => {
    const leaves = Array.from({ length: 37 }, (_, i) => leafHash(utf8(`leaf ${i}`)));
    const packed = new Uint8Array(37 * 32);
    leaves.forEach((l, i) => packed.set(l, i * 32));
    const a = new MerkleTree();
    const b = new MerkleTree();
    leaves.forEach((l, i) => {
      a.append(l);
      b.appendFrom(packed, i * 32);
    });
    for (let size = 0; size <= 37; size++) expect(toHex(b.root(size))).toBe(toHex(a.root(size)));
    expect(toHex(b.leafHashAt(36))).toBe(toHex(leaves[36]!));
    expect(() => b.appendFrom(packed, 36 * 32 + 1)).toThrow(TypeError);
    expect(() => b.appendFrom(packed, -32)).toThrow(TypeError);
    expect(b.size).toBe(37);
  });
});

describe('verification failures', () => {
  const root = (n: number) => refTree.root(n);

  test('a flipped bit in any inclusion proof hash gives proof_root_mismatch', () => {
    let flipped = 0;
    for (let n = 2; n <= 8; n++) {
      for (let i = 0; i < n; i++) {
        const proof = refTree.inclusionProof(i, n);
        for (let j = 0; j < proof.length; j++, flipped++) {
          expect(code(verifyInclusion(i, n, refLeaves[i]!, flipBit(proof, j), root(n))), `${i}/${n} hash ${j}`).toBe('proof_root_mismatch');
        }
      }
    }
    expect(flipped).toBeGreaterThan(50);
    // A flipped leaf or root too.
    const p = refTree.inclusionProof(3, 7);
    expect(code(verifyInclusion(3, 7, flipBit([refLeaves[3]!], 0)[0]!, p, root(7)))).toBe('proof_root_mismatch');
    expect(code(verifyInclusion(3, 7, refLeaves[3]!, p, flipBit([root(7)], 0)[0]!))).toBe('proof_root_mismatch');
  });

  test('a flipped bit in any consistency proof hash gives proof_root_mismatch', () => {
    let flipped = 0;
    for (let n = 2; n <= 8; n++) {
      for (let m = 1; m < n; m++) {
        const proof = refTree.consistencyProof(m, n);
        for (let j = 0; j < proof.length; j++, flipped++) {
          expect(code(verifyConsistency(m, n, flipBit(proof, j), root(m), root(n))), `${m}->${n} hash ${j}`).toBe('proof_root_mismatch');
        }
        expect(code(verifyConsistency(m, n, proof, flipBit([root(m)], 0)[0]!, root(n))), `${m}->${n} root1`).toBe('proof_root_mismatch');
        expect(code(verifyConsistency(m, n, proof, root(m), flipBit([root(n)], 0)[0]!)), `${m}->${n} root2`).toBe('proof_root_mismatch');
      }
    }
    expect(flipped).toBeGreaterThan(50);
  });

  test('an inclusion proof for another tree size gives proof_size_mismatch', () => {
    const big = MerkleTree.fromLeafHashes(Array.from({ length: 64 }, (_, i) => leafHash(Uint8Array.of(i))));
    let mismatched = 0;
    for (let n = 1; n <= 64; n++) {
      for (const i of [0, n >> 1, n - 1]) {
        const proof = big.inclusionProof(i, n);
        for (let other = i + 1; other <= 64; other++) {
          if (other === n) continue;
          const r = verifyInclusion(i, other, big.leafHashAt(i), proof, big.root(other));
          if (big.inclusionProof(i, other).length !== proof.length) {
            expect(code(r), `proof ${i}/${n} as size ${other}`).toBe('proof_size_mismatch');
            mismatched++;
          } else {
            expect(code(r), `proof ${i}/${n} as size ${other}`).not.toBe('proof_size_mismatch');
          }
        }
      }
    }
    expect(mismatched).toBeGreaterThan(1000);
    // Too short, too long, non-empty for a one-leaf tree.
    const p = refTree.inclusionProof(2, 5);
    expect(code(verifyInclusion(2, 5, refLeaves[2]!, p.slice(1), root(5)))).toBe('proof_size_mismatch');
    expect(code(verifyInclusion(2, 5, refLeaves[2]!, [...p, root(5)], root(5)))).toBe('proof_size_mismatch');
    expect(code(verifyInclusion(0, 1, refLeaves[0]!, [refLeaves[1]!], root(1)))).toBe('proof_size_mismatch');
  });

  test('a consistency proof for other tree sizes gives proof_size_mismatch', () => {
    let mismatched = 0;
    for (let n = 2; n <= 8; n++) {
      for (let m = 1; m < n; m++) {
        const proof = refTree.consistencyProof(m, n);
        for (let n2 = 1; n2 <= 8; n2++) {
          for (let m2 = 1; m2 <= n2; m2++) {
            if (refTree.consistencyProof(m2, n2).length === proof.length) continue;
            expect(code(verifyConsistency(m2, n2, proof, root(m2), root(n2))), `proof ${m}->${n} as ${m2}->${n2}`).toBe('proof_size_mismatch');
            mismatched++;
          }
        }
      }
    }
    expect(mismatched).toBeGreaterThan(500);
    // Equal sizes need an empty proof; different sizes need a non-empty one.
    expect(code(verifyConsistency(5, 5, [root(5)], root(5), root(5)))).toBe('proof_size_mismatch');
    expect(code(verifyConsistency(3, 5, [], root(3), root(5)))).toBe('proof_size_mismatch');
    expect(code(verifyConsistency(5, 5, [], root(5), root(4)))).toBe('proof_root_mismatch');
    expect(code(verifyConsistency(5, 5, [], root(5), root(5)))).toBe('ok');
  });

  test('an index outside the tree gives proof_index_out_of_range', () => {
    const p = refTree.inclusionProof(7, 8);
    expect(code(verifyInclusion(8, 8, refLeaves[7]!, p, root(8)))).toBe('proof_index_out_of_range');
    expect(code(verifyInclusion(9, 8, refLeaves[7]!, p, root(8)))).toBe('proof_index_out_of_range');
    expect(code(verifyInclusion(0, 0, refLeaves[0]!, [], EMPTY_ROOT))).toBe('proof_index_out_of_range');
    expect(code(rootFromInclusion(5, 3, refLeaves[0]!, []))).toBe('proof_index_out_of_range');
    expect(code(verifyInclusion(7, 8, refLeaves[7]!, p, root(8)))).toBe('ok');
  });

  test('garbage inputs give proof_malformed and never throw', () => {
    const leaf = refLeaves[2]!;
    const p = refTree.inclusionProof(2, 5);
    const r5 = root(5);
    const badNumbers: unknown[] = ['2', '', NaN, -1, 1.5, Infinity, -Infinity, 2 ** 60, 2 ** 53, null, undefined, {}, [], 2n, true];
    const badHashes: unknown[] = ['00'.repeat(32), toHex(leaf), null, undefined, 42, {}, [...leaf], new Uint8Array(31), new Uint8Array(33), new Uint8Array(0), new Uint16Array(16), leaf.buffer];
    const badProofs: unknown[] = [null, undefined, 'proof', {}, { length: 3 }, 7, p.map(toHex), [p[0], p[1], 'x'], [p[0], new Uint8Array(31), p[2]], [p[0], p[1], null]];
    const inclusion = (...args: unknown[]) => (verifyInclusion as (...a: unknown[]) => VerifyResult)(...args);
    const fromInclusion = (...args: unknown[]) => (rootFromInclusion as (...a: unknown[]) => VerifyResult<Uint8Array>)(...args);
    const consistency = (...args: unknown[]) => (verifyConsistency as (...a: unknown[]) => VerifyResult)(...args);
    const c = refTree.consistencyProof(3, 5);
    const r3 = root(3);
    let cases = 0;
    const expectMalformed = (f: () => VerifyResult<unknown>, what: string) => {
      let r: VerifyResult<unknown> | undefined;
      expect(() => (r = f()), what).not.toThrow();
      expect(code(r!), what).toBe('proof_malformed');
      cases++;
    };
    for (const x of badNumbers) {
      expectMalformed(() => inclusion(x, 5, leaf, p, r5), `index ${String(x)}`);
      expectMalformed(() => inclusion(2, x, leaf, p, r5), `size ${String(x)}`);
      expectMalformed(() => fromInclusion(x, 5, leaf, p), `rootFrom index ${String(x)}`);
      expectMalformed(() => consistency(x, 5, c, r3, r5), `size1 ${String(x)}`);
      expectMalformed(() => consistency(3, x, c, r3, r5), `size2 ${String(x)}`);
    }
    for (const x of badHashes) {
      expectMalformed(() => inclusion(2, 5, x, p, r5), `leaf ${String(x)}`);
      expectMalformed(() => inclusion(2, 5, leaf, p, x), `root ${String(x)}`);
      expectMalformed(() => fromInclusion(2, 5, x, p), `rootFrom leaf ${String(x)}`);
      expectMalformed(() => consistency(3, 5, c, x, r5), `root1 ${String(x)}`);
      expectMalformed(() => consistency(3, 5, c, r3, x), `root2 ${String(x)}`);
    }
    for (const x of badProofs) {
      expectMalformed(() => inclusion(2, 5, leaf, x, r5), `proof ${String(x)}`);
      expectMalformed(() => fromInclusion(2, 5, leaf, x), `rootFrom proof ${String(x)}`);
    }
    for (const x of [null, undefined, 'proof', {}, 7, c.map(toHex), c.map((h, j) => (j === 1 ? new Uint8Array(33) : h)), c.map((h, j) => (j === 3 ? [...h] : h))]) {
      expectMalformed(() => consistency(3, 5, x, r3, r5), `consistency proof ${String(x)}`);
    }
    // size1 > size2, and a proof from the empty tree (meaningless, as in transparency-dev/merkle).
    expectMalformed(() => consistency(6, 5, c, r3, r5), 'size1 > size2');
    expectMalformed(() => consistency(0, 5, [], EMPTY_ROOT, r5), 'size1 = 0');
    expectMalformed(() => consistency(0, 0, [], EMPTY_ROOT, EMPTY_ROOT), 'sizes 0, 0');
    expectMalformed(() => consistency(), 'no arguments');
    expectMalformed(() => inclusion(), 'no arguments');
    expect(cases).toBeGreaterThan(150);
    // The valid calls the garbage was substituted into do verify.
    expect(code(inclusion(2, 5, leaf, p, r5))).toBe('ok');
    expect(code(consistency(3, 5, c, r3, r5))).toBe('ok');
  });

  test('sizes up to 2^53 - 1 are handled without 32-bit overflow', () => {
    // Leaf 2^32 + 1 of a 2^40-leaf tree: 40 proof hashes; and the last leaf of a huge tree.
    const h = leafHash(utf8('x'));
    const sibling = leafHash(utf8('y'));
    for (const [i, n] of [[2 ** 32 + 1, 2 ** 40], [2 ** 53 - 2, 2 ** 53 - 1], [0, 2 ** 53 - 1], [2 ** 31, 2 ** 31 + 1]] as const) {
      const want = pathLen(i, n);
      const proof = Array.from({ length: want }, () => sibling);
      const r = rootFromInclusion(i, n, h, proof);
      expect(code(r), `${i}/${n}`).toBe('ok');
      expect(code(rootFromInclusion(i, n, h, proof.slice(1))), `${i}/${n} short`).toBe('proof_size_mismatch');
    }
    expect(code(verifyConsistency(2 ** 40, 2 ** 40 + 3, [sibling, sibling], h, h))).toBe('proof_size_mismatch');
  });
});

/** PATH length from the recursive definition, without hashing (for huge sizes). */
function pathLen(m: number, n: number): number {
  let len = 0;
  for (let lo = 0, hi = n; hi - lo > 1; len++) {
    const k = Naive.k(hi - lo);
    if (m - lo < k) hi = lo + k;
    else lo += k;
  }
  return len;
}

// ---------------------------------------------------------------------------------------------
// MerkleTree API and cost

describe('MerkleTree', () => {
  test('rejects bad arguments with RangeError / TypeError', () => {
    const t = MerkleTree.fromLeafHashes(refLeaves.slice(0, 5));
    expect(() => t.inclusionProof(0, 0)).toThrow(RangeError);
    expect(() => t.inclusionProof(5, 5)).toThrow(RangeError);
    expect(() => t.inclusionProof(0, 6)).toThrow(RangeError);
    expect(() => t.inclusionProof(-1, 3)).toThrow(RangeError);
    expect(() => t.inclusionProof(1.5, 3)).toThrow(RangeError);
    expect(() => t.inclusionProof(NaN, 3)).toThrow(RangeError);
    expect(() => t.consistencyProof(0, 3)).toThrow(RangeError);
    expect(() => t.consistencyProof(4, 3)).toThrow(RangeError);
    expect(() => t.consistencyProof(1, 6)).toThrow(RangeError);
    expect(() => t.root(6)).toThrow(RangeError);
    expect(() => t.root(-1)).toThrow(RangeError);
    expect(() => t.leafHashAt(5)).toThrow(RangeError);
    expect(() => t.append(new Uint8Array(31))).toThrow(TypeError);
    expect(() => t.append('x' as unknown as Uint8Array)).toThrow(TypeError);
    expect(t.size).toBe(5);
    expect(hex(t.consistencyProof(5, 5))).toEqual([]);
    expect(toHex(new MerkleTree().root())).toBe(toHex(H()));
  });

  test('returned hashes are copies: mutating them does not change the tree', () => {
    const t = MerkleTree.fromLeafHashes(refLeaves);
    const before = toHex(t.root());
    t.leafHashAt(0).fill(0);
    t.root(4).fill(0);
    t.root(1).fill(0);
    t.root(0).fill(0);
    for (const p of t.inclusionProof(3, 8)) p.fill(0);
    for (const p of t.consistencyProof(6, 8)) p.fill(0);
    const leaf = refLeaves[0]!.slice();
    const t2 = new MerkleTree();
    t2.append(leaf);
    leaf.fill(0);
    expect(toHex(t.root())).toBe(before);
    for (let n = 0; n <= 8; n++) {
      expect(toHex(t.root(n))).toBe(ref.rootHashesBySize[n]);
      for (let i = 0; i < n; i++) expect(hex(t.inclusionProof(i, n))).toEqual(hex(refNaive.path(i, 0, n)));
    }
    expect(toHex(EMPTY_ROOT)).toBe(toHex(H()));
    expect(toHex(t2.root())).toBe(toHex(refLeaves[0]!));
  });

  test('append is amortised O(1) hashing; roots and proofs for past sizes cost O(log² n)', () => {
    const N = 100_003; // several storage chunks per level
    const leaves = Array.from({ length: N }, (_, i) => naiveLeaf(utf8(String(i))));
    const t = new MerkleTree();
    let before = hashCalls.n;
    for (const l of leaves) t.append(l);
    let popcount = 0;
    for (let x = N; x > 0; x = Math.floor(x / 2)) popcount += x % 2;
    expect(hashCalls.n - before).toBe(N - popcount); // one hash per complete subtree of ≥ 2 leaves

    const naive = new Naive(leaves);
    const rand = rng(7);
    const logN = 17;
    let maxRoot = 0;
    let maxIncl = 0;
    let maxCons = 0;
    const measure = <T>(f: () => T): [T, number] => {
      before = hashCalls.n;
      const out = f();
      return [out, hashCalls.n - before];
    };
    for (let s = 0; s < 200; s++) {
      const n = s === 0 ? N : 1 + rand(N);
      const [r, rc] = measure(() => t.root(n));
      maxRoot = Math.max(maxRoot, rc);
      if (s < 10) expect(toHex(r)).toBe(toHex(naive.mth(0, n)));
      const i = rand(n);
      const [p, pc] = measure(() => t.inclusionProof(i, n));
      maxIncl = Math.max(maxIncl, pc);
      expect(code(verifyInclusion(i, n, leaves[i]!, p, r))).toBe('ok');
      const m = 1 + rand(n);
      const [c, cc] = measure(() => t.consistencyProof(m, n));
      maxCons = Math.max(maxCons, cc);
      expect(code(verifyConsistency(m, n, c, t.root(m), r))).toBe('ok');
    }
    expect(maxRoot).toBeLessThanOrEqual(logN);
    expect(maxIncl).toBeLessThanOrEqual(logN * logN);
    expect(maxCons).toBeLessThanOrEqual(logN * logN);
    expect(t.leafHashAt(N - 1)).toEqual(leaves[N - 1]);
    expect(toHex(t.leafHashAt(40_000))).toBe(toHex(leaves[40_000]!));
  });
});
