// state.db (used tickets, Idempotency-Key records) changed in place by another program while the
// node uses it: its -wal cut short, an older copy written over it. The node's file check (its
// DatabaseRescue, with the WAL checked against SQLite's index and the file against the node's own
// checkpoints) must say so and copy out what it still reads; and the node's own writes, its
// checkpoint thread, its fallback checkpoint and the pruning's WAL truncation must never look like a change.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, test } from 'vitest';
import { IdempotencyStore } from '../src/dispatch/idempotency.ts';
import { TicketGate } from '../src/dispatch/ticket-gate.ts';
import type { TicketPayload } from '../attestation/ticket.ts';
import { pruneState } from '../src/node.ts';
import { DatabaseRescue } from '../src/store/file-guard.ts';
import { SqliteSeal } from '../src/store/sqlite-seal.ts';
import { openStateDb } from '../src/store/state-db.ts';
import { WalCheckpointer } from '../src/store/wal-checkpointer.ts';
import { until } from './helpers/wait.ts';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A state store as the node opens it: its connection, its seal, its file check and its checkpoint thread (every `every` ms). */
function stateStore(every: number) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'state-tamper-'));
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'state.db');
  const db = openStateDb(file);
  db.exec('CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)');
  const seal = SqliteSeal.attach(file);
  cleanups.push(() => {
    db.close();
    seal.release();
  });
  const rescue = new DatabaseRescue(db, file, () => 'its records', () => 'restore it from a backup.', seal);
  const thread = new WalCheckpointer(file, { intervalMs: every, seal });
  cleanups.push(() => thread.close());
  const insert = db.prepare('INSERT INTO t (v) VALUES (?)');
  const write = (n: number) => db.transaction(() => { for (let i = 0; i < n; i++) insert.run(Buffer.alloc(3000, i)); })();
  return { dir, file, db, seal, rescue, write };
}

describe('state.db in normal use', () => {
  test('writes, its thread checkpointing every millisecond, the node\'s fallback checkpoint and the WAL truncated as pruning does, checked after every write: never a change', async () => {
    const { file, db, seal, rescue, write } = stateStore(1);
    expect(db.pragma('wal_autocheckpoint', { simple: true })).toBe(0); // (every checkpoint is the node's, through the seal)
    const base = fs.statSync(file).size;
    for (let round = 0; round < 600; round++) {
      write(1 + (round % 7));
      if (round % 50 === 49) expect(seal.own(() => db.pragma('wal_checkpoint(TRUNCATE)'))).toBeUndefined(); // (as the node's pruning runs it)
      if (round % 13 === 0) expect(seal.checkpoint(db)).toBeUndefined(); // (as the node's fallback runs one, on this thread)
      expect(rescue.check()).toBeUndefined();
      if (round % 10 === 0) await new Promise((r) => setTimeout(r, 1)); // (the thread's turn)
    }
    expect(fs.statSync(file).size).toBeGreaterThan(base + 1_000_000); // (checkpointed into the database all along)
    expect(db.prepare<[], { n: number }>('SELECT count(*) AS n FROM t').get()!.n).toBeGreaterThan(2000);
  }, 60_000);
});

describe('state.db changed in place', () => {
  test('its -wal cut short: the next check says so, and what the node still reads is copied out', async () => {
    const { dir, file, rescue, write } = stateStore(60_000);
    write(50);
    execFileSync('truncate', ['-s', '0', `${file}-wal`]);
    const found = rescue.check();
    expect(found).toMatchObject({ kind: 'changed', file: `${file}-wal`, what: expect.stringMatching(/^was cut short in place \(it is 0 bytes; SQLite's index of it names \d+ frames/), copy: { ok: true, message: expect.stringMatching(/^Its records .*were copied to .*state\.rescued-\d+\.db: stop the node/) } });
    const copy = new Database(path.join(dir, fs.readdirSync(dir).find((f) => /^state\.rescued-\d+\.db$/.test(f))!), { readonly: true });
    expect(copy.pragma('quick_check', { simple: true })).toBe('ok');
    copy.close();
    expect(rescue.check()).toBeUndefined(); // (said once)
  });

  test('an older copy written over it: the next check says so, even with the thread checkpointing meanwhile', async () => {
    const { dir, file, seal, rescue, write } = stateStore(1);
    // (All of the WAL copied in first: a checkpoint copying the latest pages while the copy is
    // written could write each page the older copy has older, leaving the file as it should be.)
    const copiedIn = () => until('the WAL copied into the database', () => seal.index()!.nBackfill === seal.index()!.mxFrame);
    write(50);
    await copiedIn();
    execFileSync('cp', [file, path.join(dir, 'older.db')]);
    write(50);
    await copiedIn();
    expect(rescue.check()).toBeUndefined();
    execFileSync('cp', [path.join(dir, 'older.db'), file]);
    // (a check while the thread's checkpoint runs is skipped; the thread looks first, and then leaves the files alone)
    let found: ReturnType<typeof rescue.check>;
    await until('the check to find it', () => (found = rescue.check()) !== undefined);
    expect(found).toMatchObject({ kind: 'changed', file, what: expect.stringMatching(/^was written over in place \(.*, by no checkpoint of the node's\)$/), copy: { ok: true } });
  });
});

describe("the node's own pruning and upgrade are never a change (s26 review)", () => {
  /** state.db as the node opens it, with the ticket gate and the Idempotency store wired as node.ts wires them. */
  function store(prepare?: (db: Database.Database) => void) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'state-own-'));
    cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const file = path.join(dir, 'state.db');
    if (prepare) {
      const before = openStateDb(file);
      prepare(before);
      before.close();
    }
    const db = openStateDb(file);
    const seal = SqliteSeal.attach(file);
    cleanups.push(() => {
      db.close();
      seal.release();
    });
    const rescue = new DatabaseRescue(db, file, () => 'its records', () => 'restore it from a backup.', seal);
    let clock = Date.now();
    const gate = new TicketGate({ db, marketplaceKeys: [], providerId: 'p', skewMs: 0, now: () => clock });
    const idempotency = new IdempotencyStore(db, { own: (checkpoint) => seal.own(checkpoint) });
    return { file, db, seal, rescue, gate, idempotency, advance: (ms: number) => (clock += ms) };
  }
  const ticket = (i: number, expiresAt: number) => ({ ticket_id: `t${i}`, request_id: `r${i}`, expires_at: expiresAt }) as TicketPayload;

  test('the first pruning after a restart, deleting tickets the run before used, then truncating the WAL', () => {
    const { db, seal, rescue, gate, idempotency, advance } = store((before) => {
      const used = new TicketGate({ db: before, marketplaceKeys: [], providerId: 'p' });
      for (let i = 0; i < 5; i++) expect(used.use(ticket(i, Date.now() + 20))).toMatchObject({ ok: true });
    });
    expect(seal.checkpoint(db)).toBeUndefined(); // (the checkpoint thread's first run)
    expect(rescue.check()).toBeUndefined();
    advance(60_000);
    const pruned: number[] = [];
    pruneState([() => pruned.push(gate.prune()), () => idempotency.forgetOlderThan()], { warn: () => undefined });
    expect(pruned).toEqual([5]);
    expect(fs.statSync(`${seal.db}-wal`).size).toBe(0); // (truncated: the pruning ran whole)
    expect(rescue.check()).toBeUndefined();
  });

  test('a pruning deleting expired tickets from a WAL all checkpointed', () => {
    const { db, seal, rescue, gate, idempotency, advance } = store();
    idempotency.forgetOlderThan(); // (the first pruning: the WAL truncated)
    for (let i = 0; i < 5; i++) expect(gate.use(ticket(i, Date.now() + 20))).toMatchObject({ ok: true });
    expect(seal.checkpoint(db)).toBeUndefined(); // (the checkpoint thread has copied everything in)
    advance(60_000);
    expect(gate.prune()).toBe(5);
    idempotency.forgetOlderThan();
    expect(rescue.check()).toBeUndefined();
  });

  test('a pruning that forgets day-old Idempotency-Key records', () => {
    const { db, seal, rescue, idempotency } = store();
    expect(idempotency.begin('acct', 'k1', 'h1')).toMatchObject({ kind: 'new' });
    idempotency.finish('acct', 'k1', { status: 200, headers: {}, body: new Uint8Array(3), trailer: {} });
    idempotency.forgetOlderThan(); // (the first pruning: the WAL truncated, nothing forgotten)
    expect(seal.checkpoint(db)).toBeUndefined();
    expect(idempotency.forgetOlderThan(0, Date.now() + 1)).toBe(1);
    expect(rescue.check()).toBeUndefined();
  });

  test("an upgrade's start: records kept in the clear by an older node sealed, the WAL truncated", () => {
    const { file, rescue } = store((db) => {
      db.exec('CREATE TABLE idempotency_running (account TEXT, key TEXT, request_sha256 TEXT, request_id TEXT, started_at INTEGER)');
      db.prepare('INSERT INTO idempotency_running VALUES (?, ?, ?, ?, ?)').run('acct', 'k', 'a'.repeat(64), 'r1', Date.now());
    });
    expect(fs.statSync(`${file}-wal`).size).toBe(0);
    expect(rescue.check()).toBeUndefined();
  });

  test('a new state.db (a first start): its -wal cut short is noticed too', () => {
    const { file, db, rescue } = store();
    db.exec('CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)');
    const insert = db.prepare('INSERT INTO t (v) VALUES (?)');
    for (let i = 0; i < 30; i++) insert.run(Buffer.alloc(3000, i));
    execFileSync('truncate', ['-s', '0', `${file}-wal`]);
    expect(rescue.check()).toMatchObject({ kind: 'changed', file: `${file}-wal`, what: expect.stringMatching(/^was cut short in place/) });
  });
});
