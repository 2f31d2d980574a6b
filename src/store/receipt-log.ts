// The receipt log: every receipt this node signs, in seq order, durable in SQLite (WAL) before
// anyone is told it exists, with the RFC 9162 Merkle tree over the envelopes kept in memory and
// signed checkpoints over it.
//
// append() assigns seq and prev synchronously, in call order, so the hash chain is fixed the moment
// a request finishes, however many finish together. Signing happens in the signer pool in batches;
// a batch is committed in one transaction (one fsync: group commit) and only then are its callers
// resolved. While one batch commits, the workers are already signing the next.
import Database from 'better-sqlite3';
import { toBase64, toHex, utf8 } from '../../attestation/bytes.ts';
import { canonicalize } from '../../attestation/canonical-json.ts';
import { formatCheckpoint, receiptLogOrigin } from '../../attestation/checkpoint.ts';
import { serializeEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import { FieldError } from '../../attestation/fields.ts';
import { sha256 } from '../../attestation/hash.ts';
import { MerkleTree, leafHash } from '../../attestation/merkle.ts';
import { signNote } from '../../attestation/note.ts';
import { GENESIS_PREV, RECEIPT_PAYLOAD_TYPE, RECEIPT_VERSION, expectedCost, validateReceiptPayload, type ReceiptBody, type ReceiptPayload } from '../../attestation/receipt.ts';
import { SignerPool } from '../../attestation/signer-pool.ts';
import { identityFromSeed } from '../identity.ts';

export class ReceiptLogError extends Error {
  override name = 'ReceiptLogError';
  readonly code: string;
  readonly field: string | undefined;
  constructor(code: string, message: string, field?: string) {
    super(message);
    this.code = code;
    this.field = field;
  }
}

export interface ReceiptLogOptions {
  /** SQLite file. */
  path: string;
  seed: Uint8Array;
  /** Signer worker threads (default 2; 0 signs in-process). */
  threads?: number;
  /** Sign a checkpoint after this many new receipts (default 1000). */
  checkpointEvery?: number;
  /** ...or after this long with new receipts (default 10 s; 0 disables the timer). */
  checkpointIntervalMs?: number;
  /** Most receipts committed in one transaction (default 512). */
  maxBatch?: number;
}

export interface AppendedReceipt {
  seq: string;
  payload: ReceiptPayload;
  envelope: DsseEnvelope;
  /** The envelope's canonical JSON: its line in receipts.jsonl and its Merkle leaf data. */
  line: string;
}

interface Pending {
  seq: number;
  payload: ReceiptPayload;
  bytes: Uint8Array;
  resolve: (r: AppendedReceipt) => void;
  reject: (e: Error) => void;
}

interface Row {
  seq: number;
  payload: Uint8Array;
  sig: Uint8Array;
}

export interface StoredCheckpoint {
  size: number;
  note: string;
  createdAt: number;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS receipts (
  seq INTEGER PRIMARY KEY,
  request_id TEXT NOT NULL,
  payload BLOB NOT NULL,
  sig BLOB NOT NULL,
  leaf BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS receipts_request_id ON receipts (request_id);
CREATE TABLE IF NOT EXISTS checkpoints (size INTEGER PRIMARY KEY, root BLOB NOT NULL, note TEXT NOT NULL, created_at INTEGER NOT NULL);
`;

export class ReceiptLog {
  readonly providerId: string;
  readonly origin: string;
  private readonly db: Database.Database;
  private readonly pool: SignerPool;
  private readonly seed: Uint8Array;
  private readonly tree: MerkleTree;
  private readonly checkpointEvery: number;
  private readonly maxBatch: number;
  private nextSeq: number;
  private lastPayloadHash: string;
  private lastCheckpointSize: number;
  private pending: Pending[] = [];
  private running: Promise<void> | undefined;
  private broken: Error | undefined;
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  private commits = 0;
  private readonly insert: Database.Statement;
  private readonly insertCheckpoint: Database.Statement;

  private constructor(opts: ReceiptLogOptions) {
    const id = identityFromSeed(opts.seed);
    this.providerId = id.providerId;
    this.origin = receiptLogOrigin(id.providerId);
    this.seed = opts.seed;
    this.checkpointEvery = opts.checkpointEvery ?? 1000;
    this.maxBatch = opts.maxBatch ?? 512;
    this.db = new Database(opts.path);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = FULL'); // a commit is on disk (fsync) when it returns
    this.db.exec(SCHEMA);
    const owner = this.db.prepare<[], { value: string }>("SELECT value FROM meta WHERE key = 'provider'").get();
    if (!owner) this.db.prepare("INSERT INTO meta (key, value) VALUES ('provider', ?)").run(this.providerId);
    else if (owner.value !== this.providerId) {
      this.db.close();
      throw new ReceiptLogError('log_wrong_key', `${opts.path} is the receipt log of provider ${owner.value}, not of this key (${this.providerId})`);
    }
    this.insert = this.db.prepare('INSERT INTO receipts (seq, request_id, payload, sig, leaf) VALUES (?, ?, ?, ?, ?)');
    this.insertCheckpoint = this.db.prepare('INSERT INTO checkpoints (size, root, note, created_at) VALUES (?, ?, ?, ?)');
    // Rebuild the tree and the chain head from disk, proving the stored log is whole on the way.
    this.tree = new MerkleTree();
    let last: Uint8Array | undefined;
    let expect = 0;
    for (const r of this.db.prepare<[], { seq: number; leaf: Uint8Array; payload: Uint8Array }>('SELECT seq, leaf, payload FROM receipts ORDER BY seq').iterate()) {
      if (r.seq !== expect) throw new ReceiptLogError('log_corrupt', `receipt log ${opts.path} is missing seq ${expect}`);
      this.tree.append(new Uint8Array(r.leaf));
      last = r.payload;
      expect++;
    }
    this.nextSeq = expect;
    this.lastPayloadHash = last ? toHex(sha256(last)) : GENESIS_PREV;
    const cp = this.db.prepare<[], { size: number; root: Uint8Array }>('SELECT size, root FROM checkpoints ORDER BY size DESC LIMIT 1').get();
    this.lastCheckpointSize = cp?.size ?? 0;
    if (cp && (cp.size > this.tree.size || toHex(this.tree.root(cp.size)) !== toHex(cp.root))) {
      this.db.close();
      throw new ReceiptLogError('log_corrupt', `receipt log ${opts.path} no longer matches its checkpoint of size ${cp.size}`);
    }
    this.pool = new SignerPool({ seed: opts.seed, keyid: this.providerId, threads: opts.threads ?? 2 });
    const interval = opts.checkpointIntervalMs ?? 10_000;
    if (interval > 0) {
      this.timer = setInterval(() => {
        if (this.tree.size > this.lastCheckpointSize && !this.broken) this.checkpoint();
      }, interval);
      this.timer.unref();
    }
  }

  static open(opts: ReceiptLogOptions): ReceiptLog {
    return new ReceiptLog(opts);
  }

  /** Receipts durably in the log. */
  get size(): number {
    return this.tree.size;
  }

  /** Counters for metrics: durable receipts, transactions (fsyncs) that wrote them, worker fallbacks. */
  stats(): { receipts: number; commits: number; signerFallbacks: number; lastCheckpointSize: number } {
    return { receipts: this.tree.size, commits: this.commits, signerFallbacks: this.pool.fallbacks, lastCheckpointSize: this.lastCheckpointSize };
  }

  /** Receipts accepted but not yet durable. */
  get backlog(): number {
    return this.nextSeq - this.tree.size;
  }

  /**
   * Signs and durably logs one receipt. Resolves once it is on disk; rejects (ReceiptLogError
   * 'receipt_invalid', naming the field) before taking a seq if the body is not a valid receipt.
   */
  append(body: ReceiptBody): Promise<AppendedReceipt> {
    if (this.closed) return Promise.reject(new ReceiptLogError('log_closed', 'the receipt log is closed'));
    if (this.broken) return Promise.reject(this.broken);
    const payload = {
      v: RECEIPT_VERSION,
      provider: this.providerId,
      seq: String(this.nextSeq),
      prev: this.lastPayloadHash,
      ...body,
    } as ReceiptPayload;
    let bytes: Uint8Array;
    try {
      validateReceiptPayload(payload);
      if (expectedCost(payload) !== BigInt(payload.cost_micro_usd)) {
        throw new FieldError('cost_micro_usd', `is not ${expectedCost(payload)}, the cost of the usage at the rates`);
      }
      if (BigInt(payload.cost_micro_usd) > BigInt(payload.hold_micro_usd)) throw new FieldError('cost_micro_usd', 'exceeds hold_micro_usd');
      bytes = utf8(canonicalize(payload));
    } catch (e) {
      const field = e instanceof FieldError ? e.field : undefined;
      return Promise.reject(new ReceiptLogError('receipt_invalid', `invalid receipt: ${(e as Error).message}`, field));
    }
    // From here on nothing can fail before the seq is taken: the chain advances in call order.
    const seq = this.nextSeq++;
    this.lastPayloadHash = toHex(sha256(bytes));
    return new Promise<AppendedReceipt>((resolve, reject) => {
      this.pending.push({ seq, payload, bytes, resolve, reject });
      this.running ??= this.drain();
    });
  }

  private async drain(): Promise<void> {
    await new Promise<void>((r) => setImmediate(r)); // let this tick's appends join the batch
    let signing = this.signNext();
    while (signing) {
      const { batch, signed } = await signing;
      signing = this.signNext(); // workers sign the next batch while this one commits
      this.commit(batch, signed);
    }
    this.running = undefined;
  }

  private signNext() {
    if (this.pending.length === 0) return undefined;
    const batch = this.pending.splice(0, this.maxBatch);
    return this.pool.sign(RECEIPT_PAYLOAD_TYPE, batch.map((p) => p.bytes)).then(
      (signed) => ({ batch, signed }),
      (e: Error) => ({ batch, signed: e }),
    );
  }

  private commit(batch: Pending[], signed: { signatures: Uint8Array[]; leafHashes: Uint8Array[] } | Error): void {
    if (!this.broken && signed instanceof Error) this.broken = new ReceiptLogError('log_failed', `signing failed: ${signed.message}`);
    if (!this.broken && !(signed instanceof Error)) {
      try {
        this.db.transaction(() => {
          batch.forEach((p, i) => this.insert.run(p.seq, p.payload.request_id, p.bytes, signed.signatures[i]!, signed.leafHashes[i]!));
        })();
        this.commits++;
      } catch (e) {
        // The seqs of this batch are taken and the chain runs through them: stop rather than fork.
        this.broken = new ReceiptLogError('log_failed', `receipt log write failed: ${(e as Error).message}`);
      }
    }
    if (this.broken || signed instanceof Error) {
      for (const p of batch) p.reject(this.broken!);
      for (const p of this.pending.splice(0)) p.reject(this.broken!);
      return;
    }
    batch.forEach((p, i) => {
      this.tree.append(signed.leafHashes[i]!);
      const envelope = this.envelopeOf(p.bytes, signed.signatures[i]!);
      p.resolve({ seq: String(p.seq), payload: p.payload, envelope, line: serializeEnvelope(envelope) });
    });
    if (this.tree.size - this.lastCheckpointSize >= this.checkpointEvery) this.checkpoint();
  }

  private envelopeOf(payload: Uint8Array, sig: Uint8Array): DsseEnvelope {
    return { payloadType: RECEIPT_PAYLOAD_TYPE, payload: toBase64(payload), signatures: [{ keyid: this.providerId, sig: toBase64(sig) }] };
  }

  /** Waits until every receipt accepted so far is durable (or failed). */
  async flush(): Promise<void> {
    while (this.running) await this.running;
  }

  /**
   * Signs a checkpoint over the whole durable log, unless the latest already covers it. The tree
   * only grows and is rebuilt from the stored receipts, so two checkpoints can never disagree.
   */
  checkpoint(): string | undefined {
    const size = this.tree.size;
    if (size === 0 || size === this.lastCheckpointSize) return undefined;
    const root = this.tree.root(size);
    const note = signNote(formatCheckpoint({ origin: this.origin, size, rootHash: root }), [{ name: this.origin, seed: this.seed }]);
    this.insertCheckpoint.run(size, root, note, Date.now());
    this.lastCheckpointSize = size;
    return note;
  }

  latestCheckpoint(): StoredCheckpoint | undefined {
    const r = this.db.prepare<[], { size: number; note: string; created_at: number }>('SELECT size, note, created_at FROM checkpoints ORDER BY size DESC LIMIT 1').get();
    return r && { size: r.size, note: r.note, createdAt: r.created_at };
  }

  checkpoints(): StoredCheckpoint[] {
    return this.db
      .prepare<[], { size: number; note: string; created_at: number }>('SELECT size, note, created_at FROM checkpoints ORDER BY size')
      .all()
      .map((r) => ({ size: r.size, note: r.note, createdAt: r.created_at }));
  }

  /** The envelope line of a durable receipt, by seq. */
  lineBySeq(seq: number): string | undefined {
    const r = this.db.prepare<[number], Row>('SELECT seq, payload, sig FROM receipts WHERE seq = ?').get(seq);
    return r && serializeEnvelope(this.envelopeOf(r.payload, r.sig));
  }

  /** Durable receipts for a request id (a retried or hedged request may have more than one). */
  byRequestId(requestId: string): { seq: number; line: string }[] {
    return this.db
      .prepare<[string], Row>('SELECT seq, payload, sig FROM receipts WHERE request_id = ? ORDER BY seq')
      .all(requestId)
      .map((r) => ({ seq: r.seq, line: serializeEnvelope(this.envelopeOf(r.payload, r.sig)) }));
  }

  /** Every durable envelope line in seq order, streamed from disk. */
  *lines(): Generator<string> {
    for (const r of this.db.prepare<[], Row>('SELECT seq, payload, sig FROM receipts ORDER BY seq').iterate()) {
      yield serializeEnvelope(this.envelopeOf(r.payload, r.sig));
    }
  }

  inclusionProof(seq: number, size = this.tree.size): Uint8Array[] {
    return this.tree.inclusionProof(seq, size);
  }

  consistencyProof(size1: number, size2 = this.tree.size): Uint8Array[] {
    return this.tree.consistencyProof(size1, size2);
  }

  root(size = this.tree.size): Uint8Array {
    return this.tree.root(size);
  }

  /** Flushes pending receipts, signs a final checkpoint and closes. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    await this.flush();
    if (!this.broken) this.checkpoint();
    await this.pool.close();
    this.db.close();
  }
}

/** Recomputes a leaf hash from a stored line (for checks and tests). */
export function leafOfLine(line: string): Uint8Array {
  return leafHash(utf8(line));
}

