// The receipt log: every receipt this node signs, in seq order, durable in SQLite (WAL) before
// anyone is told it exists, with the RFC 9162 Merkle tree over the envelopes kept in memory and
// signed checkpoints over it.
//
// append() assigns seq and prev synchronously, in call order, so the hash chain is fixed the moment
// a request finishes, however many finish together. Batches then go to the signer pool (worker
// threads signing at the same time) and, in seq order, to a writer thread that commits each batch
// in one transaction (one fsync: group commit). A caller is resolved only after its batch's commit
// returned. Signing runs on the signer threads (a batch of one or two while they are idle
// excepted: see INLINE_SIGN_MAX) and fsync waits never run on the event loop.
import { performance } from 'node:perf_hooks';
import { toBase64, toHex, utf8 } from '../../attestation/bytes.ts';
import { formatCheckpoint, receiptLogOrigin } from '../../attestation/checkpoint.ts';
import { envelopeLine, type DsseEnvelope } from '../../attestation/dsse.ts';
import { FieldError } from '../../attestation/fields.ts';
import { sha256Hex } from '../../attestation/hash.ts';
import { MerkleTree } from '../../attestation/merkle.ts';
import { signNote } from '../../attestation/note.ts';
import { GENESIS_PREV, RECEIPT_PAYLOAD_TYPE, buildReceiptPayload, expectedCost, receiptPayloadJson, validateReceiptPayload, type ReceiptBody, type ReceiptPayload } from '../../attestation/receipt.ts';
import { batchItem, packPayloads, type SignedBatch } from '../../attestation/sign-batch.ts';
import { SignerPool } from '../../attestation/signer-pool.ts';
import { identityFromSeed } from '../identity.ts';
import type Database from 'better-sqlite3';
import { CloseGuard } from './close-guard.ts';
import { FilesChangedError, inDatabaseFile, openDb, requestKey, rowRequestKeys, rowToBatch, SCHEMA, type BatchRow, type CommitMark } from './log-writer.ts';
import { chainHeadPath, headMismatch, headPath, readChainHead, readHead, writeChainHead, writeHead } from './checkpoint-head.ts';
import { DatabaseRescue } from './file-guard.ts';
import { salvageReceipts, sayRanges, type HeldBatch } from './log-rescue.ts';
import { SqliteSeal, type SealProblem } from './sqlite-seal.ts';
import { RepeatLimit } from '../ops/repeat-limit.ts';
import { RequestKeyFilter } from './request-key-filter.ts';
import { InProcessWriter, WriterThread, type BatchWriter } from './writer-thread.ts';
import { Utf8Arena } from './utf8-arena.ts';

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
  /** Signer threads (default 2); 0 signs and writes on the calling thread (for small tools). */
  threads?: number;
  /** Sign a checkpoint after this many new receipts (default 1000). */
  checkpointEvery?: number;
  /** ...or after this long with new receipts (default 10 s; 0 disables the timer). */
  checkpointIntervalMs?: number;
  /** Most receipts committed in one transaction (default 512). */
  maxBatch?: number;
  /** How often it looks whether its files were deleted, replaced or changed in place under it (default 10 s). */
  fileCheckMs?: number;
  /** Most bytes of committed batches kept in memory until the database file holds them (default 64 MiB; see held). */
  heldBytes?: number;
  /** receipts.checkpoint is written at most this often while receipts stream in (default 1000; see keepHead). */
  headEveryMs?: number;
  /**
   * Told of problems that do not stop the log (its checkpoint file cannot be read or written:
   * 'warn'), and, once, of what stopped it ('error': "the receipt log has stopped, …"), and of a
   * copy of its files made later. Must not throw.
   */
  onNotice?: (message: string, level: 'warn' | 'error') => void;
}

/** A durable receipt. The envelope and its line are built on first use. */
export class AppendedReceipt {
  readonly seq: string;
  readonly payload: ReceiptPayload;
  /** The exact signed payload: canonical JSON. */
  readonly payloadJson: string;
  /** Its batch's signatures, 64 bytes each, and its index among them. */
  private readonly sigs: Uint8Array;
  private readonly index: number;
  private readonly keyid: string;
  private env: DsseEnvelope | undefined;
  private text: string | undefined;

  constructor(payload: ReceiptPayload, payloadJson: string, sigs: Uint8Array, index: number, keyid: string) {
    this.seq = payload.seq;
    this.payload = payload;
    this.payloadJson = payloadJson;
    this.sigs = sigs;
    this.index = index;
    this.keyid = keyid;
  }

  get envelope(): DsseEnvelope {
    return (this.env ??= envelopeOf(utf8(this.payloadJson), this.sigs.subarray(this.index * 64, this.index * 64 + 64), this.keyid));
  }

  /** The envelope's canonical JSON: its line in receipts.jsonl and its Merkle leaf data. */
  get line(): string {
    return (this.text ??= envelopeLine(this.envelope.payload, RECEIPT_PAYLOAD_TYPE, this.keyid, this.envelope.signatures[0]!.sig));
  }
}

function prepareStatements(db: Database.Database) {
  return {
    // OR IGNORE: `log export` may have signed this size already from its own connection.
    insertCheckpoint: db.prepare<[number, Uint8Array, string, number]>('INSERT OR IGNORE INTO checkpoints (size, root, note, created_at) VALUES (?, ?, ?, ?)'),
    checkpointOfSize: db.prepare<[number], { root: Uint8Array; note: string; created_at: number }>('SELECT root, note, created_at FROM checkpoints WHERE size = ?'),
    // (at most the size this connection has read: another may have checkpointed receipts it has not)
    latestCheckpoint: db.prepare<[number], { size: number; note: string; created_at: number }>('SELECT size, note, created_at FROM checkpoints WHERE size <= ? ORDER BY size DESC LIMIT 1'),
    batchAt: db.prepare<[number], BatchRow>('SELECT * FROM receipt_batches WHERE first_seq <= ? ORDER BY first_seq DESC LIMIT 1'),
    requestKeysIn: db.prepare<[number, number], { first_seq: number; count: number; request_keys: Uint8Array }>('SELECT first_seq, count, request_keys FROM receipt_batches WHERE first_seq >= ? AND first_seq < ?'),
  };
}

function envelopeOf(payload: Uint8Array, sig: Uint8Array, keyid: string): DsseEnvelope {
  // Keys in canonical order.
  return { payload: toBase64(payload), payloadType: RECEIPT_PAYLOAD_TYPE, signatures: [{ keyid, sig: toBase64(sig) }] };
}

interface Pending {
  payload: ReceiptPayload;
  text: string;
  /** The text's UTF-8 bytes (a view into the log's arena). */
  bytes: Uint8Array;
  resolve: (r: AppendedReceipt) => void;
  reject: (e: Error) => void;
}

export interface StoredCheckpoint {
  size: number;
  note: string;
  createdAt: number;
}

/** How often the log looks whether its files were deleted, replaced or changed in place under it. */
const FILE_CHECK_MS = 10_000;

/** Committed batches kept in memory until the database file holds them, at most (bytes). */
const HELD_BYTES = 64 * 1024 * 1024;

/** Sizes of the latest checkpoints signed here, kept to sign them again into a rescued copy. */
const SIGNED_SIZES = 4096;

/** The one error line of a stop. */
const STOPPED = 'the receipt log has stopped, and paid work is refused until the node is restarted: ';

/** A committed batch kept in memory, and where it is in the WAL. */
type Held = HeldBatch & { gen: string; frame: number; bytes: number };

/** Batches a signer thread has at most: the one it signs and the next. */
const SIGNING_PER_THREAD = 2;

/** Batches handed to the signers and not yet committed, at most (see pump). */
const MAX_UNSETTLED = 8;

/**
 * The in-memory index's key for a request key: its low 30 bits, a small integer, which V8 keeps in
 * a Map without allocating a number per entry (the 53-bit key did, a measurable part of the event
 * loop's time at full rate). Collisions are harmless: lookups compare the payload's request id.
 */
const recentKey = (key: number): number => key % 0x40000000;

/** How many request ids the in-memory index keeps (about 100 bytes each). */
const RECENT_REQUESTS = 200_000;

/**
 * Batches this small are signed on the event loop when the signer threads are idle (see
 * SignerPool.sign): handing one to a thread costs the event loop about as much as signing it
 * (~50 µs), and the round trip adds ~0.5 ms before the receipt is durable.
 */
const INLINE_SIGN_MAX = 2;

export class ReceiptLog {
  readonly providerId: string;
  readonly origin: string;
  private readonly db: Database.Database;
  /** While it is open, closing `db` cannot checkpoint the WAL into the database file (close-guard.ts). */
  private readonly closeGuard: CloseGuard;
  private readonly seed: Uint8Array;
  private readonly publicKey: Uint8Array;
  private readonly tree: MerkleTree;
  private readonly checkpointEvery: number;
  private readonly path: string;
  private readonly maxBatch: number;
  /** Where pending payloads' bytes are encoded until their batch is packed. */
  private readonly arena = new Utf8Arena();
  private readonly signer: SignerPool;
  private readonly writer: BatchWriter;
  private nextSeq: number;
  private nextBatch = 0;
  /** The hand-over of the latest batch to the writer: batches are handed over in seq order. */
  private handedOver: Promise<unknown> = Promise.resolve();
  private lastPayloadHash: string;
  private lastCheckpointSize: number;
  private pending: Pending[] = [];
  /** Batches being signed (at most signLimit), batches handed to the signers and not yet settled. */
  private signing = 0;
  private unsettled = 0;
  private readonly signLimit: number;
  private pumpScheduled = false;
  /** The settlement of the latest batch: each settles after the one before it, in seq order. */
  private settled: Promise<void> = Promise.resolve();
  /** flush() calls waiting for the next batch to settle. */
  private readonly flushes: (() => void)[] = [];
  private broken: ReceiptLogError | undefined;
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  private fileTimer: NodeJS.Timeout | undefined;
  private commits = 0;
  /**
   * Request key → seqs of recent durable receipts. Every durable seq ≥ recentFloor is in it; older
   * ones are found by reading the stored batches' request keys in the segments keyFilter names.
   */
  private readonly recent = new Map<number, number | number[]>(); // by recentKey: one seq, or several (retries, key collisions)
  private recentFloor: number;
  private readonly keyFilter = new RequestKeyFilter();
  /** The file beside the log that keeps its latest checkpoint (checkpoint-head.ts), and the size it holds. */
  private readonly headFile: string;
  private headSize = 0;
  /** When the checkpoint file was last written, and the checkpoint waiting to be written and its timer (keepHead). */
  private headAt = Number.NEGATIVE_INFINITY;
  private readonly headEveryMs: number;
  private headDue: { size: number; note: string } | undefined;
  private headTimer: NodeJS.Timeout | undefined;
  /** The file that keeps how many receipts were acknowledged (checkpoint-head.ts), when it was last written, its pending write. */
  private readonly chainFile: string;
  private chainAt = Number.NEGATIVE_INFINITY;
  private chainTimer: NodeJS.Timeout | undefined;
  /** Per side file: its failures, told at once, then at most every 10 s. */
  private readonly sideFailures = new Map<string, RepeatLimit>();
  /** The latest durable payload (its hash goes into receipts.head when that is written). */
  private durablePayload: string | Uint8Array | undefined;
  /** Whether this process appended receipts (a reader, `log export`, never writes receipts.head). */
  private appendedHere = false;
  /** Its database and -wal, watched; what its connection holds copied out should they go. */
  private readonly files: DatabaseRescue;
  /** Its database and -wal, watched for changes in place (a cut WAL, an older copy written over it). */
  private readonly seal: SqliteSeal;
  /**
   * Committed batches the database file may not hold yet (their WAL frames not yet copied into it
   * by a checkpoint), in seq order: what a -wal cut short loses, kept for its rescue. A batch goes
   * once the WAL index says a checkpoint copied it (trimHeld).
   */
  private held: Held[] = [];
  private heldBytes = 0;
  private readonly heldMax: number;
  /** Sizes of the latest checkpoints signed here (see SIGNED_SIZES). */
  private readonly signedSizes: number[] = [];
  /** Its files found changed in place: the problem, and the copy of what it holds (made, under way, or failed and tried again). */
  private inPlace: { problem: SealProblem; state: 'copying' | 'failed' | 'done'; copying?: Promise<void> } | undefined;
  private readonly notice: (message: string, level?: 'warn' | 'error') => void;
  /** Statements run often (checkpoints, lookups), prepared once. Used synchronously, never left mid-iteration. */
  private readonly stmt: ReturnType<typeof prepareStatements>;

  private constructor(opts: ReceiptLogOptions) {
    const id = identityFromSeed(opts.seed);
    this.providerId = id.providerId;
    this.origin = receiptLogOrigin(id.providerId);
    this.seed = opts.seed;
    this.publicKey = id.publicKey;
    this.checkpointEvery = opts.checkpointEvery ?? 1000;
    this.path = opts.path;
    this.maxBatch = opts.maxBatch ?? 512;
    this.headEveryMs = opts.headEveryMs ?? 1000;
    this.heldMax = opts.heldBytes ?? HELD_BYTES;
    this.notice = (m, level = 'warn') => {
      try {
        opts.onNotice?.(m, level);
      } catch {
        // a notice must not break the log
      }
    };
    this.db = openDb(opts.path);
    let guard: CloseGuard | undefined;
    let seal: SqliteSeal | undefined;
    try {
      this.db.exec(SCHEMA);
      const owner = this.db.prepare<[], { value: string }>("SELECT value FROM meta WHERE key = 'provider'").get();
      if (!owner) this.db.prepare("INSERT INTO meta (key, value) VALUES ('provider', ?)").run(this.providerId);
      else if (owner.value !== this.providerId) {
        throw new ReceiptLogError('log_wrong_key', `${opts.path} is the receipt log of provider ${owner.value}, not of this key (${this.providerId})`);
      }
      // Rebuild the tree and the chain head from disk, proving the stored log is whole on the way.
      // One read transaction for the receipts and the latest checkpoint: a node appending beside
      // this connection (`log export` while it serves) may commit receipts and a checkpoint
      // between two separate reads, and that checkpoint would look like one over another log.
      // The checkpoint kept beside the log is read first: a writer beside this connection keeps it
      // only once its receipts are committed, so the snapshot read next holds at least as many.
      this.headFile = headPath(opts.path);
      const head = readHead(this.headFile, this.providerId);
      this.chainFile = chainHeadPath(opts.path);
      const acknowledged = readChainHead(this.chainFile);
      const read = this.db.transaction(() => {
        const tree = new MerkleTree();
        let last: Uint8Array | undefined;
        for (const r of this.db.prepare<[], BatchRow>('SELECT * FROM receipt_batches ORDER BY first_seq').iterate()) {
          if (r.first_seq !== tree.size) throw new ReceiptLogError('log_corrupt', `receipt log ${opts.path} is missing seq ${tree.size}`);
          let b: SignedBatch;
          try {
            b = rowToBatch(r);
          } catch (e) {
            throw new ReceiptLogError('log_corrupt', `receipt log ${opts.path}: ${(e as Error).message}`);
          }
          for (let i = 0; i < r.count; i++) tree.append(b.leaves.subarray(i * 32, i * 32 + 32));
          last = batchItem(b, r.count - 1).payload;
          this.filterKeys(r);
        }
        const cp = this.db.prepare<[], { size: number; root: Uint8Array }>('SELECT size, root FROM checkpoints ORDER BY size DESC LIMIT 1').get();
        return { tree, last, cp };
      });
      this.stmt = prepareStatements(this.db);
      const { tree, last, cp } = read();
      this.tree = tree;
      this.nextSeq = this.tree.size;
      this.recentFloor = this.tree.size;
      this.lastPayloadHash = last ? sha256Hex(last) : GENESIS_PREV;
      this.durablePayload = last;
      this.lastCheckpointSize = cp?.size ?? 0;
      if (cp && (cp.size > this.tree.size || toHex(this.tree.root(cp.size)) !== toHex(cp.root))) {
        throw new ReceiptLogError('log_corrupt', `receipt log ${opts.path} no longer matches its checkpoint of size ${cp.size}`);
      }
      if (head.kind === 'head') {
        const why = headMismatch(head, this.tree.size, (n) => this.tree.root(n));
        if (why) {
          throw new ReceiptLogError('log_behind', `receipt log ${opts.path} has lost receipts: ${why} (kept in ${this.headFile}). Its database or -wal file was deleted, cut short or replaced by an older copy. Put the missing files back (from a backup, or the -wal file beside its database) and start again. If they are gone for good, start over with a new key (seller-node init): serving on under this key would sign a checkpoint that contradicts one it has signed.`);
        }
        this.headSize = head.size;
      }
      if (acknowledged && acknowledged.size > 0) {
        const lost = acknowledged.size > this.tree.size ? `it holds ${this.tree.size} receipts, but had acknowledged ${acknowledged.size}` : undefined;
        const at = lost ? undefined : this.batchAt(acknowledged.size - 1);
        const other = at && sha256Hex(batchItem(at.batch, at.index).payload) !== acknowledged.lastPayloadSha256 ? `its receipt seq ${acknowledged.size - 1} is not the one it acknowledged` : undefined;
        if (lost || other) {
          throw new ReceiptLogError('log_behind', `receipt log ${opts.path} has lost receipts: ${lost ?? other} (kept in ${this.chainFile}). Its database or -wal file was deleted, cut short or replaced by an older copy, and buyers may hold the receipts it lost. Put the missing files back (from a backup, or the -wal file beside its database) and start again. If they are gone for good, start over with a new key (seller-node init): serving on under this key would sign other receipts under the same seqs.`);
        }
      }
      if (head.kind === 'unreadable') {
        this.notice(`${this.headFile} (the receipt log's latest checkpoint) could not be read (${head.why}); it is written again at the next checkpoint`, 'warn');
      }
      // (after the reads above: SQLite has the WAL in use, its -wal and -shm are there)
      seal = SqliteSeal.attach(opts.path);
      this.seal = seal;
      // Opened while the files are as SQLite left them, and read once: from then on it holds a
      // SHARED lock on the database file until it closes (WAL mode), its WAL open. Not at the
      // stop: a connection that opens a database file found empty deletes its -wal.
      guard = CloseGuard.open(opts.path);
      this.closeGuard = guard;
    } catch (e) {
      guard?.release();
      this.db.close();
      seal?.release(); // (after the connection: see sqlite-seal.ts)
      throw e;
    }
    // A log that signed checkpoints before its checkpoint file existed (an upgrade) gets it now.
    const latest = this.latestCheckpoint();
    if (latest && latest.size > this.headSize) this.keepHead(latest.size, latest.note);
    const threads = opts.threads ?? 2;
    this.signer = new SignerPool({ seed: this.seed, threads });
    this.signLimit = SIGNING_PER_THREAD * Math.max(1, threads);
    this.writer = threads > 0 ? new WriterThread(opts.path, this.seal) : new InProcessWriter(this.db, this.seal);
    if (threads > 0) {
      // Receipts are committed (and fsynced) by the writer thread. This connection only adds
      // checkpoints, which need no fsync of their own: one is signed only over receipts already
      // durable, and signing is deterministic, so a checkpoint lost to a power cut is signed again,
      // byte for byte, by the next one due (or at close, which commits with a full sync). Without
      // this the event loop waited on an fsync every `checkpointEvery` receipts; nor does it copy
      // the WAL back into the database (the writer's connection does that, after a look at the files).
      this.db.pragma('synchronous = NORMAL');
    }
    this.files = new DatabaseRescue(
      this.db,
      opts.path,
      () => `its ${this.tree.size} durable receipts`,
      () => `put ${this.path} back only from a copy that holds all ${this.tree.size} receipts (seq 0 to ${this.tree.size - 1}): buyers hold the ones acknowledged since any older backup, and serving on under this key from one would sign other receipts under the same seqs. Without such a copy, start over with a new key (seller-node init).`,
    );
    const interval = opts.checkpointIntervalMs ?? 10_000;
    // Its files are looked at every 10 s whatever the checkpoint interval (0 turns only checkpoints by time off).
    this.fileTimer = setInterval(() => this.checkFiles(), opts.fileCheckMs ?? FILE_CHECK_MS);
    this.fileTimer.unref();
    if (interval > 0) {
      this.timer = setInterval(() => {
        if (this.tree.size <= this.lastCheckpointSize || this.broken) return;
        try {
          this.checkpointSoftly(this.tree.size, false);
        } catch (e) {
          // (never thrown out of a timer: the log stops, every later append says why, and so does a line now)
          this.stop(e instanceof ReceiptLogError ? e : new ReceiptLogError('log_failed', `receipt log checkpoint failed: ${(e as Error).message}`));
        }
      }, interval);
      this.timer.unref();
    }
  }

  static open(opts: ReceiptLogOptions): ReceiptLog {
    return new ReceiptLog(opts);
  }

  /**
   * Why the log has stopped (a failed write, a stored checkpoint it cannot vouch for), or
   * undefined while it takes receipts. A stopped log refuses every append until the node restarts.
   */
  get failure(): Error | undefined {
    return this.broken;
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
    let text: string;
    try {
      if (body === null || typeof body !== 'object') throw new FieldError('', 'expected an object');
      // Sorted keys make canonicalize one walk plus native JSON.stringify.
      payload = buildReceiptPayload(this.providerId, String(this.nextSeq), this.lastPayloadHash, body);
      validateReceiptPayload(payload);
      const cost = expectedCost(payload);
      if (cost !== BigInt(payload.cost_micro_usd)) throw new FieldError('cost_micro_usd', `is not ${cost}, the cost of the usage at the rates`);
      if (cost > BigInt(payload.hold_micro_usd)) throw new FieldError('cost_micro_usd', 'exceeds hold_micro_usd');
      text = receiptPayloadJson(payload);
    } catch (e) {
      const field = e instanceof FieldError ? e.field : undefined;
      return Promise.reject(new ReceiptLogError('receipt_invalid', `invalid receipt: ${(e as Error).message}`, field));
    }
    // From here on nothing can fail before the seq is taken: the chain advances in call order.
    this.nextSeq++;
    const bytes = this.arena.encode(text);
    this.lastPayloadHash = sha256Hex(bytes);
    return new Promise<AppendedReceipt>((resolve, reject) => {
      this.pending.push({ payload, text, bytes, resolve, reject });
      this.schedulePump();
    });
  }

  /** Hands this tick's appends to pump() once the tick's other appends have joined them. */
  private schedulePump(): void {
    if (this.pumpScheduled) return;
    this.pumpScheduled = true;
    setImmediate(() => {
      this.pumpScheduled = false;
      this.pump();
    });
  }

  /**
   * Hands pending receipts to the signer threads, in batches, while fewer than SIGNING_PER_THREAD
   * a thread are being signed (each thread has its next batch waiting when it finishes one, and
   * receipts that arrive meanwhile gather into the batch after it) and fewer than MAX_UNSETTLED
   * batches are signed or signing and not yet committed: on a slow disk later batches grow
   * larger (one fsync each) instead of more of them queueing for the writer (s25 hR).
   */
  private pump(): void {
    if (this.broken) {
      this.fail(this.pending.splice(0), this.broken);
      this.wakeFlushes();
      return;
    }
    while (this.pending.length && this.signing < this.signLimit && this.unsettled < MAX_UNSETTLED) this.dispatch(this.pending.splice(0, this.maxBatch));
  }

  /** Signs a batch, hands it to the writer in seq order, and settles it after the batch before it. */
  private dispatch(items: Pending[]): void {
    const batch = this.nextBatch++;
    const firstSeq = Number(items[0]!.payload.seq);
    const requestKeys = Float64Array.from(items, (p) => requestKey(p.payload.request_id));
    const inline = items.length <= INLINE_SIGN_MAX;
    this.signing++;
    this.unsettled++;
    const signed = this.signer.sign({ ...packPayloads(items.map((p) => p.bytes)), payloadType: RECEIPT_PAYLOAD_TYPE, keyid: this.providerId }, { inline }).finally(() => {
      this.signing--;
      this.pump();
    });
    // Handed to the writer in seq order, whichever finishes signing first, once the batch before
    // it has committed: the writer's commits leave the database's write lock free between them
    // for the event loop's checkpoint inserts (back to back, a slow fsync kept the lock held and
    // such an insert waited out its busy timeout, stopping the log: s25 hR).
    const committed = Promise.all([signed, this.handedOver]).then(async ([b]) => {
      const mark = await this.writer.commit(batch, firstSeq, requestKeys, b);
      return { b, mark };
    });
    this.handedOver = committed.catch(() => undefined);
    this.settled = this.settled.then(async () => {
      try {
        const { b, mark } = await committed;
        // A log stopped while this batch was committing (its files deleted: the rescued copy was
        // taken before it) acknowledges nothing more.
        if (this.broken) throw this.broken;
        this.settle(items, requestKeys, b, mark);
        // (found at the checkpoint after this commit: the batch is durable, acknowledged and held for the copy)
        if (mark?.problem) this.filesChanged(mark.problem);
      } catch (e) {
        this.fail(items, e);
      }
      this.unsettled--;
      this.pump(); // (the next batches; on a stopped log, what waits to be handed over fails)
      this.wakeFlushes();
    });
  }

  private wakeFlushes(): void {
    for (const wake of this.flushes.splice(0)) wake();
  }

  private settle(items: Pending[], requestKeys: Float64Array, signed: SignedBatch, mark: CommitMark | undefined): void {
    this.commits++;
    const firstSeq = this.tree.size;
    if (mark) this.hold({ firstSeq, signed, requestKeys, gen: mark.gen, frame: mark.frame, bytes: signed.payloads.byteLength + signed.sigs.byteLength + signed.leaves.byteLength + requestKeys.byteLength }, mark);
    this.durablePayload = items[items.length - 1]!.text;
    this.appendedHere = true;
    for (let i = 0; i < items.length; i++) {
      const p = items[i]!;
      this.keyFilter.add(firstSeq, requestKeys[i]!);
      // (the payload bytes went to the writer thread; the text is what the caller gets)
      this.remember(requestKeys[i]!, this.tree.size);
      this.tree.appendFrom(signed.leaves, i * 32);
      p.resolve(new AppendedReceipt(p.payload, p.text, signed.sigs, i, this.providerId));
    }
    this.keepChainHead();
    // A checkpoint at every multiple of checkpointEvery, whatever the batch boundaries.
    for (let at = (Math.floor(this.lastCheckpointSize / this.checkpointEvery) + 1) * this.checkpointEvery; at <= this.tree.size; at += this.checkpointEvery) {
      if (this.checkpointSoftly(at, true) === undefined) break;
    }
  }

  /** Keeps the acknowledged count beside the log: at once, or (written less than 100 ms ago) 100 ms later. */
  private keepChainHead(): void {
    if (performance.now() - this.chainAt >= 100) return this.writeChainHead();
    this.chainTimer ??= setTimeout(() => {
      this.chainTimer = undefined;
      this.writeChainHead();
    }, 100).unref();
  }

  private writeChainHead(): void {
    if (this.chainTimer) clearTimeout(this.chainTimer);
    this.chainTimer = undefined;
    this.chainAt = performance.now();
    try {
      // (only the appending process moves it, and only forward: a reader beside it, `log export`, never writes it)
      if (!this.appendedHere || this.durablePayload === undefined) return;
      writeChainHead(this.chainFile, this.tree.size, sha256Hex(this.durablePayload));
      this.sideFileWritten(this.chainFile);
    } catch (e) {
      this.sideFileFailed(this.chainFile, `${this.chainFile} (how many receipts the log acknowledged) could not be written: ${(e as Error).message}; tried again with the next receipts. Until it is written, receipts lost from the log's files since its last checkpoint would go unnoticed at the next start`);
    }
  }

  /**
   * A side file's write failed: told at once, then at most every 10 s with how many failures were
   * not told (a write is tried with every batch of receipts: a cause that lasts would otherwise
   * give a line a batch, on a disk that may be the full one).
   */
  private sideFileFailed(file: string, message: string): void {
    let failures = this.sideFailures.get(file);
    if (!failures) this.sideFailures.set(file, (failures = new RepeatLimit()));
    const unsaid = failures.take();
    if (unsaid === undefined) return;
    this.notice(unsaid > 0 ? `${message} (${unsaid} more failures of it since the last time this was said)` : message);
  }

  /** A side file written after failures: said once. */
  private sideFileWritten(file: string): void {
    if (this.sideFailures.size === 0 || !this.sideFailures.delete(file)) return;
    this.notice(`${file} is written again`);
  }

  private remember(key: number, seq: number): void {
    // A plain number for the usual single receipt: no array per receipt to allocate and collect.
    key = recentKey(key);
    const had = this.recent.get(key);
    if (had === undefined) this.recent.set(key, seq);
    else {
      // (moved to the newest end: evicting it raises the floor past its newest seq, and every
      // entry older than that has gone before it)
      this.recent.delete(key);
      this.recent.set(key, typeof had === 'number' ? [had, seq] : [...had, seq]);
    }
    if (this.recent.size > RECENT_REQUESTS) {
      const [oldest, evicted] = this.recent.entries().next().value as [number, number | number[]];
      this.recent.delete(oldest);
      this.recentFloor = Math.max(this.recentFloor, (typeof evicted === 'number' ? evicted : evicted[evicted.length - 1]!) + 1); // seqs only grow
    }
  }

  /** A failed batch: its seqs are taken and the chain runs through them, so the log stops rather than fork. */
  private fail(items: Pending[], e: unknown): void {
    // (whatever was thrown: a settlement that threw here would stop every later one)
    const why = e instanceof ReceiptLogError ? e : e instanceof FilesChangedError ? this.filesChanged(e.problem) : new ReceiptLogError('log_failed', `receipt log write failed: ${e instanceof Error ? e.message : String(e)}`);
    const stopped = this.stop(why);
    for (const p of items) p.reject(stopped);
  }

  /**
   * Stops the log, once: every later append is refused with `e`, the writer commits nothing more,
   * and the operator gets one error line (now, or, `say` false, from the copy of its files under
   * way). A log already stopped stays stopped for its first reason.
   */
  private stop(e: ReceiptLogError, say = true): ReceiptLogError {
    if (this.broken) return this.broken;
    this.broken = e;
    if (say) this.notice(`${STOPPED}${e.message}`, 'error');
    void this.writer.halt().catch(() => undefined);
    return e;
  }

  /** Keeps a committed batch until the database file holds it (see held). */
  private hold(h: Held, progress: { backfillGen: string; backfilled: number }): void {
    this.held.push(h);
    this.heldBytes += h.bytes;
    this.trimHeld(progress);
  }

  /**
   * Lets go of held batches the database file holds by `progress` (a reading of the WAL index taken
   * after every held batch's mark: a commit's reply, or the log's own reading), and of the oldest
   * past heldMax.
   */
  private trimHeld(progress: { backfillGen: string; backfilled: number }): void {
    let drop = 0;
    let bytes = this.heldBytes;
    while (drop < this.held.length && (inDatabaseFile(this.held[drop]!, progress) || bytes > this.heldMax)) bytes -= this.held[drop++]!.bytes;
    if (drop === 0) return;
    this.held = drop === this.held.length ? [] : this.held.slice(drop);
    this.heldBytes = bytes;
  }

  /** Waits until every receipt accepted so far is durable (or failed). */
  async flush(): Promise<void> {
    while (this.pending.length || this.unsettled > 0) await new Promise<void>((wake) => this.flushes.push(wake));
  }

  /**
   * Signs a checkpoint over the whole durable log, unless the latest already covers it. The tree
   * only grows and is rebuilt from the stored receipts, so two checkpoints can never disagree.
   * Another connection (`seller-node log export` beside a running node) may have stored this
   * size already: signing is deterministic, so its note is this one, and it is kept. One over
   * another root means the file was written by something else: the log stops (log_corrupt).
   */
  checkpoint(size = this.tree.size): string | undefined {
    return this.signCheckpoint(size, false);
  }

  /**
   * A checkpoint that falls due (every checkpointEvery receipts, or the timer's): a database error
   * storing it (a full disk) is warned about and it is tried again when the next falls due,
   * rather than stopping the log. Its receipts are durable, and the note is deterministic: the
   * next one signs the same bytes (s25 hS: a moment of full disk stopped a node until restarted).
   * A log_corrupt still stops it. Undefined when it was not stored.
   */
  private checkpointSoftly(size: number, soon: boolean): string | undefined {
    const what = `${this.path} (its checkpoints)`;
    try {
      const note = this.signCheckpoint(size, soon);
      this.sideFileWritten(what);
      return note;
    } catch (e) {
      if (e instanceof ReceiptLogError) throw e;
      this.sideFileFailed(what, `the receipt log's checkpoint of size ${size} could not be stored: ${(e as Error).message}; its receipts are durable and still acknowledged, and it is tried again when the next checkpoint falls due`);
      return undefined;
    }
  }

  /** checkpoint(); `soon`: its file beside the log may be written up to a second later (see keepHead). */
  private signCheckpoint(size: number, soon: boolean): string | undefined {
    if (size === 0 || size <= this.lastCheckpointSize || size > this.tree.size) return undefined;
    this.checkFiles();
    if (this.broken) throw this.broken;
    const root = this.tree.root(size);
    const note = signNote(formatCheckpoint({ origin: this.origin, size, rootHash: root }), [{ name: this.origin, seed: this.seed, publicKey: this.publicKey }]);
    if (this.stmt.insertCheckpoint.run(size, root, note, Date.now()).changes === 0) {
      const stored = this.stmt.checkpointOfSize.get(size);
      if (!stored || toHex(stored.root) !== toHex(root)) {
        throw this.stop(new ReceiptLogError('log_corrupt', `receipt log ${this.path}: its stored checkpoint of size ${size} is over another root than its receipts`));
      }
      this.lastCheckpointSize = size;
      this.keepHead(size, stored.note, soon);
      return stored.note;
    }
    this.lastCheckpointSize = size;
    this.signedSizes.push(size);
    if (this.signedSizes.length > SIGNED_SIZES) this.signedSizes.splice(0, this.signedSizes.length - SIGNED_SIZES);
    this.keepHead(size, note, soon);
    return note;
  }

  /**
   * Keeps the latest checkpoint in the file beside the log: at once, or (`soon`, and written less
   * than a second ago) a second after the last write, the latest checkpoint due then. At full rate
   * a checkpoint is signed every few milliseconds, and each write (a read to see whether another
   * process kept a later one, a temporary file, a rename) cost the event loop about a millisecond.
   * The file is defence in depth: receipts.head, the acknowledged count, guards every receipt.
   */
  private keepHead(size: number, note: string, soon = false): void {
    if (size <= this.headSize) return;
    if (soon && performance.now() - this.headAt < this.headEveryMs) {
      this.headDue = { size, note };
      this.headTimer ??= setTimeout(() => this.keepDueHead(), this.headEveryMs - (performance.now() - this.headAt)).unref();
      return;
    }
    this.writeHeadFile(size, note);
  }

  /** Writes the checkpoint waiting for its file, if any. */
  private keepDueHead(): void {
    if (this.headTimer) clearTimeout(this.headTimer);
    this.headTimer = undefined;
    const due = this.headDue;
    this.headDue = undefined;
    if (due) this.keepHead(due.size, due.note);
  }

  /** Writes the checkpoint file (a failure is told, and tried again at the next checkpoint). */
  private writeHeadFile(size: number, note: string): void {
    this.headAt = performance.now();
    if (this.headDue && this.headDue.size <= size) this.headDue = undefined;
    // (another process on this log, `log export` beside a running node, may have kept a later one:
    // the file only ever moves forward)
    const kept = readHead(this.headFile, this.providerId);
    if (kept.kind === 'head' && kept.size >= size) {
      this.headSize = kept.size;
      return;
    }
    try {
      writeHead(this.headFile, note);
      this.headSize = size;
      this.sideFileWritten(this.headFile);
    } catch (e) {
      this.sideFileFailed(this.headFile, `${this.headFile} (the receipt log's latest checkpoint) could not be written: ${(e as Error).message}; tried again at the next checkpoint. Until it is written, a log that loses files would not be refused at the next start`);
    }
  }

  /**
   * Stops the log when its database or -wal file was deleted or replaced while it runs: SQLite
   * would go on writing into the deleted file, and every receipt acknowledged from then on would
   * be lost when the node stops. What the open connection still reads is copied beside the log
   * first. And when one was changed in place (cut short, written over: sqlite-seal.ts): SQLite's
   * next checkpoint would mix what is left into the log; see filesChanged.
   */
  private checkFiles(): void {
    // (Checked also once the log has stopped for another reason, a full disk say: its files may
    // still be deleted under it, and what its connection holds must then be copied out.)
    const found = this.files.check();
    if (found) {
      if (found.kind === 'made') return this.notice(`receipt log: the copy failed before has now been made. ${found.message}`, 'error');
      const message = `receipt log file ${found.file} was deleted or replaced while the node used it; the log takes no more receipts. ${found.copy.message}`;
      // (said here when the log had stopped before for another reason: its files are another matter)
      if (this.stop(new ReceiptLogError('log_failed', message)).message !== message) this.notice(message, 'error');
      return;
    }
    if (this.inPlace) {
      if (this.inPlace.state === 'failed') this.copyOut(); // (tried again: the node still holds what it had)
      return;
    }
    const index = this.seal.index();
    if (index) this.trimHeld({ backfillGen: index.gen, backfilled: index.nBackfill });
    // (The database file only once this log commits receipts: a reader beside a running node, `log
    // export`, cannot tell that node's checkpoint under way from another program's write.)
    const problem = this.seal.check({ db: this.appendedHere });
    if (problem) this.filesChanged(problem);
  }

  /**
   * Its files were changed in place: the log stops (log_files_changed) before SQLite checkpoints
   * or commits into them again, and what the node holds is copied out (copyOut), said in one error
   * line once that is done. Returns the error appends are refused with.
   */
  private filesChanged(problem: SealProblem): ReceiptLogError {
    if (this.inPlace) return this.broken!;
    const what = `receipt log file ${problem.file} ${problem.what} while the node used it: something other than the node changed it (a truncate, an older copy copied over it, an editor), and SQLite's next checkpoint would mix what is left into the log; the log takes no more receipts.`;
    const had = this.broken;
    const e = this.stop(new ReceiptLogError('log_files_changed', `${what} Its receipts are being copied out beside it.`), false);
    this.inPlace = { problem, state: 'copying' };
    this.copyOut(what, had);
    return e;
  }

  /** The copy of what the log holds after its files were changed in place: made once the writer has stopped; said once done (or failed: tried again at each check). */
  private copyOut(what?: string, hadStopped?: ReceiptLogError): void {
    const inPlace = this.inPlace!;
    const lead = what ?? `receipt log file ${inPlace.problem.file} ${inPlace.problem.what} while the node used it.`;
    const retry = inPlace.state === 'failed';
    inPlace.state = 'copying';
    inPlace.copying = (async () => {
      await this.writer.halt().catch(() => undefined); // (no commit or checkpoint runs while the files are read)
      const size = this.tree.size;
      const r = await salvageReceipts({
        db: this.db,
        dbPath: this.path,
        dbFd: this.seal.dbFd,
        providerId: this.providerId,
        size,
        leafAt: (seq) => this.tree.leafHashAt(seq),
        lineOf: (payload, sig) => this.lineOf(payload, sig),
        held: this.held,
        checkpoints: this.signedSizes,
        checkpointAt: (n) => {
          const root = this.tree.root(n);
          return { root, note: signNote(formatCheckpoint({ origin: this.origin, size: n, rootHash: root }), [{ name: this.origin, seed: this.seed, publicKey: this.publicKey }]) };
        },
      }).catch((e: unknown) => ({ ok: false as const, error: (e as Error).message }));
      let outcome: string;
      if (!r.ok) {
        inPlace.state = 'failed';
        if (retry) return; // (said when it first failed; said again once made)
        outcome = `Copying its ${size} durable receipts out failed (${r.error}). The node still holds them and tries again every few seconds while it runs: free space on the data dir's disk if it is full, and do not stop the node before it says the copy is made. If it stops first: put ${this.path} back only from a copy that holds all ${size} receipts (seq 0 to ${size - 1}): buyers hold the ones acknowledged since any older backup, and serving on under this key from one would sign other receipts under the same seqs. Without such a copy, start over with a new key (seller-node init).`;
      } else {
        inPlace.state = 'done';
        const files = `remove ${this.path}-wal and ${this.path}-shm`;
        outcome =
          r.missing.length === 0
            ? `Its ${size} durable receipts (each checked against the log's Merkle tree) were copied to ${r.file}: stop the node, move that file to ${this.path}, ${files}, and start again.`
            : `Of its ${size} durable receipts, ${r.kept} (each checked against the log's Merkle tree) were copied to ${r.file}; seq ${sayRanges(r.missing)} are in no file or memory the node still holds, and buyers hold them signed. Stop the node. If a copy of ${this.path} (with its -wal) holding all ${size} receipts exists, put it back, ${files}, and start again; if not, keep ${r.file} for the audit and start over with a new key (seller-node init): serving on under this key without them would sign other receipts under their seqs.`;
        if (retry) {
          if (hadStopped === undefined && this.broken?.code === 'log_files_changed') this.broken.message = `${lead} ${outcome}`; // (what /healthz says from now on)
          return this.notice(`receipt log: the copy failed before has now been made. ${outcome}`, 'error');
        }
      }
      const message = `${lead} ${outcome}`;
      if (hadStopped === undefined && this.broken?.code === 'log_files_changed') {
        this.broken.message = message;
        this.notice(`${STOPPED}${message}`, 'error');
      } else this.notice(message, 'error'); // (the log had stopped before, for another reason, said then)
    })();
  }

  /** The latest stored checkpoint over receipts this connection has read. */
  latestCheckpoint(): StoredCheckpoint | undefined {
    const r = this.stmt.latestCheckpoint.get(this.tree.size);
    return r && { size: r.size, note: r.note, createdAt: r.created_at };
  }

  /** The stored checkpoint of exactly this size, if this connection has read that many receipts. */
  checkpointAt(size: number): StoredCheckpoint | undefined {
    const r = size <= this.tree.size ? this.stmt.checkpointOfSize.get(size) : undefined;
    return r && { size, note: r.note, createdAt: r.created_at };
  }

  /** Every stored checkpoint over receipts this connection has read (another may be ahead of it), by size. */
  checkpoints(): StoredCheckpoint[] {
    return this.db
      .prepare<[number], { size: number; note: string; created_at: number }>('SELECT size, note, created_at FROM checkpoints WHERE size <= ? ORDER BY size')
      .all(this.tree.size)
      .map((r) => ({ size: r.size, note: r.note, createdAt: r.created_at }));
  }

  private lineOf(payload: Uint8Array, sig: Uint8Array): string {
    return envelopeLine(toBase64(payload), RECEIPT_PAYLOAD_TYPE, this.providerId, toBase64(sig));
  }

  private batchAt(seq: number): { batch: SignedBatch; index: number } | undefined {
    const r = this.stmt.batchAt.get(seq);
    if (!r || seq >= r.first_seq + r.count) return undefined;
    return { batch: rowToBatch(r), index: seq - r.first_seq };
  }

  /** The envelope line of a durable receipt, by seq. */
  lineBySeq(seq: number): string | undefined {
    if (!Number.isSafeInteger(seq) || seq < 0 || seq >= this.tree.size) return undefined;
    const at = this.batchAt(seq);
    if (!at) return undefined;
    const { payload, sig } = batchItem(at.batch, at.index);
    return this.lineOf(payload, sig);
  }

  /** Durable receipts for a request id (a retried or hedged request may have more than one). */
  byRequestId(requestId: string): { seq: number; line: string }[] {
    const out: { seq: number; line: string }[] = [];
    const key = requestKey(requestId);
    const got = this.recent.get(recentKey(key));
    const seqs = (got === undefined ? [] : typeof got === 'number' ? [got] : got).filter((s) => s >= this.recentFloor);
    for (const [from, to] of this.keyFilter.candidates(key, this.recentFloor)) {
      for (const r of this.stmt.requestKeysIn.all(from, to)) {
        const keys = rowRequestKeys(r);
        for (let i = 0; i < r.count; i++) if (keys[i] === key && r.first_seq + i < this.recentFloor) seqs.push(r.first_seq + i);
      }
    }
    seqs.sort((a, b) => a - b);
    for (const seq of seqs) {
      const at = this.batchAt(seq);
      if (!at) continue;
      const { payload, sig } = batchItem(at.batch, at.index);
      if ((JSON.parse(Buffer.from(payload).toString('utf8')) as ReceiptPayload).request_id === requestId) out.push({ seq, line: this.lineOf(payload, sig) });
    }
    return out;
  }

  /** Adds a stored batch row's request keys to the filter (all of its segment, if they cannot be read). */
  private filterKeys(r: { first_seq: number; count: number; request_keys: Uint8Array }): void {
    let keys: Float64Array;
    try {
      keys = rowRequestKeys(r);
    } catch {
      this.keyFilter.addAll(r.first_seq);
      return;
    }
    for (let i = 0; i < r.count; i++) this.keyFilter.add(r.first_seq, keys[i]!);
  }

  /** Every durable envelope line in seq order, streamed from disk. */
  *lines(): Generator<string> {
    const size = this.tree.size;
    for (const r of this.db.prepare<[number], BatchRow>('SELECT * FROM receipt_batches WHERE first_seq < ? ORDER BY first_seq').iterate(size)) {
      const b = rowToBatch(r);
      for (let i = 0; i < r.count && r.first_seq + i < size; i++) {
        const { payload, sig } = batchItem(b, i);
        yield this.lineOf(payload, sig);
      }
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
    if (this.fileTimer) clearInterval(this.fileTimer);
    // (Whatever fails on the way, the threads end and the connections and the seal are released.)
    try {
      try {
        await this.flush();
        if (this.appendedHere) this.writeChainHead();
        this.keepDueHead();
      } finally {
        try {
          await this.signer.close();
        } finally {
          await this.writer.close();
        }
      }
      this.db.pragma('synchronous = FULL'); // the final checkpoint is durable when close() resolves
      this.checkFiles();
      await this.inPlace?.copying; // (the copy of its files reads this connection: made before it closes)
      if (!this.broken) this.checkpoint();
    } finally {
      try {
        // (the guard closed first normally, so that the close makes its final checkpoint; last once
        // the files were changed in place, so that nothing is checkpointed into them: close-guard.ts)
        this.closeGuard.closeWith(this.db, this.inPlace !== undefined);
      } finally {
        this.seal.release();
      }
    }
  }
}
