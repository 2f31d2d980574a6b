// The receipt log: every receipt this node signs, in seq order, durable in SQLite (WAL) before
// anyone is told it exists, with the RFC 9162 Merkle tree over the envelopes kept in memory and
// signed checkpoints over it.
//
// append() assigns seq and prev synchronously, in call order, so the hash chain is fixed the moment
// a request finishes, however many finish together. Batches then go to two worker threads that
// sign them at the same time and commit them in seq order, one transaction (one fsync) per batch:
// group commit, off the event loop. A caller is resolved only after its batch's commit returned.
import { Piscina } from 'piscina';
import { toBase64, toHex, utf8 } from '../../attestation/bytes.ts';
import { canonicalize, sortKeys } from '../../attestation/canonical-json.ts';
import { formatCheckpoint, receiptLogOrigin } from '../../attestation/checkpoint.ts';
import { serializeEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import { FieldError } from '../../attestation/fields.ts';
import { sha256 } from '../../attestation/hash.ts';
import { MerkleTree } from '../../attestation/merkle.ts';
import { signNote } from '../../attestation/note.ts';
import { GENESIS_PREV, RECEIPT_PAYLOAD_TYPE, RECEIPT_VERSION, expectedCost, validateReceiptPayload, type ReceiptBody, type ReceiptPayload } from '../../attestation/receipt.ts';
import { signBatch, SIGNED_ITEM_BYTES } from '../../attestation/sign-batch.ts';
import { identityFromSeed } from '../identity.ts';
import type Database from 'better-sqlite3';
import { makeInserter, openDb, requestKey, SCHEMA } from './log-writer.ts';
import type { LogTask } from './log-worker.ts';

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
  /** Worker threads that sign and commit (default 2; 0 does both on the calling thread). */
  threads?: number;
  /** Sign a checkpoint after this many new receipts (default 1000). */
  checkpointEvery?: number;
  /** ...or after this long with new receipts (default 10 s; 0 disables the timer). */
  checkpointIntervalMs?: number;
  /** Most receipts committed in one transaction (default 256). */
  maxBatch?: number;
}

/** A durable receipt. The envelope and its line are built on first use. */
export class AppendedReceipt {
  readonly seq: string;
  readonly payload: ReceiptPayload;
  private readonly bytes: Uint8Array;
  private readonly sig: Uint8Array;
  private readonly keyid: string;
  private env: DsseEnvelope | undefined;
  private text: string | undefined;

  constructor(payload: ReceiptPayload, bytes: Uint8Array, sig: Uint8Array, keyid: string) {
    this.seq = payload.seq;
    this.payload = payload;
    this.bytes = bytes;
    this.sig = sig;
    this.keyid = keyid;
  }

  get envelope(): DsseEnvelope {
    return (this.env ??= envelopeOf(this.bytes, this.sig, this.keyid));
  }

  /** The envelope's canonical JSON: its line in receipts.jsonl and its Merkle leaf data. */
  get line(): string {
    return (this.text ??= serializeEnvelope(this.envelope));
  }
}

function envelopeOf(payload: Uint8Array, sig: Uint8Array, keyid: string): DsseEnvelope {
  return { payload: toBase64(payload), payloadType: RECEIPT_PAYLOAD_TYPE, signatures: [{ keyid, sig: toBase64(sig) }] };
}

interface Pending {
  payload: ReceiptPayload;
  bytes: Uint8Array;
  resolve: (r: AppendedReceipt) => void;
  reject: (e: Error) => void;
}

interface Batch {
  items: Pending[];
  result: Promise<Uint8Array>;
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

const WORKER_URL = new URL(import.meta.url.endsWith('.ts') ? './log-worker.ts' : './log-worker.js', import.meta.url);

export class ReceiptLog {
  readonly providerId: string;
  readonly origin: string;
  private readonly db: Database.Database;
  private readonly seed: Uint8Array;
  private readonly tree: MerkleTree;
  private readonly checkpointEvery: number;
  private readonly maxBatch: number;
  private readonly pool: Piscina | undefined;
  private readonly threads: number;
  private readonly insertInProcess: ((b: LogTask, signed: Uint8Array) => void) | undefined;
  private readonly turn = new Int32Array(new SharedArrayBuffer(8));
  private nextSeq: number;
  private nextBatch = 0;
  private lastPayloadHash: string;
  private lastCheckpointSize: number;
  private pending: Pending[] = [];
  private running: Promise<void> | undefined;
  private broken: Error | undefined;
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  private commits = 0;

  private constructor(opts: ReceiptLogOptions) {
    const id = identityFromSeed(opts.seed);
    this.providerId = id.providerId;
    this.origin = receiptLogOrigin(id.providerId);
    this.seed = opts.seed;
    this.checkpointEvery = opts.checkpointEvery ?? 1000;
    this.maxBatch = opts.maxBatch ?? 256;
    this.db = openDb(opts.path);
    try {
      this.db.exec(SCHEMA);
      const owner = this.db.prepare<[], { value: string }>("SELECT value FROM meta WHERE key = 'provider'").get();
      if (!owner) this.db.prepare("INSERT INTO meta (key, value) VALUES ('provider', ?)").run(this.providerId);
      else if (owner.value !== this.providerId) {
        throw new ReceiptLogError('log_wrong_key', `${opts.path} is the receipt log of provider ${owner.value}, not of this key (${this.providerId})`);
      }
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
        throw new ReceiptLogError('log_corrupt', `receipt log ${opts.path} no longer matches its checkpoint of size ${cp.size}`);
      }
    } catch (e) {
      this.db.close();
      throw e;
    }
    this.threads = opts.threads ?? 2;
    if (this.threads > 0) {
      this.pool = new Piscina({
        filename: WORKER_URL.href,
        minThreads: this.threads,
        maxThreads: this.threads,
        idleTimeout: Infinity,
        workerData: { seed: this.seed, file: opts.path, turn: this.turn.buffer, turnTimeoutMs: 30_000 },
      });
    } else {
      this.insertInProcess = makeInserter(this.db);
    }
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

  /** Counters for metrics: durable receipts, the transactions (fsyncs) that wrote them, the last checkpoint. */
  stats(): { receipts: number; commits: number; lastCheckpointSize: number; backlog: number } {
    return { receipts: this.tree.size, commits: this.commits, lastCheckpointSize: this.lastCheckpointSize, backlog: this.nextSeq - this.tree.size };
  }

  /**
   * Signs and durably logs one receipt. Resolves once it is on disk; rejects (ReceiptLogError
   * 'receipt_invalid', naming the field) before taking a seq if the body is not a valid receipt.
   */
  append(body: ReceiptBody): Promise<AppendedReceipt> {
    if (this.closed) return Promise.reject(new ReceiptLogError('log_closed', 'the receipt log is closed'));
    if (this.broken) return Promise.reject(this.broken);
    let payload: ReceiptPayload;
    let bytes: Uint8Array;
    try {
      // Sorted keys make canonicalize one walk plus native JSON.stringify.
      payload = sortKeys({ ...body, v: RECEIPT_VERSION, provider: this.providerId, seq: String(this.nextSeq), prev: this.lastPayloadHash } as ReceiptPayload);
      validateReceiptPayload(payload);
      const cost = expectedCost(payload);
      if (cost !== BigInt(payload.cost_micro_usd)) throw new FieldError('cost_micro_usd', `is not ${cost}, the cost of the usage at the rates`);
      if (cost > BigInt(payload.hold_micro_usd)) throw new FieldError('cost_micro_usd', 'exceeds hold_micro_usd');
      bytes = utf8(canonicalize(payload));
    } catch (e) {
      const field = e instanceof FieldError ? e.field : undefined;
      return Promise.reject(new ReceiptLogError('receipt_invalid', `invalid receipt: ${(e as Error).message}`, field));
    }
    // From here on nothing can fail before the seq is taken: the chain advances in call order.
    this.nextSeq++;
    this.lastPayloadHash = toHex(sha256(bytes));
    return new Promise<AppendedReceipt>((resolve, reject) => {
      this.pending.push({ payload, bytes, resolve, reject });
      this.running ??= this.drain();
    });
  }

  /** Sends batches to the workers (at most one each in flight) and settles them in seq order. */
  private async drain(): Promise<void> {
    await new Promise<void>((r) => setImmediate(r)); // let this tick's appends join the batch
    const inFlight: Batch[] = [];
    const limit = Math.max(1, this.threads);
    while (this.pending.length || inFlight.length) {
      while (this.pending.length && inFlight.length < limit && !this.broken) inFlight.push(this.dispatch(this.pending.splice(0, this.maxBatch)));
      const batch = inFlight.shift()!;
      if (!batch) break;
      try {
        this.settle(batch.items, await batch.result);
      } catch (e) {
        this.fail(batch.items, e as Error);
      }
      if (this.broken) {
        for (const b of inFlight.splice(0)) {
          await b.result.catch(() => undefined);
          this.fail(b.items, this.broken);
        }
        this.fail(this.pending.splice(0), this.broken);
      }
    }
    this.running = undefined;
  }

  private dispatch(items: Pending[]): Batch {
    let total = 0;
    for (const p of items) total += p.bytes.length;
    const payloads = new Uint8Array(total);
    const lengths = new Uint32Array(items.length);
    const requestKeys = new Float64Array(items.length);
    let off = 0;
    items.forEach((p, i) => {
      payloads.set(p.bytes, off);
      off += p.bytes.length;
      lengths[i] = p.bytes.length;
      requestKeys[i] = requestKey(p.payload.request_id);
    });
    const task: LogTask = {
      batch: this.nextBatch++,
      firstSeq: Number(items[0]!.payload.seq),
      requestKeys,
      payloads,
      lengths,
      payloadType: RECEIPT_PAYLOAD_TYPE,
      keyid: this.providerId,
    };
    if (this.pool) return { items, result: this.pool.run(task) as Promise<Uint8Array> };
    try {
      const signed = signBatch(this.seed, task);
      this.insertInProcess!(task, signed);
      return { items, result: Promise.resolve(signed) };
    } catch (e) {
      return { items, result: Promise.reject(e as Error) };
    }
  }

  private settle(items: Pending[], signed: Uint8Array): void {
    this.commits++;
    items.forEach((p, i) => {
      const o = i * SIGNED_ITEM_BYTES;
      this.tree.append(signed.subarray(o + 64, o + SIGNED_ITEM_BYTES));
      p.resolve(new AppendedReceipt(p.payload, p.bytes, signed.subarray(o, o + 64), this.providerId));
    });
    // A checkpoint at every multiple of checkpointEvery, whatever the batch boundaries.
    for (let at = (Math.floor(this.lastCheckpointSize / this.checkpointEvery) + 1) * this.checkpointEvery; at <= this.tree.size; at += this.checkpointEvery) {
      this.checkpoint(at);
    }
  }

  /** A failed batch: its seqs are taken and the chain runs through them, so the log stops rather than fork. */
  private fail(items: Pending[], e: Error): void {
    if (!this.broken) {
      this.broken = e instanceof ReceiptLogError ? e : new ReceiptLogError('log_failed', `receipt log write failed: ${e.message}`);
      Atomics.store(this.turn, 1, 1); // release any worker waiting for a turn that will never come
      Atomics.notify(this.turn, 0);
    }
    for (const p of items) p.reject(this.broken);
  }

  /** Waits until every receipt accepted so far is durable (or failed). */
  async flush(): Promise<void> {
    while (this.running) await this.running;
  }

  /**
   * Signs a checkpoint over the whole durable log, unless the latest already covers it. The tree
   * only grows and is rebuilt from the stored receipts, so two checkpoints can never disagree.
   */
  checkpoint(size = this.tree.size): string | undefined {
    if (size === 0 || size <= this.lastCheckpointSize || size > this.tree.size) return undefined;
    const root = this.tree.root(size);
    const note = signNote(formatCheckpoint({ origin: this.origin, size, rootHash: root }), [{ name: this.origin, seed: this.seed }]);
    this.db.prepare('INSERT INTO checkpoints (size, root, note, created_at) VALUES (?, ?, ?, ?)').run(size, root, note, Date.now());
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

  private lineOf(r: Row): string {
    return serializeEnvelope(envelopeOf(r.payload, r.sig, this.providerId));
  }

  /** The envelope line of a durable receipt, by seq. */
  lineBySeq(seq: number): string | undefined {
    if (!Number.isSafeInteger(seq) || seq < 0 || seq >= this.tree.size) return undefined;
    const r = this.db.prepare<[number], Row>('SELECT seq, payload, sig FROM receipts WHERE seq = ?').get(seq);
    return r && this.lineOf(r);
  }

  /** Durable receipts for a request id (a retried or hedged request may have more than one). */
  byRequestId(requestId: string): { seq: number; line: string }[] {
    return this.db
      .prepare<[number, number], Row>('SELECT seq, payload, sig FROM receipts WHERE request_key = ? AND seq < ? ORDER BY seq')
      .all(requestKey(requestId), this.tree.size)
      .filter((r) => (JSON.parse(Buffer.from(r.payload).toString('utf8')) as ReceiptPayload).request_id === requestId)
      .map((r) => ({ seq: r.seq, line: this.lineOf(r) }));
  }

  /** Every durable envelope line in seq order, streamed from disk. */
  *lines(): Generator<string> {
    const size = this.tree.size;
    for (const r of this.db.prepare<[number], Row>('SELECT seq, payload, sig FROM receipts WHERE seq < ? ORDER BY seq').iterate(size)) yield this.lineOf(r);
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
    await this.pool?.destroy();
    if (!this.broken) this.checkpoint();
    this.db.close();
  }
}
