import Database from 'better-sqlite3';
import { describe, expect, test } from 'vitest';
import { IdempotencyStore } from '../src/dispatch/idempotency.ts';
import { utf8 } from '../attestation/bytes.ts';
import { serializeEnvelope } from '../attestation/dsse.ts';
import { sha256Hex } from '../attestation/hash.ts';
import type { ReceiptPayload } from '../attestation/receipt.ts';
import { receiptPayload, signReceipt, testKey } from './helpers/receipts.ts';

const response = { status: 200, headers: { 'content-type': 'application/json' }, body: Uint8Array.of(1, 2, 3), trailer: { receipt: 'r', status: 'completed' } };

describe('IdempotencyStore', () => {
  test('new, in progress, replay, reused; scoped by account; forgotten when old', () => {
    const db = new Database(':memory:');
    const s = new IdempotencyStore(db);
    expect(s.begin('acct', 'k', 'h1')).toEqual({ kind: 'new' });
    expect(s.begin('acct', 'k', 'h1')).toMatchObject({ kind: 'conflict', code: 'idempotency_in_progress' });
    expect(s.begin('other', 'k', 'h1')).toEqual({ kind: 'new' }); // another account's key space
    s.finish('acct', 'k', response, 1000);
    expect(s.begin('acct', 'k', 'h1')).toEqual({ kind: 'replay', response });
    expect(s.begin('acct', 'k', 'h2')).toMatchObject({ kind: 'conflict', code: 'idempotency_key_reused' });
    s.finish('other', 'k', undefined); // a failed first attempt records nothing
    expect(s.begin('other', 'k', 'h1')).toEqual({ kind: 'new' });
    expect(s.forgetOlderThan(10, 2000)).toBe(1);
    expect(s.begin('acct', 'k', 'h2')).toEqual({ kind: 'new' });
    db.close();
  });
  test('a whole response recorded pending its receipt: in progress while it runs; found pending (with its request id) by the next process, until completed or abandoned; dropped when its run records nothing', () => {
    const db = new Database(':memory:');
    const { trailer: _, ...whole } = response;
    const dead = new IdempotencyStore(db);
    expect(dead.begin('acct', 'k', 'h1', 'req-1', 1000)).toEqual({ kind: 'new' });
    dead.pending('acct', 'k', whole, 1000);
    expect(dead.begin('acct', 'k', 'h1')).toMatchObject({ kind: 'conflict', code: 'idempotency_in_progress' });
    // (no finish: the process died)
    const next = new IdempotencyStore(db);
    expect(next.begin('acct', 'k', 'h1', 'req-2')).toEqual({ kind: 'pending', requestId: 'req-1', response: whole });
    expect(next.begin('acct', 'k', 'h2', 'req-2')).toMatchObject({ kind: 'conflict', code: 'idempotency_key_reused' });
    next.complete('acct', 'k', 'h1', response, 2000);
    expect(new IdempotencyStore(db).begin('acct', 'k', 'h1')).toEqual({ kind: 'replay', response });
    // Pending with no receipt to complete it: abandoned, the retry runs; then a run that records nothing leaves nothing.
    const a = new IdempotencyStore(db);
    expect(a.begin('acct', 'k2', 'h1', 'req-3')).toEqual({ kind: 'new' });
    a.pending('acct', 'k2', whole);
    const b = new IdempotencyStore(db);
    expect(b.begin('acct', 'k2', 'h1', 'req-4')).toMatchObject({ kind: 'pending', requestId: 'req-3' });
    expect(b.abandonInterrupted('acct', 'k2', 'h1', 'req-4')).toEqual({ kind: 'new' });
    b.pending('acct', 'k2', whole);
    b.finish('acct', 'k2', undefined);
    expect(b.begin('acct', 'k2', 'h1', 'req-5')).toEqual({ kind: 'new' });
    db.close();
  });

  test('a run the process died in is found by the next process (interrupted, with its request id), until abandoned or recorded', () => {
    const db = new Database(':memory:');
    const dead = new IdempotencyStore(db);
    expect(dead.begin('acct', 'k', 'h1', 'req-1', 1000)).toEqual({ kind: 'new' });
    // (no finish: the process died)
    const next = new IdempotencyStore(db);
    expect(next.begin('acct', 'k', 'h1', 'req-2')).toEqual({ kind: 'interrupted', requestId: 'req-1' });
    expect(next.begin('acct', 'k', 'h2', 'req-2')).toMatchObject({ kind: 'conflict', code: 'idempotency_key_reused' });
    expect(next.abandonInterrupted('acct', 'k', 'h1', 'req-2')).toEqual({ kind: 'new' });
    expect(next.abandonInterrupted('acct', 'k', 'h1', 'req-3')).toMatchObject({ kind: 'conflict', code: 'idempotency_in_progress' }); // (not while it runs here)
    next.finish('acct', 'k', response, 2000);
    const third = new IdempotencyStore(db);
    expect(third.begin('acct', 'k', 'h1')).toEqual({ kind: 'replay', response });
    // A run finished without a record (refused, cancelled) leaves no mark either.
    expect(third.begin('acct', 'x', 'h1', 'req-4')).toEqual({ kind: 'new' });
    third.finish('acct', 'x', undefined);
    expect(new IdempotencyStore(db).begin('acct', 'x', 'h1', 'req-5')).toEqual({ kind: 'new' });
    // Marks older than a day are pruned with the records.
    const old = new IdempotencyStore(db);
    old.begin('acct', 'y', 'h1', 'req-6', 10);
    new IdempotencyStore(db).forgetOlderThan(100, 200);
    expect(new IdempotencyStore(db).begin('acct', 'y', 'h1', 'req-7')).toEqual({ kind: 'new' });
    db.close();
  });
});

describe("state.db on disk: recorded answers are buyers' output text", () => {
  /** Runs `run` on a fresh state.db in its own folder (removed after); `holding(bytes)` lists the files (db, WAL) that contain `bytes`. */
  async function withStateDb(run: (d: { fs: typeof import('node:fs'); path: typeof import('node:path'); dir: string; file: string; holding: (bytes: Uint8Array | string) => string[] }, db: Database.Database) => Promise<void> | void): Promise<void> {
    const fs = await import('node:fs');
    const os = await import('node:os');
    const path = await import('node:path');
    const { openStateDb } = await import('../src/store/state-db.ts');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'state-db-private-'));
    const file = path.join(dir, 'state.db');
    const holding = (bytes: Uint8Array | string) => ['state.db', 'state.db-wal'].filter((f) => fs.existsSync(path.join(dir, f)) && fs.readFileSync(path.join(dir, f)).includes(bytes));
    const db = openStateDb(file);
    try {
      await run({ fs, path, dir, file, holding }, db);
    } finally {
      if (db.open) db.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
  const text = 'the buyer output text, private: 7f3c91';
  const answer = { ...response, body: new TextEncoder().encode(`{"content":"${text}"}`) };
  const t0 = Date.now() - 2 * 86_400_000; // two days old

  test("sealed: neither the answer nor the Idempotency-Key is in the file; the buyer's retry opens it; another key does not find it", async () => {
    await withStateDb(async (d, db) => {
      const s = new IdempotencyStore(db);
      expect(s.begin('acct', 'key-7f3c91', 'h1', 'req-1')).toEqual({ kind: 'new' });
      s.finish('acct', 'key-7f3c91', answer);
      db.pragma('wal_checkpoint(PASSIVE)'); // (in the database file too)
      expect(d.holding(text)).toEqual([]);
      expect(d.holding('key-7f3c91')).toEqual([]);
      expect(new IdempotencyStore(db).begin('acct', 'key-7f3c91', 'h1')).toEqual({ kind: 'replay', response: answer });
      expect(new IdempotencyStore(db).begin('other', 'key-7f3c91', 'h1')).toEqual({ kind: 'new' });
      // A record damaged on disk is 409 idempotency_response_lost (no failover at the gateway), never another answer nor a second run.
      db.prepare("UPDATE idempotency_sealed SET sealed = zeroblob(64)").run();
      expect(new IdempotencyStore(db).begin('acct', 'key-7f3c91', 'h1')).toMatchObject({ kind: 'conflict', code: 'idempotency_response_lost' });
      db.close();
    });
  });

  test("the file and its WAL are this user's only, and a forgotten record leaves no copy of its sealed bytes in either, also with a reader in the way", async () => {
    await withStateDb(async (d, db) => {
      const s = new IdempotencyStore(db);
      const sealedOf = () => new Uint8Array((db.prepare('SELECT sealed FROM idempotency_sealed').get() as { sealed: Uint8Array }).sealed);
      expect(s.begin('acct', 'k', 'h1', 'req-1', t0)).toEqual({ kind: 'new' });
      s.finish('acct', 'k', answer, t0);
      const sealed = sealedOf();
      expect(d.holding(sealed)).toEqual(['state.db-wal']); // (recorded: in the WAL until a checkpoint)
      db.pragma('wal_checkpoint(PASSIVE)'); // as SQLite's auto-checkpoint does: now in both
      expect(d.holding(sealed)).toEqual(['state.db', 'state.db-wal']);
      for (const f of ['state.db', 'state.db-wal', 'state.db-shm']) expect((d.fs.statSync(d.path.join(d.dir, f)).mode & 0o777).toString(8), f).toBe('600');
      expect(s.forgetOlderThan()).toBe(1);
      expect(d.holding(sealed)).toEqual([]);
      // A reader in the way (a backup tool holding a read transaction): pruning does not wait for
      // it (the busy timeout is 5 s), and the next pruning, with nothing new to forget, truncates.
      s.begin('acct', 'k2', 'h2', 'req-2', t0);
      s.finish('acct', 'k2', answer, t0);
      const second = sealedOf();
      const reader = new Database(d.file, { readonly: true });
      reader.exec('BEGIN');
      reader.prepare('SELECT count(*) FROM idempotency_sealed').get();
      const t = performance.now();
      expect(s.forgetOlderThan()).toBe(1);
      expect(performance.now() - t).toBeLessThan(4000);
      expect(db.pragma('busy_timeout', { simple: true })).toBe(5000); // (put back)
      expect(d.holding(second)).toContain('state.db-wal'); // (the reader kept the truncation from running)
      reader.exec('COMMIT');
      reader.close();
      expect(s.forgetOlderThan()).toBe(0);
      expect(d.holding(second)).toEqual([]);
      db.close();
      expect(d.holding(second)).toEqual([]);
    });
  });

  test('records a node before this version wrote in the clear are sealed at open, their clear copies dropped and gone from the file', async () => {
    await withStateDb(async (d, db) => {
      db.exec(`CREATE TABLE idempotency (account TEXT NOT NULL, key TEXT NOT NULL, request_sha256 TEXT NOT NULL, status INTEGER NOT NULL, headers TEXT NOT NULL, body BLOB NOT NULL, trailer TEXT NOT NULL, created_at INTEGER NOT NULL, PRIMARY KEY (account, key)) WITHOUT ROWID;
        CREATE TABLE idempotency_running (account TEXT NOT NULL, key TEXT NOT NULL, request_sha256 TEXT NOT NULL, request_id TEXT NOT NULL, started_at INTEGER NOT NULL, PRIMARY KEY (account, key)) WITHOUT ROWID`);
      db.prepare('INSERT INTO idempotency VALUES (?, ?, ?, ?, ?, ?, ?, ?)').run('acct', 'old-key', 'h1', answer.status, JSON.stringify(answer.headers), answer.body, JSON.stringify(answer.trailer), Date.now());
      db.prepare('INSERT INTO idempotency_running VALUES (?, ?, ?, ?, ?)').run('acct', 'died-key', 'h2', 'req-died', Date.now());
      db.prepare('INSERT INTO idempotency VALUES (?, ?, ?, ?, ?, ?, ?, ?)').run('acct', 'damaged-key', 'h3', 200, '{not json', answer.body, '{}', Date.now()); // (dropped, the node still starts)
      db.pragma('wal_checkpoint(PASSIVE)');
      expect(d.holding(text)).not.toEqual([]);
      const s = new IdempotencyStore(db);
      expect(s.begin('acct', 'old-key', 'h1')).toEqual({ kind: 'replay', response: answer });
      expect(s.begin('acct', 'died-key', 'h2')).toEqual({ kind: 'interrupted', requestId: 'req-died' });
      expect(s.begin('acct', 'damaged-key', 'h3')).toEqual({ kind: 'new' });
      expect(db.prepare("SELECT name FROM sqlite_master WHERE name IN ('idempotency', 'idempotency_running')").all()).toEqual([]);
      expect(d.holding(text)).toEqual([]); // (the clear copies left the file and the WAL at open, not at a pruning a crash could prevent)
      db.close();
    });
  });
});

test('a record from a build that hashed the body alone (before the endpoint was part of a request) answers its retry after the upgrade', () => {
  const db = new Database(':memory:');
  db.exec(`CREATE TABLE idempotency (account TEXT NOT NULL, key TEXT NOT NULL, request_sha256 TEXT NOT NULL, status INTEGER NOT NULL, headers TEXT NOT NULL, body BLOB NOT NULL, trailer TEXT NOT NULL, created_at INTEGER NOT NULL, PRIMARY KEY (account, key)) WITHOUT ROWID`);
  const node = testKey();
  const bodySha = 'ab'.repeat(32);
  const receipt = serializeEnvelope(signReceipt(node, receiptPayload(node, 0, { endpoint: 'completions', request_sha256: bodySha } as Partial<ReceiptPayload>)));
  const old = { status: 200, headers: { 'content-type': 'application/json' }, body: utf8('{"old":true}'), trailer: { receipt } };
  db.prepare('INSERT INTO idempotency VALUES (?, ?, ?, ?, ?, ?, ?, ?)').run('acct', 'k', bodySha, old.status, JSON.stringify(old.headers), old.body, JSON.stringify(old.trailer), Date.now());
  const s = new IdempotencyStore(db);
  // What the node compares now: the endpoint and the body's hash.
  expect(s.begin('acct', 'k', sha256Hex(`completions\n${bodySha}`))).toEqual({ kind: 'replay', response: old });
  // The same body to another endpoint is still another request.
  expect(s.begin('acct', 'k', sha256Hex(`chat/completions\n${bodySha}`))).toMatchObject({ kind: 'conflict', code: 'idempotency_key_reused' });
  db.close();
});

test('an account and key that run into each other find no other pair\'s record (the account is length-prefixed)', () => {
  const db = new Database(':memory:');
  const s = new IdempotencyStore(db);
  expect(s.begin('a\u0000b', 'c', 'h1')).toEqual({ kind: 'new' });
  s.finish('a\u0000b', 'c', response);
  expect(s.begin('a', 'b\u0000c', 'h1')).toEqual({ kind: 'new' });
  expect(s.begin('ab', 'c', 'h1')).toEqual({ kind: 'new' });
  db.close();
});

describe('idempotency records live 24 h', () => {
  test('a record a minute old survives the pruner (node.ts runs it every 60 s); its retry is a replay', () => {
    const db = new Database(':memory:');
    const s = new IdempotencyStore(db);
    const t0 = 1_700_000_000_000;
    const response = { status: 200, headers: {}, body: Uint8Array.of(1), trailer: { receipt: 'r', status: 'completed' } };
    expect(s.begin('acct', 'k', 'h1', 'req-1', t0)).toEqual({ kind: 'new' });
    s.finish('acct', 'k', response, t0);
    expect(s.forgetOlderThan(undefined, t0 + 60_000)).toBe(0);
    expect(s.begin('acct', 'k', 'h1')).toMatchObject({ kind: 'replay' });
    db.close();
  });
});
