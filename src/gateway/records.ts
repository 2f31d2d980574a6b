// The gateway's settled request records (GET /v1/requests/{id}): one per request it took a ticket
// for. A record is `in_progress` until the request ends; then it holds the verified receipt, its
// usage and cost, and whether the marketplace accepted the receipt.
//
// Kept in memory (the most recent `limit`), and, with a file, written through to SQLite (WAL) at
// every change, so records outlive the gateway: after a restart every record is still answered,
// and one left `in_progress` by a gateway that stopped mid-request says `interrupted`.
import path from 'node:path';
import { fsProblem, isErrnoError } from '../fs-problem.ts';
import { createPrivate } from '../sqlite-file.ts';
import Database from 'better-sqlite3';
import { formatUsd } from '../../attestation/money.ts';
import type { ReceiptPayload } from '../../attestation/receipt.ts';
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import type { ReceiptExpectation } from './receipt-check.ts';
import { IDEMPOTENT_KEPT_MS, type AnsweredAttempt } from './tickets.ts';
import { sha256Hex } from '../../attestation/hash.ts';

export type RecordStatus =
  /** The request is running. */
  | 'in_progress'
  /** Receipt statuses. */
  | 'completed'
  | 'cancelled'
  | 'failed'
  /** Refused (by the marketplace or the node) before any work: no receipt, nothing charged. */
  | 'refused'
  /** The buyer left before any work was done (and the node wrote no receipt). */
  | 'abandoned'
  /** The provider's answer or receipt did not verify; its receipt was not settled. */
  | 'bad_provider_response'
  /** The gateway stopped while the request ran; the provider's log holds its receipt, if any. */
  | 'interrupted';

export interface RequestRecord {
  request_id: string;
  status: RecordStatus;
  endpoint: string;
  model: string;
  provider: string | null;
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
  /** USD, six decimals, exact. */
  cost: string | null;
  cost_micro_usd: string | null;
  /** The verified receipt envelope. */
  receipt: DsseEnvelope | null;
  /** Whether the marketplace accepted the receipt (POST /v1/receipts). */
  settled: boolean;
  settlement_error?: { code: string; message: string };
  error?: { code: string; message: string };
  /**
   * A hedged request's other attempt (X-Service-Hedge): both ran, and each bills its own work in
   * its own record; the request's whole charge is the two records' costs together.
   */
  hedged_with?: string;
  created_at: number;
  finished_at: number | null;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS request_records (request_id TEXT PRIMARY KEY, record TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS request_aliases (request_id TEXT PRIMARY KEY, target TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotent_providers (key TEXT PRIMARY KEY, provider TEXT NOT NULL, at INTEGER NOT NULL, request_id TEXT) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS unsettled (request_id TEXT PRIMARY KEY, job TEXT NOT NULL) WITHOUT ROWID;
`;

/**
 * A paid request whose receipt may exist and is not yet settled with the marketplace: what the
 * reconciler needs to find it at the node again and check it (reconcile.ts).
 */
export interface UnsettledJob {
  request_id: string;
  provider: string;
  /** The provider's multiaddrs as the ticket gave them. */
  target: string[];
  /** What the receipt must say (the ticket's ids, hold, price version and rates). */
  exp: ReceiptExpectation;
  created_at: number;
  /** When to look next (epoch ms), and how many looks found nothing to settle yet. */
  next_at: number;
  tries: number;
  /** The request's Idempotency-Key as Ticketing keeps it, when it had one: its receipt, when it did not complete, frees it (Settlements.settle). */
  idem_key?: string;
  /**
   * A whole-body answer that broke off before its trailer: the buyer got a 502 and none of it, so
   * a receipt found for it is recorded, never settled (RequestRecords.withhold).
   */
  undelivered?: true;
  /**
   * A stream the provider broke off: the SHA-256 of the bytes the gateway received of it. A
   * receipt found for it that bills other bytes (sent, but lost on the way: a connection that died
   * with data in flight) is recorded, never settled (s24 hD: a gateway paused 8 s, its connection
   * dropped, billed 1,398 tokens for 382 received).
   */
  received_sha256?: string;
}

/** The most unsettled jobs kept; beyond it the oldest is given up (reported). */
const MAX_JOBS = 100_000;

/** Idempotency-Key rows written between two prunings of the ones older than IDEMPOTENT_KEPT_MS (tickets.ts). */
const IDEMPOTENT_PRUNE_EVERY = 1000;

/** How long the records file keeps a request's record by default (GET /v1/requests/{id} after that: 404). */
export const RECORDS_KEPT_MS = 7 * 24 * 60 * 60 * 1000;
/** Record writes between two prunings of the file. */
const RECORDS_PRUNE_EVERY = 1000;

/** What failed: a read or a write of the records file, or a failed write given up (too many waiting). */
export type FileOp = 'read' | 'write' | 'drop';

/** Failed writes retried after each successful one (see RequestRecords.unsaved). */
const RETRIES_PER_WRITE = 16;

export class RequestRecords {
  private readonly map = new Map<string, RequestRecord>();
  private readonly limit: number;
  private readonly db: Database.Database | undefined;
  private readonly put: Database.Statement<[string, string, number]> | undefined;
  private readonly pruneRecords: Database.Statement<[number]> | undefined;
  private readonly pruneAliases: Database.Statement<[]> | undefined;
  /** How long the file keeps a record (by its created_at). */
  private readonly keepMs: number;
  private recordWrites = 0;
  private readonly putAlias: Database.Statement<[string, string]> | undefined;
  private readonly load: Database.Statement<[{ id: string }], { record: string }> | undefined;
  private readonly putIdempotent: Database.Statement<[string, string, number, string]> | undefined;
  // (putJob, delJob: see watch())
  private readonly getIdempotent: Database.Statement<[string, number], { provider: string; request_id: string | null }> | undefined;
  private readonly pruneIdempotent: Database.Statement<[number]> | undefined;
  private readonly delIdempotent: Database.Statement<[string, string]> | undefined;
  private idempotentWrites = 0;
  private readonly jobs = new Map<string, UnsettledJob>();
  private readonly putJob: Database.Statement<[string, string]> | undefined;
  private readonly delJob: Database.Statement<[string]> | undefined;

  private readonly onFileError: ((e: Error, requestId: string, op: FileOp) => void) | undefined;
  private failures = 0;
  private dropped = 0;
  /**
   * Id → the write of its latest change, which failed: the record is kept in memory (not evicted)
   * and the write is tried again after a later write succeeds. At most `limit` are kept; beyond
   * that the oldest is given up (counted in `unsavedDropped`), so a disk that stays broken costs
   * bounded memory.
   */
  private readonly unsaved = new Map<string, () => unknown>();

  /**
   * Told of money as it moves: a verified receipt recorded (taken by the market or not), and a
   * request given up with nothing more to settle (the API keys' spend limits: key-spend.ts).
   */
  onMoney: { settled(id: string, costMicroUsd: bigint, ok: boolean): void; dropped(id: string): void } | undefined;

  /**
   * `file`: an SQLite file that keeps every record across restarts (created if missing).
   * `onFileError`: told of every read or write of the file that fails (disk full, I/O error). The
   * record still changes in memory, and one whose latest change could not be written stays there
   * (not evicted) until that write succeeds on a retry (after any later write succeeds) or a
   * later write of it does, up to `limit` such records: the file is the gateway's own bookkeeping,
   * and a buyer's answer (whose receipt the node and the marketplace hold) must never turn into an
   * error because of it, nor a finished request read as still running.
   */
  constructor(limit = 10_000, file?: string, onFileError?: (e: Error, requestId: string, op: FileOp) => void, keepMs = RECORDS_KEPT_MS) {
    this.limit = limit;
    this.onFileError = onFileError;
    this.keepMs = keepMs;
    if (file === undefined) return;
    let db: Database.Database | undefined;
    try {
      // One gateway a file: the exclusive lock, taken now, refuses a second opener at once.
      createPrivate(file); // (buyers' Idempotency-Keys and receipts: this user's only)
      db = new Database(file, { timeout: 0 });
      db.pragma('locking_mode = EXCLUSIVE');
      db.pragma('journal_mode = WAL');
      db.pragma('synchronous = NORMAL');
      db.exec('BEGIN EXCLUSIVE; COMMIT');
      db.exec(SCHEMA);
      // Each row's start time, for pruning by age without reading every record (files written
      // before it had this column get it, filled from their records).
      const columns = db.prepare<[], { name: string }>('PRAGMA table_info(request_records)').all().map((c) => c.name);
      if (!columns.includes('created_at')) {
        db.exec(`ALTER TABLE request_records ADD COLUMN created_at INTEGER; UPDATE request_records SET created_at = json_extract(record, '$.created_at')`);
      }
      db.exec('CREATE INDEX IF NOT EXISTS request_records_created ON request_records (created_at)');
      // The attempt each idempotency key was answered by (files written before: none, never forgotten).
      if (!db.prepare<[], { name: string }>('PRAGMA table_info(idempotent_providers)').all().some((c) => c.name === 'request_id')) {
        db.exec('ALTER TABLE idempotent_providers ADD COLUMN request_id TEXT');
      }
      // Requests that were running when the gateway last stopped will never end here.
      const now = Date.now();
      const stale = db.prepare<[], { request_id: string; record: string }>(`SELECT request_id, record FROM request_records WHERE json_extract(record, '$.status') = 'in_progress'`).all();
      const update = db.prepare<[string, string]>('UPDATE request_records SET record = ? WHERE request_id = ?');
      db.transaction(() => {
        for (const row of stale) {
          const rec = JSON.parse(row.record) as RequestRecord;
          rec.status = 'interrupted';
          rec.error = { code: 'gateway_interrupted', message: "the gateway stopped before this request ended; the provider's log holds its receipt if it did any work" };
          rec.finished_at = now;
          update.run(JSON.stringify(rec), row.request_id);
        }
      })();
    } catch (e) {
      db?.close();
      const code = (e as { code?: unknown }).code;
      const why = code === 'ENOENT' ? `its folder ${path.dirname(path.resolve(file))} does not exist` : code === 'SQLITE_BUSY' ? 'another gateway uses this file (one gateway a records file)' : isErrnoError(e) ? fsProblem(e) : (e as Error).message;
      throw new Error(`request records ${file}: ${why}`);
    }
    this.db = db;
    this.put = db.prepare('INSERT OR REPLACE INTO request_records (request_id, record, created_at) VALUES (?, ?, ?)');
    this.pruneRecords = db.prepare('DELETE FROM request_records WHERE created_at < ?');
    this.pruneAliases = db.prepare('DELETE FROM request_aliases WHERE NOT EXISTS (SELECT 1 FROM request_records r WHERE r.request_id = request_aliases.target)');
    this.putAlias = db.prepare('INSERT OR REPLACE INTO request_aliases (request_id, target) VALUES (?, ?)');
    this.load = db.prepare(
      'SELECT record FROM request_records WHERE request_id = coalesce((SELECT target FROM request_aliases WHERE request_id = @id), @id)',
    );
    this.putIdempotent = db.prepare('INSERT OR REPLACE INTO idempotent_providers (key, provider, at, request_id) VALUES (?, ?, ?, ?)');
    this.getIdempotent = db.prepare('SELECT provider, request_id FROM idempotent_providers WHERE key = ? AND at >= ?');
    this.pruneIdempotent = db.prepare('DELETE FROM idempotent_providers WHERE at < ?');
    this.delIdempotent = db.prepare('DELETE FROM idempotent_providers WHERE key = ? AND request_id = ?');
    this.pruneIdempotent.run(Date.now() - IDEMPOTENT_KEPT_MS);
    this.prune();
    this.putJob = db.prepare('INSERT OR REPLACE INTO unsettled (request_id, job) VALUES (?, ?)');
    this.delJob = db.prepare('DELETE FROM unsettled WHERE request_id = ?');
    // Unsettled requests of the last run are looked at again at once (interrupted ones included).
    const now = Date.now();
    for (const row of db.prepare<[], { job: string }>('SELECT job FROM unsettled').all()) {
      const job = JSON.parse(row.job) as UnsettledJob;
      this.jobs.set(job.request_id, { ...job, next_at: Math.min(job.next_at, now) });
    }
  }

  /** Keeps `job` (a request whose receipt may need settling) until dropJob(). */
  watch(job: UnsettledJob): void {
    this.jobs.delete(job.request_id);
    this.jobs.set(job.request_id, job);
    // (refused writes are retried like records': a job the file lacks is a settlement a restart would lose, s25 hS)
    if (this.putJob) this.stored(jobLabel(job.request_id), () => this.putJob!.run(job.request_id, JSON.stringify(job)));
    if (this.jobs.size > MAX_JOBS) {
      const oldest = this.jobs.keys().next().value!;
      this.dropJob(oldest);
      this.onFileError?.(new Error(`more than ${MAX_JOBS} requests wait to be settled: the oldest is given up`), oldest, 'drop');
    }
  }

  /** The jobs due by `now`, oldest first. */
  dueJobs(now: number): UnsettledJob[] {
    return [...this.jobs.values()].filter((job) => job.next_at <= now);
  }

  hasJob(id: string): boolean {
    return this.jobs.has(id);
  }

  /** `id`'s unsettled job, while it is watched. */
  job(id: string): UnsettledJob | undefined {
    return this.jobs.get(id);
  }

  /** Marks `id`'s job undelivered (see UnsettledJob), in the file too. */
  markUndelivered(id: string): void {
    const job = this.jobs.get(id);
    if (job && !job.undelivered) this.watch({ ...job, undelivered: true });
  }

  /** Takes the mark off: the answer reached the buyer after all (an idempotent retry relayed it whole). */
  markDelivered(id: string): void {
    const job = this.jobs.get(id);
    if (!job?.undelivered) return;
    const { undelivered: _, ...rest } = job;
    this.watch(rest);
  }

  /** Marks `id`'s job with what the gateway received of its broken-off stream (see UnsettledJob), in the file too. */
  markReceived(id: string, sha256: string): void {
    const job = this.jobs.get(id);
    if (job && job.received_sha256 !== sha256) this.watch({ ...job, received_sha256: sha256 });
  }

  /**
   * Why a verified receipt for `id` must not be settled: its answer did not reach the buyer as it
   * bills (the job's marks, see UnsettledJob); undefined when it did.
   */
  notDelivered(id: string, receipt: ReceiptPayload): string | undefined {
    const job = this.jobs.get(id);
    if (job?.undelivered) return "the provider's answer broke off before the gateway had it whole, and the buyer got none of it";
    if (job?.received_sha256 !== undefined && receipt.response_sha256 !== job.received_sha256) {
      return "the provider's stream broke off, and its receipt bills bytes the gateway never received (its response_sha256 is not that of what was relayed)";
    }
    return undefined;
  }

  isUndelivered(id: string): boolean {
    return this.jobs.get(id)?.undelivered === true;
  }

  /** The records file's database (undefined without one), for bookkeeping kept beside the records. */
  get database(): Database.Database | undefined {
    return this.db;
  }

  /** Whether records (and unsettled jobs) are kept in a file, across restarts. */
  get persistent(): boolean {
    return this.db !== undefined;
  }

  /** How many requests wait to be settled. */
  get unsettledCount(): number {
    return this.jobs.size;
  }

  dropJob(id: string): void {
    if (!this.jobs.delete(id)) return;
    if (this.delJob) this.stored(jobLabel(id), () => this.delJob!.run(id));
    this.onMoney?.dropped(id);
  }

  /**
   * The provider that answered under an idempotency key (Ticketing's), as the file keeps it: so a
   * retry after a gateway restart still goes back there. Undefined without a file, past 24 h, or
   * when the file cannot be read (reported).
   */
  idempotentProvider(key: string): AnsweredAttempt | undefined {
    let row: { provider: string; request_id: string | null } | undefined;
    if (this.getIdempotent) this.guard(keyLabel(key), 'read', () => (row = this.getIdempotent!.get(key, Date.now() - IDEMPOTENT_KEPT_MS)));
    return row ? { provider: row.provider, requestId: row.request_id } : undefined;
  }

  /** Keeps the attempt (provider, request id) that answered under an idempotency key in the file (nothing without one). */
  rememberIdempotent(key: string, provider: string, requestId: string): void {
    if (!this.putIdempotent) return;
    const now = Date.now();
    // (retried like records': without it, a retry after a restart may run on another provider, billed twice: s25 hS)
    this.stored(keyLabel(key), () => this.putIdempotent!.run(key, provider, now, requestId));
    if (++this.idempotentWrites % IDEMPOTENT_PRUNE_EVERY === 0) this.guard(keyLabel(key), 'write', () => this.pruneIdempotent!.run(now - IDEMPOTENT_KEPT_MS));
  }

  /** Takes the key out of the file if the attempt kept under it is still request `requestId` (nothing without a file). */
  forgetIdempotent(key: string, requestId: string): void {
    if (!this.delIdempotent) return;
    this.stored(keyLabel(key), () => this.delIdempotent!.run(key, requestId));
  }

  /** Whether the record is held in memory (not only in the file). */
  inMemory(id: string): boolean {
    return this.map.has(id);
  }

  /** The record, from memory or the file. A file that cannot be read is reported and counts as a miss. */
  get(id: string): RequestRecord | undefined {
    const hit = this.map.get(id);
    if (hit || !this.load) return hit;
    let row: { record: string } | undefined;
    this.guard(id, 'read', () => (row = this.load!.get({ id })));
    return row ? (JSON.parse(row.record) as RequestRecord) : undefined;
  }

  /** The record to change: from memory, or (evicted from memory) from the file, then kept in memory. */
  private live(id: string): RequestRecord | undefined {
    const hit = this.map.get(id);
    if (hit || !this.load) return hit;
    // (A file that cannot be read loses the change to this evicted record, never to the request.)
    const rec = this.get(id);
    if (rec) {
      this.map.set(rec.request_id, rec);
      this.evict();
    }
    return rec;
  }

  get size(): number {
    return this.map.size;
  }

  /** Closes the file after one last try at the writes it refused; any still refused are reported given up. */
  close(): void {
    if (this.db?.open) {
      for (const [id, write] of this.unsaved) if (this.guard(id, 'write', write)) this.unsaved.delete(id);
      for (const id of this.unsaved.keys()) {
        this.dropped++;
        this.onFileError?.(new Error('the records file refused this change until the gateway closed'), id, 'drop');
      }
      this.unsaved.clear();
    }
    this.db?.close();
  }

  /** Reads and writes of the records file that failed since start (the records stayed in memory). */
  get fileErrors(): number {
    return this.failures;
  }

  private save(rec: RequestRecord): void {
    this.stored(rec.request_id, () => this.put?.run(rec.request_id, JSON.stringify(rec), rec.created_at));
    if (++this.recordWrites % RECORDS_PRUNE_EVERY === 0) this.prune();
  }

  /**
   * Deletes the records (and aliases to them) older than the file keeps them; how many went. Run
   * at open and every RECORDS_PRUNE_EVERY writes: the file stays as large as that period's traffic.
   */
  prune(now = Date.now()): number {
    if (!this.pruneRecords) return 0;
    let n = 0;
    this.guard('', 'write', () => {
      n = this.pruneRecords!.run(now - this.keepMs).changes;
      if (n > 0) this.pruneAliases!.run();
    });
    return n;
  }

  /** Records whose latest change was given up unwritten because too many were waiting (see unsaved). */
  get unsavedDropped(): number {
    return this.dropped;
  }

  /** A write of `id`'s row: on failure `id` is pinned in memory and the write retried later (see unsaved). */
  private stored(id: string, run: () => unknown): void {
    this.unsaved.delete(id); // this write supersedes a failed one
    if (!this.guard(id, 'write', run)) {
      this.unsaved.set(id, run);
      if (this.unsaved.size > this.limit) {
        const oldest = this.unsaved.keys().next().value!;
        this.unsaved.delete(oldest);
        this.dropped++;
        this.onFileError?.(new Error(`more than ${this.limit} records wait for the records file: the oldest change is given up`), oldest, 'drop');
      }
      return;
    }
    // The file takes writes again: retry a few of the ones it refused, oldest first.
    let n = 0;
    for (const [pinned, write] of this.unsaved) {
      if (n++ >= RETRIES_PER_WRITE || !this.guard(pinned, 'write', write)) break;
      this.unsaved.delete(pinned);
    }
  }

  private guard(requestId: string, op: 'read' | 'write', run: () => unknown): boolean {
    try {
      run();
      return true;
    } catch (e) {
      this.failures++;
      this.onFileError?.(e as Error, requestId, op);
      return false;
    }
  }

  /** Drops the oldest records beyond the limit, except those the file does not have (see unsaved). */
  private evict(): void {
    if (this.map.size <= this.limit) return;
    for (const id of this.map.keys()) {
      if (this.map.size <= this.limit) return;
      if (!this.unsaved.has(id)) this.map.delete(id);
    }
  }

  begin(r: { request_id: string; endpoint: string; model: string; provider: string | null; hedged_with?: string }): RequestRecord {
    const rec: RequestRecord = { ...r, status: 'in_progress', usage: null, cost: null, cost_micro_usd: null, receipt: null, settled: false, created_at: Date.now(), finished_at: null };
    this.save(rec);
    this.map.delete(r.request_id);
    this.map.set(r.request_id, rec);
    this.evict();
    return rec;
  }

  /** The request ended with a verified receipt (also one found later, after an error was recorded: that error goes). */
  settle(id: string, receipt: { payload: ReceiptPayload; envelope: DsseEnvelope }, settlement: { ok: true } | { ok: false; code: string; message: string }): RequestRecord | undefined {
    const p = receipt.payload;
    this.onMoney?.settled(id, BigInt(p.cost_micro_usd), settlement.ok);
    return this.update(id, {
      error: undefined,
      settlement_error: undefined,
      status: p.status,
      provider: p.provider,
      usage: { prompt_tokens: p.usage.input_tokens, completion_tokens: p.usage.output_tokens, total_tokens: p.usage.input_tokens + p.usage.output_tokens },
      cost_micro_usd: p.cost_micro_usd,
      cost: formatUsd(BigInt(p.cost_micro_usd)),
      receipt: receipt.envelope,
      settled: settlement.ok,
      ...(settlement.ok ? {} : { settlement_error: { code: settlement.code, message: settlement.message } }),
      finished_at: Date.now(),
    });
  }

  /**
   * A receipt for an answer the buyer never received (an undelivered job): recorded with the
   * receipt, failed, never settled; the job and its hold go.
   */
  withhold(id: string, receipt: { payload: ReceiptPayload; envelope: DsseEnvelope }, why: string): RequestRecord | undefined {
    const p = receipt.payload;
    const rec = this.update(id, {
      status: 'failed',
      error: { code: 'answer_not_delivered', message: `${why}: its ${p.status} receipt (seq ${p.seq}, ${formatUsd(BigInt(p.cost_micro_usd))} USD) is not settled` },
      provider: p.provider,
      usage: { prompt_tokens: p.usage.input_tokens, completion_tokens: p.usage.output_tokens, total_tokens: p.usage.input_tokens + p.usage.output_tokens },
      receipt: receipt.envelope,
      settled: false,
      finished_at: Date.now(),
    });
    this.dropJob(id);
    return rec;
  }

  /** Writes the changed record through to the file and changes it in memory. */
  private update(id: string, change: Partial<RequestRecord>): RequestRecord | undefined {
    const rec = this.live(id);
    if (!rec) return undefined;
    this.save({ ...rec, ...change });
    return Object.assign(rec, change);
  }

  /** `id` was answered by an earlier request (an idempotent retry): it shows that request's record. */
  alias(id: string, target: string): void {
    const rec = this.live(target);
    if (!rec || id === target) return;
    this.map.delete(id);
    this.map.set(id, rec);
    this.stored(id, () => this.putAlias?.run(id, target));
    this.evict();
  }

  /**
   * The request ended without a receipt the gateway accepts. Refused before any work, its provider
   * never reached, or answered with a receipt that did not verify, it will never have one to
   * settle: its unsettled job goes too.
   */
  fail(id: string, status: Exclude<RecordStatus, 'in_progress' | 'completed' | 'cancelled' | 'failed' | 'interrupted'> | 'failed', error: { code: string; message: string }): RequestRecord | undefined {
    // Nothing to settle: refused before work, no provider reached, or an answer withheld (its receipt never to be charged).
    if (status === 'refused' || status === 'bad_provider_response' || error.code === 'provider_unreachable' || error.code === 'bad_market_response') this.dropJob(id);
    return this.update(id, { status, error, finished_at: Date.now() });
  }

}

/**
 * How a failed read or write about an idempotency key is named in the log: a buyer's
 * Idempotency-Key is theirs (the seal of the node's recorded answer is derived from it), so the log
 * gets a short hash of it, never the key.
 */
/** The label of a request's settlement job in errors and in the retried writes (never a record id). */
function jobLabel(requestId: string): string {
  return `settlement job of ${requestId}`;
}

export function keyLabel(key: string): string {
  return `idempotency-key sha256:${sha256Hex(key).slice(0, 16)}`;
}
