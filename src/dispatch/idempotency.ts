// Idempotent retries: a request that carries an Idempotency-Key is answered once. A retry with the
// same key (from the same account, for the same body) gets the recorded response and receipt
// again, and is not billed again; the same key with another body is refused; a retry while the
// first is still running is refused rather than run twice. Records live on disk, so a restart
// does not turn a retry into a second charge.
import crypto from 'node:crypto';
import type Database from 'better-sqlite3';
import { sha256Hex } from '../../attestation/hash.ts';
import { peekLine } from '../../attestation/signed-payload.ts';

export interface RecordedResponse {
  status: number;
  headers: Record<string, string>;
  body: Uint8Array;
  trailer: Record<string, unknown>;
}

// Recorded answers are buyers' output text, kept 24 h. They are sealed (AES-256-GCM) under a key
// derived from the account and the Idempotency-Key, which only the buyer's retry brings: the file
// holds neither the key nor a readable answer. A record is found by another value derived from
// the same two (HKDF-SHA256, two labels).
const SCHEMA = `CREATE TABLE IF NOT EXISTS idempotency_sealed (
  id TEXT PRIMARY KEY, request_sha256 TEXT NOT NULL, sealed BLOB NOT NULL, created_at INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency_marks (
  id TEXT PRIMARY KEY, request_sha256 TEXT NOT NULL, request_id TEXT NOT NULL, started_at INTEGER NOT NULL) WITHOUT ROWID`;
const HKDF_SALT = 'seller-node idempotency v1';

/** What a record is found by, and the key it is sealed with: both from the account and the Idempotency-Key. */
function recordKeys(account: string, key: string): { id: string; seal: Buffer } {
  // The account's length first: no two (account, key) pairs give the same bytes, whatever they hold.
  const a = Buffer.from(account, 'utf8');
  const length = Buffer.alloc(4);
  length.writeUInt32BE(a.length);
  const ikm = Buffer.concat([length, a, Buffer.from(key, 'utf8')]);
  return {
    id: Buffer.from(crypto.hkdfSync('sha256', ikm, HKDF_SALT, 'record id', 32)).toString('hex'),
    seal: Buffer.from(crypto.hkdfSync('sha256', ikm, HKDF_SALT, 'record seal', 32)),
  };
}

/** nonce (12) ‖ AES-256-GCM(u32 header length ‖ header JSON ‖ body) ‖ tag (16), bound to the record's id. */
function sealResponse(r: RecordedResponse, keys: { id: string; seal: Buffer }): Buffer {
  const header = Buffer.from(JSON.stringify({ status: r.status, headers: r.headers, trailer: r.trailer }), 'utf8');
  const length = Buffer.alloc(4);
  length.writeUInt32BE(header.length);
  const nonce = crypto.randomBytes(12);
  const cipher = crypto.createCipheriv('aes-256-gcm', keys.seal, nonce);
  cipher.setAAD(Buffer.from(keys.id, 'hex'));
  const sealed = Buffer.concat([cipher.update(length), cipher.update(header), cipher.update(r.body), cipher.final()]);
  return Buffer.concat([nonce, sealed, cipher.getAuthTag()]);
}

function openResponse(blob: Uint8Array, keys: { id: string; seal: Buffer }): RecordedResponse {
  const b = Buffer.from(blob.buffer, blob.byteOffset, blob.byteLength);
  if (b.length < 12 + 4 + 16) throw new Error('an idempotency record is damaged (too short)');
  const decipher = crypto.createDecipheriv('aes-256-gcm', keys.seal, b.subarray(0, 12));
  decipher.setAAD(Buffer.from(keys.id, 'hex'));
  decipher.setAuthTag(b.subarray(b.length - 16));
  const plain = Buffer.concat([decipher.update(b.subarray(12, b.length - 16)), decipher.final()]); // (throws if damaged)
  const n = plain.readUInt32BE(0);
  const header = JSON.parse(plain.subarray(4, 4 + n).toString('utf8')) as Omit<RecordedResponse, 'body'>;
  return { status: header.status, headers: header.headers, trailer: header.trailer, body: new Uint8Array(plain.subarray(4 + n)) };
}

export type Lookup =
  | { kind: 'new' }
  | { kind: 'replay'; response: RecordedResponse }
  | { kind: 'conflict'; code: 'idempotency_key_reused' | 'idempotency_in_progress' | 'idempotency_response_lost'; message: string }
  /**
   * A request under this key ran and ended without its response recorded or its mark cleared: the
   * node died while it ran (a clean stop lets runs finish), or the write of its record failed. Its
   * receipt, if it has one, is in the log under `requestId`; its response is not. The caller
   * decides (abandonInterrupted() to run the request again).
   */
  | { kind: 'interrupted'; requestId: string }
  /**
   * Like 'interrupted', but the run's whole response had been recorded before its receipt was
   * appended (pending()): with that receipt in the log (`requestId`'s, completed), the response is
   * answered again whole (complete()); without it, the run never finished and may run again.
   */
  | { kind: 'pending'; requestId: string; response: Omit<RecordedResponse, 'trailer'> };

export class IdempotencyStore {
  private readonly get: Database.Statement<[string], { request_sha256: string; sealed: Uint8Array }>;
  private readonly put: Database.Statement<[string, string, Uint8Array, number]>;
  private readonly prune: Database.Statement<[number]>;
  /** Runs under way here: record id → request hash. */
  private readonly running = new Map<string, string>();
  private readonly getRunning: Database.Statement<[string], { request_sha256: string; request_id: string }>;
  private readonly putRunning: Database.Statement<[string, string, string, number]>;
  private readonly delRunning: Database.Statement<[string]>;
  private readonly pruneRunning: Database.Statement<[number]>;
  private readonly delSealed: Database.Statement<[string]>;
  /** Runs under way here whose whole response is recorded, pending their receipt (pending()). */
  private readonly pendingHere = new Set<string>();
  private readonly db: Database.Database;
  /**
   * Forgotten answers may still be in the WAL (its truncation was kept from running by a reader).
   * True at open: what a process that died before its pruning left is cleaned at the first one.
   */
  private walHoldsForgotten = true;
  /** Runs the WAL's truncation (a checkpoint) through state.db's seal; a problem (its files changed) when it refused. */
  private readonly own: (checkpoint: () => void) => unknown;

  /**
   * `own`: runs a checkpoint as the node's seal runs its own (sqlite-seal.ts: only on files as
   * SQLite left them, and recorded after): the truncation alone, never a commit with it (a commit
   * inside it could start the WAL over and be checkpointed unseen: taken for another program's write).
   */
  constructor(db: Database.Database, opts: { own?: (checkpoint: () => void) => unknown } = {}) {
    this.db = db;
    this.own = opts.own ?? ((checkpoint) => void checkpoint());
    db.exec(SCHEMA);
    this.getRunning = db.prepare('SELECT request_sha256, request_id FROM idempotency_marks WHERE id = ?');
    this.putRunning = db.prepare('INSERT OR REPLACE INTO idempotency_marks (id, request_sha256, request_id, started_at) VALUES (?, ?, ?, ?)');
    this.delRunning = db.prepare('DELETE FROM idempotency_marks WHERE id = ?');
    this.pruneRunning = db.prepare('DELETE FROM idempotency_marks WHERE started_at < ?');
    this.get = db.prepare('SELECT request_sha256, sealed FROM idempotency_sealed WHERE id = ?');
    this.put = db.prepare('INSERT OR REPLACE INTO idempotency_sealed (id, request_sha256, sealed, created_at) VALUES (?, ?, ?, ?)');
    this.prune = db.prepare('DELETE FROM idempotency_sealed WHERE created_at < ?');
    this.delSealed = db.prepare('DELETE FROM idempotency_sealed WHERE id = ?');
    this.sealOlderRecords();
  }

  /** Records and marks a node before this version wrote in the clear are sealed, and the clear tables dropped. */
  private sealOlderRecords(): void {
    const tables = new Set(this.db.prepare<[], { name: string }>("SELECT name FROM sqlite_master WHERE type = 'table'").all().map((t) => t.name));
    if (!tables.has('idempotency') && !tables.has('idempotency_running')) return;
    this.db.transaction(() => {
      if (tables.has('idempotency')) {
        const rows = this.db.prepare<[], { account: string; key: string; request_sha256: string; status: number; headers: string; body: Uint8Array; trailer: string; created_at: number }>('SELECT * FROM idempotency').all();
        for (const r of rows) {
          const keys = recordKeys(r.account, r.key);
          let recorded: RecordedResponse;
          try {
            recorded = { status: r.status, headers: JSON.parse(r.headers), body: new Uint8Array(r.body), trailer: JSON.parse(r.trailer) };
          } catch {
            continue; // (a row damaged on disk cannot be answered from: dropped, not a node that cannot start)
          }
          this.put.run(keys.id, currentRequestSha256(r.request_sha256, recorded.trailer), sealResponse(recorded, keys), r.created_at);
        }
        this.db.exec('DROP TABLE idempotency');
      }
      if (tables.has('idempotency_running')) {
        const rows = this.db.prepare<[], { account: string; key: string; request_sha256: string; request_id: string; started_at: number }>('SELECT * FROM idempotency_running').all();
        for (const r of rows) this.putRunning.run(recordKeys(r.account, r.key).id, r.request_sha256, r.request_id, r.started_at);
        this.db.exec('DROP TABLE idempotency_running');
      }
    })();
    // The clear copies leave the database file and the WAL now (else at the first pruning).
    this.walHoldsForgotten = !this.truncateWal();
  }

  /**
   * What to do with a request carrying this key; 'new' also marks it running until finish(), in
   * memory and on disk (with `requestId`, the request's own id): a node that dies while it runs
   * finds the mark after its restart ('interrupted').
   */
  begin(account: string, key: string, requestSha256: string, requestId = '', now = Date.now()): Lookup {
    const keys = recordKeys(account, key);
    const reused = { kind: 'conflict', code: 'idempotency_key_reused', message: 'this Idempotency-Key was used for a different request' } as const;
    const row = this.get.get(keys.id);
    if (row) {
      if (row.request_sha256 !== requestSha256) return reused;
      let response: RecordedResponse;
      try {
        response = openResponse(row.sealed, keys);
      } catch {
        // Damaged on disk: the request ran and was billed; it must not run (and be billed) again, here or elsewhere.
        return { kind: 'conflict', code: 'idempotency_response_lost', message: 'the recorded response for this Idempotency-Key cannot be read (damaged on disk); the request is not run again' };
      }
      if (response.trailer !== null) return { kind: 'replay', response };
      // A response pending its receipt: still running here, or left by a node that died.
      if (this.running.has(keys.id)) return { kind: 'conflict', code: 'idempotency_in_progress', message: 'a request with this Idempotency-Key is still running' };
      const { trailer: _, ...whole } = response;
      return { kind: 'pending', requestId: this.getRunning.get(keys.id)?.request_id ?? '', response: whole };
    }
    if (this.running.has(keys.id)) return { kind: 'conflict', code: 'idempotency_in_progress', message: 'a request with this Idempotency-Key is still running' };
    const orphan = this.getRunning.get(keys.id);
    if (orphan) return orphan.request_sha256 !== requestSha256 ? reused : { kind: 'interrupted', requestId: orphan.request_id };
    this.putRunning.run(keys.id, requestSha256, requestId, now);
    this.running.set(keys.id, requestSha256);
    return { kind: 'new' };
  }

  /**
   * Forgets the mark of a request under this key that a crash interrupted, and begins the retry
   * (what begin() answers once no such mark is left).
   */
  abandonInterrupted(account: string, key: string, requestSha256: string, requestId = '', now = Date.now()): Exclude<Lookup, { kind: 'interrupted' }> {
    const { id } = recordKeys(account, key);
    if (!this.running.has(id)) {
      this.db.transaction(() => {
        this.delRunning.run(id);
        this.delSealed.run(id); // (a response pending a receipt that never came)
      })();
    }
    return this.begin(account, key, requestSha256, requestId, now) as Exclude<Lookup, { kind: 'interrupted' }>;
  }

  /**
   * Records the whole response of a request begun with begin() before its receipt is appended: a
   * node that dies between its receipt and finish() answers the retry with it and that receipt
   * (s24 hC: a whole body broken off so, withheld from the market, could never be had again).
   */
  pending(account: string, key: string, response: Omit<RecordedResponse, 'trailer'>, now = Date.now()): void {
    const keys = recordKeys(account, key);
    const sha = this.running.get(keys.id);
    if (sha === undefined) return;
    this.put.run(keys.id, sha, sealResponse({ ...response, trailer: null as unknown as Record<string, unknown> }, keys), now);
    this.pendingHere.add(keys.id);
  }

  /** Records the response of a request begun with begin(); `response` undefined records nothing (a pending one is dropped). Either way the request no longer runs. */
  finish(account: string, key: string, response: RecordedResponse | undefined, now = Date.now()): void {
    const keys = recordKeys(account, key);
    const sha = this.running.get(keys.id);
    this.running.delete(keys.id);
    const pending = this.pendingHere.delete(keys.id);
    if (sha !== undefined) this.end(keys, sha, response, pending, now);
  }

  /** Completes a response a node that died left pending (begin() said 'pending'), with the trailer of its receipt. */
  complete(account: string, key: string, requestSha256: string, response: RecordedResponse, now = Date.now()): void {
    const keys = recordKeys(account, key);
    if (!this.running.has(keys.id)) this.end(keys, requestSha256, response, false, now);
  }

  /** A run's end on disk: its response recorded (or a pending one dropped) and its mark cleared, at once. */
  private end(keys: { id: string; seal: Buffer }, sha: string, response: RecordedResponse | undefined, dropPending: boolean, now: number): void {
    this.db.transaction(() => {
      if (response) this.put.run(keys.id, sha, sealResponse(response, keys), now);
      else if (dropPending) this.delSealed.run(keys.id);
      this.delRunning.run(keys.id);
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

  /** Checkpoints and truncates the WAL without waiting for readers (through `own`); whether it was done. */
  private truncateWal(): boolean {
    if (this.db.pragma('journal_mode', { simple: true }) !== 'wal') return true;
    let done = false;
    const refused = this.own(() => (done = this.truncateNow()));
    return !refused && done;
  }

  private truncateNow(): boolean {
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

/**
 * A record's request hash in the form this version compares, sha256("<endpoint>\n<body_sha256>").
 * Builds before the endpoint was part of a request's identity stored the body's SHA-256 alone, which
 * is also the request_sha256 of the receipt the record answers with: such a record is given the
 * current form from its receipt's endpoint (else its retry would read as another request).
 */
function currentRequestSha256(stored: string, trailer: Record<string, unknown>): string {
  if (typeof trailer.receipt !== 'string') return stored;
  const p = peekLine(trailer.receipt);
  return p && p.request_sha256 === stored && typeof p.endpoint === 'string' ? sha256Hex(`${p.endpoint}\n${stored}`) : stored;
}
