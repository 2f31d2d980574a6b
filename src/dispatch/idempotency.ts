// Idempotent retries: a request that carries an Idempotency-Key is answered once. A retry with the
// same key (from the same account, for the same body) gets the recorded response and receipt
// again, and is not billed again; the same key with another body is refused; a retry while the
// first is still running is refused rather than run twice. Records live on disk, so a restart
// does not turn a retry into a second charge.
import type Database from 'better-sqlite3';

export interface RecordedResponse {
  status: number;
  headers: Record<string, string>;
  body: Uint8Array;
  trailer: Record<string, unknown>;
}

const SCHEMA = `CREATE TABLE IF NOT EXISTS idempotency (
  account TEXT NOT NULL, key TEXT NOT NULL, request_sha256 TEXT NOT NULL,
  status INTEGER NOT NULL, headers TEXT NOT NULL, body BLOB NOT NULL, trailer TEXT NOT NULL, created_at INTEGER NOT NULL,
  PRIMARY KEY (account, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency_running (
  account TEXT NOT NULL, key TEXT NOT NULL, request_sha256 TEXT NOT NULL, request_id TEXT NOT NULL, started_at INTEGER NOT NULL,
  PRIMARY KEY (account, key)) WITHOUT ROWID`;

export type Lookup =
  | { kind: 'new' }
  | { kind: 'replay'; response: RecordedResponse }
  | { kind: 'conflict'; code: 'idempotency_key_reused' | 'idempotency_in_progress'; message: string }
  /**
   * A request under this key ran and ended without its response recorded or its mark cleared: the
   * node died while it ran (a clean stop lets runs finish), or the write of its record failed. Its
   * receipt, if it has one, is in the log under `requestId`; its response is not. The caller
   * decides (abandonInterrupted() to run the request again).
   */
  | { kind: 'interrupted'; requestId: string };

export class IdempotencyStore {
  private readonly get: Database.Statement<[string, string], { request_sha256: string; status: number; headers: string; body: Uint8Array; trailer: string }>;
  private readonly put: Database.Statement<[string, string, string, number, string, Uint8Array, string, number]>;
  private readonly prune: Database.Statement<[number]>;
  private readonly running = new Map<string, string>();
  private readonly getRunning: Database.Statement<[string, string], { request_sha256: string; request_id: string }>;
  private readonly putRunning: Database.Statement<[string, string, string, string, number]>;
  private readonly delRunning: Database.Statement<[string, string]>;
  private readonly pruneRunning: Database.Statement<[number]>;
  private readonly db: Database.Database;
  /** Forgotten answers may still be in the WAL (its truncation was kept from running by a reader). */
  private walHoldsForgotten = false;

  constructor(db: Database.Database) {
    this.db = db;
    db.exec(SCHEMA);
    this.getRunning = db.prepare('SELECT request_sha256, request_id FROM idempotency_running WHERE account = ? AND key = ?');
    this.putRunning = db.prepare('INSERT OR REPLACE INTO idempotency_running (account, key, request_sha256, request_id, started_at) VALUES (?, ?, ?, ?, ?)');
    this.delRunning = db.prepare('DELETE FROM idempotency_running WHERE account = ? AND key = ?');
    this.pruneRunning = db.prepare('DELETE FROM idempotency_running WHERE started_at < ?');
    this.get = db.prepare('SELECT request_sha256, status, headers, body, trailer FROM idempotency WHERE account = ? AND key = ?');
    this.put = db.prepare('INSERT OR REPLACE INTO idempotency (account, key, request_sha256, status, headers, body, trailer, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)');
    this.prune = db.prepare('DELETE FROM idempotency WHERE created_at < ?');
  }

  /**
   * What to do with a request carrying this key; 'new' also marks it running until finish(), in
   * memory and on disk (with `requestId`, the request's own id): a node that dies while it runs
   * finds the mark after its restart ('interrupted').
   */
  begin(account: string, key: string, requestSha256: string, requestId = '', now = Date.now()): Lookup {
    const id = `${account}\u0000${key}`;
    const reused = { kind: 'conflict', code: 'idempotency_key_reused', message: 'this Idempotency-Key was used for a different request' } as const;
    const row = this.get.get(account, key);
    if (row) {
      if (row.request_sha256 !== requestSha256) return reused;
      return { kind: 'replay', response: { status: row.status, headers: JSON.parse(row.headers) as Record<string, string>, body: new Uint8Array(row.body), trailer: JSON.parse(row.trailer) as Record<string, unknown> } };
    }
    if (this.running.has(id)) return { kind: 'conflict', code: 'idempotency_in_progress', message: 'a request with this Idempotency-Key is still running' };
    const orphan = this.getRunning.get(account, key);
    if (orphan) return orphan.request_sha256 !== requestSha256 ? reused : { kind: 'interrupted', requestId: orphan.request_id };
    this.putRunning.run(account, key, requestSha256, requestId, now);
    this.running.set(id, requestSha256);
    return { kind: 'new' };
  }

  /**
   * Forgets the mark of a request under this key that a crash interrupted, and begins the retry
   * (what begin() answers once no such mark is left).
   */
  abandonInterrupted(account: string, key: string, requestSha256: string, requestId = '', now = Date.now()): Exclude<Lookup, { kind: 'interrupted' }> {
    if (!this.running.has(`${account}\u0000${key}`)) this.delRunning.run(account, key);
    return this.begin(account, key, requestSha256, requestId, now) as Exclude<Lookup, { kind: 'interrupted' }>;
  }

  /** Records the response of a request begun with begin(); `response` undefined records nothing. Either way the request no longer runs. */
  finish(account: string, key: string, response: RecordedResponse | undefined, now = Date.now()): void {
    const id = `${account}\u0000${key}`;
    const sha = this.running.get(id);
    this.running.delete(id);
    if (sha === undefined) return;
    this.db.transaction(() => {
      if (response) this.put.run(account, key, sha, response.status, JSON.stringify(response.headers), response.body, JSON.stringify(response.trailer), now);
      this.delRunning.run(account, key);
    })();
  }

  /**
   * Forgets records (and marks of interrupted runs) older than `maxAgeMs` (default 24 h). The
   * recorded answers are buyers' output text: with state.db's secure_delete their bytes are zeroed
   * in the database, and the WAL, which still holds copies of those pages, is checkpointed and
   * truncated. Never waiting: a reader in the way (a backup tool) leaves that to the next pruning.
   */
  forgetOlderThan(maxAgeMs = 86_400_000, now = Date.now()): number {
    this.pruneRunning.run(now - maxAgeMs);
    const forgotten = this.prune.run(now - maxAgeMs).changes;
    if (forgotten > 0) this.walHoldsForgotten = true;
    if (this.walHoldsForgotten) this.walHoldsForgotten = !this.truncateWal();
    return forgotten;
  }

  /** Checkpoints and truncates the WAL without waiting for readers; whether it was done. */
  private truncateWal(): boolean {
    if (this.db.pragma('journal_mode', { simple: true }) !== 'wal') return true;
    const timeout = this.db.pragma('busy_timeout', { simple: true }) as number;
    this.db.pragma('busy_timeout = 0');
    try {
      const [r] = this.db.pragma('wal_checkpoint(TRUNCATE)') as { busy: number }[];
      return r?.busy === 0;
    } catch {
      return false; // (SQLITE_BUSY: tried again at the next pruning)
    } finally {
      this.db.pragma(`busy_timeout = ${Number(timeout) || 0}`);
    }
  }
}
