// RFC 9162 (Certificate Transparency v2) §2.1 Merkle trees over receipt envelopes: hashing, an
// append-only in-memory tree that serves roots and proofs for any past size, and the §2.1.3.2 /
// §2.1.4.2 proof verifiers. No `node:` imports: the verifier half runs in browsers.
//
// Sizes and indices are JavaScript numbers, so everything is limited to Number.MAX_SAFE_INTEGER and
// uses arithmetic (not 32-bit bitwise operators) on them.
import { bytesEqual, copyBytes } from './bytes.ts';
import { sha256, sha256Parts, sha256Text } from './hash.ts';
import { fail, guarded, ok, type VerifyResult } from './result.ts';

export const HASH_SIZE = 32;

/** MTH({}) = SHA-256 of the empty string. */
export const EMPTY_ROOT: Uint8Array = sha256(new Uint8Array(0));

const LEAF_PREFIX = Uint8Array.of(0x00);

/** MTH({d}) = SHA-256(0x00 || d); a string counts as its UTF-8 bytes. */
export function leafHash(data: Uint8Array | string): Uint8Array {
  // U+0000 is the single byte 0x00 in UTF-8, so a string leaf is one one-shot hash.
  return typeof data === 'string' ? sha256Text('\u0000' + data) : sha256Parts(LEAF_PREFIX, data);
}

const nodeInput = new Uint8Array(1 + 2 * HASH_SIZE);
nodeInput[0] = 0x01;

/** SHA-256(0x01 || left || right). Children are normally 32 bytes; other lengths are hashed as given. */
export function nodeHash(left: Uint8Array, right: Uint8Array): Uint8Array {
  if (left.length !== HASH_SIZE || right.length !== HASH_SIZE) {
    const buf = new Uint8Array(1 + left.length + right.length);
    buf[0] = 0x01;
    buf.set(left, 1);
    buf.set(right, 1 + left.length);
    return sha256(buf);
  }
  nodeInput.set(left, 1);
  nodeInput.set(right, 1 + HASH_SIZE);
  return sha256(nodeInput);
}

// ---------------------------------------------------------------------------------------------
// Tree

/** Hashes per storage chunk (1 MiB). Chunk 0 starts small and doubles, so small trees stay small. */
const CHUNK = 1 << 15;

/** Append-only list of 32-byte hashes packed into large chunks (no object per hash). */
class HashList {
  private chunks: Uint8Array[] = [];
  length = 0;

  push(hash: Uint8Array): void {
    this.pushFrom(hash, 0);
  }

  /** Pushes the 32 bytes of `src` at `from` (copied: no view of them is made). */
  pushFrom(src: Uint8Array, from: number): void {
    const c = Math.floor(this.length / CHUNK);
    const offset = (this.length % CHUNK) * HASH_SIZE;
    let chunk = this.chunks[c];
    if (chunk === undefined) {
      chunk = new Uint8Array((c === 0 ? 16 : CHUNK) * HASH_SIZE);
      this.chunks.push(chunk);
    } else if (offset === chunk.length) {
      const bigger = new Uint8Array(chunk.length * 2); // only chunk 0 grows, up to CHUNK hashes
      bigger.set(chunk);
      this.chunks[c] = chunk = bigger;
    }
    for (let k = 0; k < HASH_SIZE; k++) chunk[offset + k] = src[from + k]!;
    this.length++;
  }

  /** SHA-256(0x01 || hash i || hash i + 1) for an even i (the two share a chunk): nodeHash without views. */
  pairHash(i: number): Uint8Array {
    const chunk = this.chunks[Math.floor(i / CHUNK)]!;
    const offset = (i % CHUNK) * HASH_SIZE;
    for (let k = 0; k < 2 * HASH_SIZE; k++) nodeInput[1 + k] = chunk[offset + k]!;
    return sha256(nodeInput);
  }

  /** A view of hash i (no copy): callers must not modify it or hand it out. */
  at(i: number): Uint8Array {
    const chunk = this.chunks[Math.floor(i / CHUNK)]!;
    const offset = (i % CHUNK) * HASH_SIZE;
    return chunk.subarray(offset, offset + HASH_SIZE);
  }
}

/**
 * Append-only RFC 9162 Merkle tree. levels[k] holds the hash of every complete subtree of 2^k
 * leaves seen so far: levels[k].at(i) covers leaves [i·2^k, (i+1)·2^k). Appending costs amortised
 * one node hash; the root or a proof for any past size is assembled from stored subtrees with at
 * most O(log² n) hashes.
 */
export class MerkleTree {
  private readonly levels: HashList[] = [new HashList()];

  static fromLeafHashes(hashes: Iterable<Uint8Array>): MerkleTree {
    const tree = new MerkleTree();
    for (const h of hashes) tree.append(h);
    return tree;
  }

  get size(): number {
    return this.levels[0]!.length;
  }

  /** Appends an already computed leaf hash (see leafHash). */
  append(leafHash: Uint8Array): void {
    if (!(leafHash instanceof Uint8Array) || leafHash.length !== HASH_SIZE) {
      throw new TypeError(`leaf hash must be a ${HASH_SIZE}-byte Uint8Array`);
    }
    this.appendFrom(leafHash, 0);
  }

  /** Appends the leaf hash at byte `offset` of `hashes` (a batch's leaf hashes laid end to end). */
  appendFrom(hashes: Uint8Array, offset: number): void {
    if (!(hashes instanceof Uint8Array) || !Number.isSafeInteger(offset) || offset < 0 || offset + HASH_SIZE > hashes.length) {
      throw new TypeError(`expected ${HASH_SIZE} bytes of a Uint8Array at offset ${offset}`);
    }
    if (this.size >= Number.MAX_SAFE_INTEGER) throw new RangeError('tree is full');
    // Push the leaf, then complete every subtree it closes: when level k gets an even count,
    // its last two entries form a new level k+1 subtree.
    let level = this.levels[0]!;
    level.pushFrom(hashes, offset);
    for (let k = 0; level.length % 2 === 0; k++) {
      const parent = level.pairHash(level.length - 2);
      let up = this.levels[k + 1];
      if (up === undefined) this.levels.push((up = new HashList()));
      up.push(parent);
      level = up;
    }
  }

  leafHashAt(index: number): Uint8Array {
    checkIndex('index', index, 0, this.size - 1);
    return this.levels[0]!.at(index).slice();
  }

  /** MTH of the first `size` leaves. */
  root(size: number = this.size): Uint8Array {
    checkIndex('size', size, 0, this.size);
    return size === 0 ? EMPTY_ROOT.slice() : this.rangeHash(0, size);
  }

  /** PATH(index, D[size]) of RFC 9162 §2.1.3.1, lowest sibling first. Requires index < size ≤ this.size. */
  inclusionProof(index: number, size: number): Uint8Array[] {
    checkIndex('size', size, 1, this.size);
    checkIndex('index', index, 0, size - 1);
    // Walk down from the root range [lo, hi) towards the leaf, recording the other half each time.
    const path: Uint8Array[] = [];
    let lo = 0;
    let hi = size;
    while (hi - lo > 1) {
      const k = largestPowerOfTwoBelow(hi - lo);
      if (index < lo + k) {
        path.push(this.rangeHash(lo + k, hi));
        hi = lo + k;
      } else {
        path.push(this.rangeHash(lo, lo + k));
        lo += k;
      }
    }
    return path.reverse();
  }

  /**
   * PROOF(size1, D[size2]) of RFC 9162 §2.1.4.1. Requires 0 < size1 ≤ size2 ≤ this.size; the proof
   * for size1 == size2 is empty (what verifyConsistency expects).
   */
  consistencyProof(size1: number, size2: number): Uint8Array[] {
    checkIndex('size2', size2, 1, this.size);
    checkIndex('size1', size1, 1, size2);
    // SUBPROOF(m, D[lo:hi], b), unrolled: descend until the range is exactly the old tree's
    // remaining part, recording the other half each time.
    const path: Uint8Array[] = [];
    let lo = 0;
    let hi = size2;
    let completeSubtree = true; // the RFC's b: the old tree's remaining part is known to the verifier
    while (size1 !== hi) {
      const k = largestPowerOfTwoBelow(hi - lo);
      if (size1 - lo <= k) {
        path.push(this.rangeHash(lo + k, hi));
        hi = lo + k;
      } else {
        path.push(this.rangeHash(lo, lo + k));
        lo += k;
        completeSubtree = false;
      }
    }
    if (!completeSubtree) path.push(this.rangeHash(lo, hi));
    return path.reverse();
  }

  /**
   * MTH(D[lo:hi]) for a range the RFC recursion can produce (lo a multiple of the smallest power of
   * two ≥ hi - lo). Such a range splits into stored complete subtrees of decreasing size, and its
   * hash is their right-to-left fold. Always returns a fresh array.
   */
  private rangeHash(lo: number, hi: number): Uint8Array {
    const parts: Uint8Array[] = [];
    for (let k = bitLength(hi - lo) - 1; k >= 0; k--) {
      const width = 2 ** k;
      if (hi - lo >= width) {
        parts.push(this.levels[k]!.at(lo / width));
        lo += width;
      }
    }
    let hash = parts.pop()!;
    if (parts.length === 0) return copyBytes(hash);
    while (parts.length > 0) hash = nodeHash(parts.pop()!, hash);
    return hash;
  }
}

function checkIndex(name: string, value: number, min: number, max: number): void {
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new RangeError(`${name} ${value} is outside [${min}, ${max}]`);
  }
}

/** Largest power of two strictly below n (n ≥ 2): the RFC's k. */
function largestPowerOfTwoBelow(n: number): number {
  let k = 1;
  while (k * 2 < n) k *= 2;
  return k;
}

/** Number of bits needed to write n ≥ 0. */
function bitLength(n: number): number {
  let bits = 0;
  for (let p = 1; p <= n; p *= 2) bits++;
  return bits;
}

// ---------------------------------------------------------------------------------------------
// Verification. Every function here returns a VerifyResult and never throws, whatever it is given.

function isSize(n: unknown): n is number {
  return Number.isSafeInteger(n) && (n as number) >= 0;
}

function isHash(h: unknown): h is Uint8Array {
  return h instanceof Uint8Array && h.length === HASH_SIZE;
}

/** Checks the elements of a proof whose length is already known to be right. */
function proofHashesOk(proof: readonly unknown[]): proof is Uint8Array[] {
  for (let i = 0; i < proof.length; i++) if (!isHash(proof[i])) return false;
  return true;
}

/**
 * The RFC 9162 §2.1.3.2 step 4.b.ii shift, shared with §2.1.4.2 step 6.b.iii: with fn on the right
 * border (fn == sn) and even, right-shift fn and sn until fn is odd or 0. Returns [fn, sn].
 */
function climbBorder(fn: number, sn: number): [number, number] {
  while (fn % 2 === 0 && fn !== 0) {
    fn /= 2;
    sn = Math.floor(sn / 2);
  }
  return [fn, sn];
}

/** How many hashes the step 4 / step 6 loop consumes from (fn, sn) before sn reaches 0. */
function pathLength(fn: number, sn: number): number {
  let n = 0;
  for (; sn > 0; n++) {
    if (fn % 2 === 0 && fn === sn) [fn, sn] = climbBorder(fn, sn);
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  return n;
}

/**
 * The root an inclusion proof implies (RFC 9162 §2.1.3.2 steps 1-4). Fails with
 * proof_index_out_of_range when leafIndex ≥ treeSize and proof_size_mismatch when the proof has the
 * wrong number of hashes for (leafIndex, treeSize).
 */
export function rootFromInclusion(leafIndex: number, treeSize: number, leafHash: Uint8Array, proof: Uint8Array[]): VerifyResult<Uint8Array> {
  if (!isSize(leafIndex) || !isSize(treeSize)) return fail('proof_malformed', 'leaf index and tree size must be non-negative safe integers');
  if (!isHash(leafHash)) return fail('proof_malformed', `leaf hash must be ${HASH_SIZE} bytes`);
  if (!Array.isArray(proof)) return fail('proof_malformed', 'proof must be an array of hashes');
  if (leafIndex >= treeSize) return fail('proof_index_out_of_range', `leaf index ${leafIndex} is not below tree size ${treeSize}`);
  const want = pathLength(leafIndex, treeSize - 1);
  if (proof.length !== want) return fail('proof_size_mismatch', `inclusion proof has ${proof.length} hashes, tree size ${treeSize} needs ${want}`);
  if (!proofHashesOk(proof)) return fail('proof_malformed', `proof hashes must be ${HASH_SIZE} bytes`);

  let fn = leafIndex;
  let sn = treeSize - 1;
  let r = leafHash;
  for (const p of proof) {
    if (fn % 2 === 1 || fn === sn) {
      r = nodeHash(p, r);
      if (fn % 2 === 0) [fn, sn] = climbBorder(fn, sn);
    } else {
      r = nodeHash(r, p);
    }
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  return ok(r); // sn is 0 here: the length check above ran the same loop
}

/** RFC 9162 §2.1.3.2: is `leafHash` the leaf at `leafIndex` of the tree of `treeSize` with `root`? */
export function verifyInclusion(leafIndex: number, treeSize: number, leafHash: Uint8Array, proof: Uint8Array[], root: Uint8Array): VerifyResult {
  return guarded('proof_malformed', 'the proof', () => checkInclusion(leafIndex, treeSize, leafHash, proof, root));
}

function checkInclusion(leafIndex: number, treeSize: number, leafHash: Uint8Array, proof: Uint8Array[], root: Uint8Array): VerifyResult {
  if (!isHash(root)) return fail('proof_malformed', `root must be ${HASH_SIZE} bytes`);
  const computed = rootFromInclusion(leafIndex, treeSize, leafHash, proof);
  if (!computed.ok) return computed;
  if (!bytesEqual(computed.value, root)) return fail('proof_root_mismatch', 'inclusion proof does not lead to the root');
  return ok(undefined);
}

/**
 * RFC 9162 §2.1.4.2: is the tree of size2 with root2 an extension of the tree of size1 with root1?
 * As in transparency-dev/merkle: size1 == size2 needs an empty proof and root1 == root2 (compared
 * as given); size1 == 0 is rejected (a proof from the empty tree is meaningless).
 */
export function verifyConsistency(size1: number, size2: number, proof: Uint8Array[], root1: Uint8Array, root2: Uint8Array): VerifyResult {
  return guarded('proof_malformed', 'the proof', () => checkConsistencyProof(size1, size2, proof, root1, root2));
}

function checkConsistencyProof(size1: number, size2: number, proof: Uint8Array[], root1: Uint8Array, root2: Uint8Array): VerifyResult {
  if (!isSize(size1) || !isSize(size2)) return fail('proof_malformed', 'tree sizes must be non-negative safe integers');
  if (!(root1 instanceof Uint8Array) || !(root2 instanceof Uint8Array)) return fail('proof_malformed', 'roots must be byte arrays');
  if (!Array.isArray(proof)) return fail('proof_malformed', 'proof must be an array of hashes');
  if (size1 > size2) return fail('proof_malformed', `size1 ${size1} is larger than size2 ${size2}`);
  if (size1 === 0) return fail('proof_malformed', 'a consistency proof from the empty tree is meaningless');
  if (size1 === size2) {
    if (proof.length !== 0) return fail('proof_size_mismatch', 'a proof between equal sizes must be empty');
    if (!bytesEqual(root1, root2)) return fail('proof_root_mismatch', 'equal sizes with different roots');
    return ok(undefined);
  }
  if (root1.length !== HASH_SIZE || root2.length !== HASH_SIZE) return fail('proof_malformed', `roots must be ${HASH_SIZE} bytes`);

  // Step 2: when size1 is a power of two, root1 itself is the proof's implicit first hash.
  const implicitFirst = isPowerOfTwo(size1);
  // Steps 3-4: fn, sn = size1 - 1, size2 - 1, shifted right past the trailing one bits of fn.
  let fn = size1 - 1;
  let sn = size2 - 1;
  while (fn % 2 === 1) [fn, sn] = [(fn - 1) / 2, Math.floor(sn / 2)];
  const want = (implicitFirst ? 0 : 1) + pathLength(fn, sn);
  if (proof.length !== want) return fail('proof_size_mismatch', `consistency proof has ${proof.length} hashes, sizes ${size1} → ${size2} need ${want}`);
  if (!proofHashesOk(proof)) return fail('proof_malformed', `proof hashes must be ${HASH_SIZE} bytes`);

  const path = implicitFirst ? [root1, ...proof] : proof;
  // Step 5-6: fr rebuilds the old root, sr the new one.
  let fr = path[0]!;
  let sr = fr;
  for (let i = 1; i < path.length; i++) {
    const c = path[i]!;
    if (fn % 2 === 1 || fn === sn) {
      fr = nodeHash(c, fr);
      sr = nodeHash(c, sr);
      if (fn % 2 === 0) [fn, sn] = climbBorder(fn, sn);
    } else {
      sr = nodeHash(sr, c);
    }
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  // Step 7 (sn == 0 is guaranteed by the length check).
  if (!bytesEqual(fr, root1)) return fail('proof_root_mismatch', `consistency proof does not lead to the root of size ${size1}`);
  if (!bytesEqual(sr, root2)) return fail('proof_root_mismatch', `consistency proof does not lead to the root of size ${size2}`);
  return ok(undefined);
}

function isPowerOfTwo(n: number): boolean {
  while (n > 1 && n % 2 === 0) n /= 2;
  return n === 1;
}
