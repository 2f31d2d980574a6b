// Verifying a whole receipt log: every receipt (receipt-verify.ts), the sequence and hash chain
// between them, the Merkle tree they form, the provider's checkpoints over that tree and, given
// the provider's signed price lists, every receipt's price against the list of its version.
// ReceiptChain is incremental, so an auditor can verify receipts in parallel elsewhere and feed
// the results here in order.
import { bytesEqual, isHex, toBase64 } from './bytes.ts';
import { receiptLogKey, verifyCheckpoint, type VerifiedCheckpoint } from './checkpoint.ts';
import type { DsseEnvelope } from './dsse.ts';
import { EMPTY_ROOT, MerkleTree, verifyConsistency } from './merkle.ts';
import { PriceBook, verifyPriceList } from './price-list.ts';
import { GENESIS_PREV } from './receipt.ts';
import { guarded, isOptions, fail, ok, unknownOption, unsetOption, type VerifyError, type VerifyResult } from './result.ts';
import { peekSeq, verifyReceipt, withSeq } from './receipt-verify.ts';

/** What the chain needs to know of one verified receipt. */
export interface ChainLink {
  seq: string;
  prev: string;
  payloadSha256: string;
  leafHash: Uint8Array;
  costMicroUsd: bigint;
  holdMicroUsd: bigint;
  status: string;
  /** The ticket the receipt bills: at most once in a log. */
  ticketId: string;
  /** Where the receipt stands in its file (1-based), when the caller knows: names a gap's place (gapLine). */
  line?: number;
}

export interface LogSummary {
  receipts: number;
  checkpoints: number;
  /** Root of the whole log (base64), and its size. */
  size: number;
  rootHash: string;
  totalCostMicroUsd: string;
  totalHoldMicroUsd: string;
  byStatus: Record<string, number>;
  /** The largest checkpoint checked, if any. */
  latestCheckpoint?: { size: number; rootHash: string };
  /** How many kept checkpoints (the caller's, from before) the log was checked against. */
  keptCheckpoints: number;
}

/** Checks seq continuity and the prev chain, and builds the Merkle tree, one receipt at a time. */
export class ReceiptChain {
  readonly tree = new MerkleTree();
  private expected = 0n;
  private lastHash = GENESIS_PREV;
  private totalCost = 0n;
  private totalHold = 0n;
  private readonly byStatus: Record<string, number> = {};
  /** Tickets billed so far, with the seq that billed each. */
  private readonly tickets = new Map<string, bigint>();
  /** After the first out-of-order seq: the seq that was expected there, and whether it shows up later. */
  private missing: { seq: bigint; at: string; foundLater: boolean; line: number | undefined } | undefined;
  private failed: VerifyError | undefined;

  /** Adds the next receipt in file order. Returns the first error, which sticks. */
  add(link: ChainLink): VerifyResult {
    if (this.failed) return { ok: false, error: this.failed };
    const seq = BigInt(link.seq);
    if (this.missing) {
      // Past a gap only look for the missing seq, to tell "missing" from "reordered".
      if (seq === this.missing.seq) this.missing.foundLater = true;
      return ok(undefined);
    }
    if (seq !== this.expected) {
      if (seq < this.expected) {
        return this.stop(fail('seq_duplicate', `seq ${seq} appears again after seq ${this.expected - 1n}`, { seq: link.seq }));
      }
      this.missing = { seq: this.expected, at: link.seq, foundLater: false, line: link.line };
      return ok(undefined);
    }
    if (link.prev !== this.lastHash) {
      return this.stop(fail('prev_mismatch', `prev does not hash the payload of seq ${seq - 1n}`, { seq: link.seq }));
    }
    // One ticket is one hold, used once (design.md: "ticket_id was never used before"): a second
    // receipt for it bills the buyer twice. (Request ids are the marketplace's to give; nothing
    // makes them unique to a log, so they are not checked.)
    const ticketAt = this.tickets.get(link.ticketId);
    if (ticketAt !== undefined) return this.stop(fail('ticket_billed_twice', `ticket ${link.ticketId} was already billed by seq ${ticketAt}`, { seq: link.seq }));
    this.tickets.set(link.ticketId, seq);
    this.expected = seq + 1n;
    this.lastHash = link.payloadSha256;
    this.tree.append(link.leafHash);
    this.totalCost += link.costMicroUsd;
    this.totalHold += link.holdMicroUsd;
    this.byStatus[link.status] = (this.byStatus[link.status] ?? 0) + 1;
    return ok(undefined);
  }

  /** Records an error found in the chain itself; the first one sticks. */
  stop(r: { ok: false; error: VerifyError }): { ok: false; error: VerifyError } {
    this.failed ??= r.error;
    return { ok: false, error: this.failed };
  }

  /**
   * Records a receipt that did not verify on its own (seq as it claims, if readable). Past a gap
   * the gap is the first fault, so the scan goes on only to tell "missing" from "reordered".
   */
  reject(error: VerifyError, claimedSeq?: string): VerifyResult {
    // An error that carries a seq found it after the signature verified: that seq is the
    // provider's. Otherwise the seq is only what the line claims, which anyone can edit (s28 review).
    const signed = error.seq;
    if (this.missing && !this.failed) {
      // (a line that only claims the missing seq does not make the gap a reorder)
      if (signed !== undefined && BigInt(signed) === this.missing.seq) this.missing.foundLater = true;
      return ok(undefined);
    }
    if (signed === undefined && claimedSeq !== undefined && BigInt(claimedSeq) !== this.expected) {
      // Named by where it stands, not by what it claims.
      return this.stop({ ok: false, error: { ...error, message: `${error.message} (the line where seq ${this.expected} belongs; it claims seq ${claimedSeq})`, seq: String(this.expected) } });
    }
    return this.stop({ ok: false, error: withSeq(error, claimedSeq) });
  }

  /** The line (ChainLink.line) where a gap or reorder was seen: where the missing seq belongs. */
  get gapLine(): number | undefined {
    return this.missing?.line;
  }

  /** True once nothing later can change the outcome. */
  get stopped(): boolean {
    return this.failed !== undefined;
  }

  /**
   * Ends the log: reports a gap or reorder, then checks the checkpoints against the tree: the
   * export's own, and `kept`, checkpoints the auditor holds from before (see checkCheckpoints).
   */
  finish(checkpoints: readonly string[], provider: string, kept: readonly string[] = []): VerifyResult<LogSummary> {
    if (this.failed) return { ok: false, error: this.failed };
    if (this.missing) {
      const { seq, at, foundLater } = this.missing;
      return foundLater
        ? fail('seq_out_of_order', `seq ${at} appears where seq ${seq} belongs`, { seq: String(seq) })
        : fail('seq_gap', `seq ${seq} is missing (next present is ${at})`, { seq: String(seq) });
    }
    const cps = checkCheckpoints(checkpoints, provider, this.tree, kept);
    if (!cps.ok) return cps;
    const latest = cps.value.at(-1);
    return ok({
      receipts: this.tree.size,
      checkpoints: cps.value.length,
      size: this.tree.size,
      rootHash: toBase64(this.tree.root()),
      totalCostMicroUsd: this.totalCost.toString(),
      totalHoldMicroUsd: this.totalHold.toString(),
      byStatus: { ...this.byStatus },
      keptCheckpoints: kept.length,
      ...(latest ? { latestCheckpoint: { size: latest.size, rootHash: toBase64(latest.rootHash) } } : {}),
    });
  }
}

/**
 * Checks signed checkpoints against the log's own tree: each is signed by the provider under its
 * receipt-log origin, no two disagree on the root of one size (a fork), and each root is the
 * tree's root at that size. Returns the log's own, sorted by size.
 *
 * Every checkpoint in an export is the provider's, so they agree with each other even when the
 * provider rewrote or cut its log and signed them all again. `kept` are checkpoints the auditor (a
 * buyer, the marketplace) got earlier and kept: the log must still contain each, whole and
 * unchanged, or it is `checkpoint_inconsistent` (history cut or rewritten).
 */
export function checkCheckpoints(notes: readonly string[], provider: string, tree: MerkleTree, kept: readonly string[] = []): VerifyResult<VerifiedCheckpoint[]> {
  return guarded('checkpoint_malformed', 'checkpoints', () => checkCheckpointsUnsafe(notes, provider, tree, kept));
}

function checkCheckpointsUnsafe(notes: readonly string[], provider: string, tree: MerkleTree, kept: readonly string[]): VerifyResult<VerifiedCheckpoint[]> {
  const key = receiptLogKey(provider);
  if (!key) return fail('unknown_key', 'provider must be 64 lowercase hex characters');
  for (const [i, note] of kept.entries()) {
    const v = verifyCheckpoint(note, key);
    if (!v.ok) return fail(v.error.code, `kept checkpoint ${i + 1}: ${v.error.message}`);
    const cp = v.value;
    if (cp.size > tree.size) {
      return fail('checkpoint_inconsistent', `kept checkpoint ${i + 1} covers ${cp.size} receipts, this log holds ${tree.size}: receipts the provider had signed into its log are gone`);
    }
    if (!bytesEqual(tree.root(cp.size), cp.rootHash)) {
      return fail('checkpoint_inconsistent', `kept checkpoint ${i + 1} (size ${cp.size}) does not match this log's first ${cp.size} receipts: the provider rewrote its history`);
    }
  }
  const verified: VerifiedCheckpoint[] = [];
  for (const [i, note] of notes.entries()) {
    const v = verifyCheckpoint(note, key);
    if (!v.ok) return fail(v.error.code, `checkpoint ${i + 1}: ${v.error.message}`);
    verified.push(v.value);
  }
  verified.sort((a, b) => a.size - b.size);
  for (let i = 1; i < verified.length; i++) {
    const a = verified[i - 1]!;
    const b = verified[i]!;
    if (a.size === b.size && !bytesEqual(a.rootHash, b.rootHash)) {
      return fail('checkpoint_fork', `two checkpoints of size ${a.size} sign different roots`);
    }
  }
  for (const cp of verified) {
    if (cp.size > tree.size) return fail('checkpoint_size_exceeds_log', `checkpoint of size ${cp.size} but the log has ${tree.size} receipts`);
    if (!bytesEqual(tree.root(cp.size), cp.rootHash)) {
      return fail('checkpoint_root_mismatch', `checkpoint of size ${cp.size} does not match the receipts`);
    }
  }
  // Every checkpoint matches the one tree, so they are pairwise consistent: nothing more to prove.
  return ok(verified);
}


export interface VerifyLogInput {
  /** The provider id (hex of its Ed25519 public key). */
  provider: string;
  /** Receipt envelopes in seq order: objects or JSON lines. */
  receipts: Iterable<DsseEnvelope | string>;
  /** Signed checkpoint notes. */
  checkpoints?: readonly string[];
  /**
   * Checkpoints of this provider's log that the caller got earlier and kept: the log must still
   * contain each unchanged (else `checkpoint_inconsistent`). The only defence against a provider
   * that rewrites or cuts its log and signs every checkpoint again.
   */
  keptCheckpoints?: readonly string[];
  /**
   * The provider's signed price lists (envelopes or their JSON). When given, each must verify
   * (else `price_list_invalid`) and every receipt's price must be its model's in the list of the
   * version it cites (else `price_list_missing` or `price_mismatch` at that receipt). When absent,
   * costs are checked only against the rates inside each receipt.
   */
  priceLists?: Iterable<DsseEnvelope | string>;
}

const LOG_OPTIONS = ['provider', 'receipts', 'checkpoints', 'keptCheckpoints', 'priceLists'];
const LOG_SHAPE = '{provider, receipts, checkpoints?, keptCheckpoints?, priceLists?}';

function isIterable(v: unknown): v is Iterable<unknown> {
  return v !== null && typeof v === 'object' && typeof (v as { [Symbol.iterator]?: unknown })[Symbol.iterator] === 'function';
}

/** Verifies a whole log in one call (in-process; `seller-node audit` does the same in parallel). Never throws. */
export function verifyLog(input: VerifyLogInput): VerifyResult<LogSummary> {
  return guarded('envelope_malformed', 'the log', () => verifyLogUnsafe(input));
}

function verifyLogUnsafe(input: VerifyLogInput): VerifyResult<LogSummary> {
  if (!isOptions(input)) return fail('options_invalid', `expected ${LOG_SHAPE}`);
  // A misspelt pin, or one given as undefined (an unset variable), must not quietly check nothing:
  // `keptCheckpoints` is the only defence against a rewritten log, `priceLists` against rates
  // other than the provider's published ones (s28 review).
  const unknown = unknownOption(input, LOG_OPTIONS);
  if (unknown !== undefined) return fail('options_invalid', `unknown option ${JSON.stringify(unknown)}: expected ${LOG_SHAPE}`);
  const unset = unsetOption(input, LOG_OPTIONS);
  if (unset !== undefined) return fail('options_invalid', `${unset} is given as undefined: give it, or leave it out`);
  if (typeof input.provider !== 'string') return fail('options_invalid', 'provider is required: the provider id (64 lowercase hex characters)');
  if (!isHex(input.provider, 32)) return fail('unknown_key', 'provider must be 64 lowercase hex characters');
  if (!isIterable(input.receipts)) return fail('options_invalid', 'receipts must be an iterable of envelopes (objects or their JSON text)');
  for (const k of ['checkpoints', 'keptCheckpoints'] as const) {
    if (input[k] !== undefined && !Array.isArray(input[k])) return fail('options_invalid', `${k} must be an array of signed notes (strings)`);
  }
  if (input.priceLists !== undefined && !isIterable(input.priceLists)) return fail('options_invalid', 'priceLists must be an iterable of signed price lists');
  let prices: PriceBook | undefined;
  if (input.priceLists !== undefined) {
    const book = verifyPriceLists(input.priceLists, input.provider);
    if (!book.ok) return book;
    prices = book.value;
  }
  const chain = new ReceiptChain();
  let n = 0;
  for (const env of input.receipts) {
    n++;
    const r = verifyReceipt(env, { provider: input.provider, chain: true });
    let added: VerifyResult;
    if (!r.ok) {
      added = chain.reject({ ...r.error, message: `receipt #${n}: ${r.error.message}` }, r.error.seq ?? peekSeq(env));
    } else {
      const bad = prices?.check(r.value.payload);
      added = bad ? chain.reject({ ...bad, message: `receipt #${n}: ${bad.message}` }, r.value.payload.seq) : chain.add(linkOf(r.value));
    }
    if (!added.ok) return added;
  }
  if (n === 0 && (input.checkpoints?.length ?? 0) === 0) return fail('log_empty', 'the log holds no receipts');
  return chain.finish(input.checkpoints ?? [], input.provider, input.keptCheckpoints ?? []);
}

/**
 * A provider's signed price lists, each verified (verifyPriceList), as a PriceBook; the first that
 * does not verify is `price_list_invalid`, naming it by its place (1-based) and the reason.
 */
export function verifyPriceLists(lists: Iterable<DsseEnvelope | string>, provider: string): VerifyResult<PriceBook> {
  const book = new PriceBook();
  let i = 0;
  for (const env of lists) {
    i++;
    const v = verifyPriceList(env, { provider });
    if (!v.ok) return { ok: false, error: { code: 'price_list_invalid', message: `price list #${i}: ${v.error.code}: ${v.error.message}` } };
    if (book.conflicts(v.value)) return { ok: false, error: { code: 'price_list_invalid', message: `price list #${i}: version ${v.value.version} is that of another list given, with other prices: a version must name one list` } };
    book.add(v.value);
  }
  return ok(book);
}

export function linkOf(v: { payload: { seq: string; prev: string; cost_micro_usd: string; hold_micro_usd: string; status: string; ticket_id: string }; payloadSha256?: string; leafHash?: Uint8Array }): ChainLink {
  return {
    ticketId: v.payload.ticket_id,
    seq: v.payload.seq,
    prev: v.payload.prev,
    payloadSha256: v.payloadSha256!,
    leafHash: v.leafHash!,
    costMicroUsd: BigInt(v.payload.cost_micro_usd),
    holdMicroUsd: BigInt(v.payload.hold_micro_usd),
    status: v.payload.status,
  };
}

/**
 * Checks that a newer checkpoint extends an older one, given a consistency proof (from the node's
 * /service/log protocol): what a buyer or the marketplace keeps doing to be sure the node never
 * rewrites its log. Both must be signed by the provider under its receipt-log origin.
 */
export function verifyCheckpointConsistency(older: string, newer: string, proof: Uint8Array[], provider: string): VerifyResult<{ older: VerifiedCheckpoint; newer: VerifiedCheckpoint }> {
  return guarded('proof_malformed', 'the checkpoints or proof', () => checkConsistency(older, newer, proof, provider));
}

function checkConsistency(older: string, newer: string, proof: Uint8Array[], provider: string): VerifyResult<{ older: VerifiedCheckpoint; newer: VerifiedCheckpoint }> {
  if (typeof provider !== 'string') return fail('options_invalid', 'provider (the fourth argument) must be the provider id: 64 lowercase hex characters');
  const key = receiptLogKey(provider);
  if (!key) return fail('unknown_key', 'provider must be 64 lowercase hex characters');
  const a = verifyCheckpoint(older, key);
  if (!a.ok) return a;
  const b = verifyCheckpoint(newer, key);
  if (!b.ok) return b;
  if (a.value.size > b.value.size) return fail('checkpoint_inconsistent', `the older checkpoint (${a.value.size}) is larger than the newer (${b.value.size})`);
  // The empty tree has one root (RFC 9162: the hash of nothing); a checkpoint of size 0 signing
  // another is no checkpoint of this log, whatever the proof (s23 h3).
  for (const c of [a.value, b.value]) {
    if (c.size === 0 && !bytesEqual(c.rootHash, EMPTY_ROOT)) return fail('checkpoint_root_mismatch', 'a checkpoint of size 0 signs a root other than that of the empty tree');
  }
  if (a.value.size === b.value.size || a.value.size === 0) {
    // (RFC 9162 §2.1.4.2: from an empty tree, or to the same size, the proof is empty.)
    if (proof.length !== 0) return fail('proof_size_mismatch', `a consistency proof from size ${a.value.size} to ${b.value.size} is empty, not ${proof.length} hashes`);
  }
  if (a.value.size === b.value.size) {
    return bytesEqual(a.value.rootHash, b.value.rootHash) ? ok({ older: a.value, newer: b.value }) : fail('checkpoint_fork', `two checkpoints of size ${a.value.size} sign different roots`);
  }
  if (a.value.size === 0) return ok({ older: a.value, newer: b.value });
  const c = verifyConsistency(a.value.size, b.value.size, proof, a.value.rootHash, b.value.rootHash);
  if (!c.ok) return fail('checkpoint_inconsistent', `checkpoints of size ${a.value.size} and ${b.value.size} are not consistent: ${c.error.message}`);
  return ok({ older: a.value, newer: b.value });
}
