import Database from 'better-sqlite3';
import { describe, expect, test } from 'vitest';
import { IdempotencyStore } from '../src/dispatch/idempotency.ts';

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
  test('the file and its WAL are this user\'s only, and a forgotten answer leaves no copy in either', async () => {
    const fs = await import('node:fs');
    const os = await import('node:os');
    const path = await import('node:path');
    const { openStateDb } = await import('../src/store/state-db.ts');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'state-db-private-'));
    try {
      const file = path.join(dir, 'state.db');
      const db = openStateDb(file);
      const s = new IdempotencyStore(db);
      const text = 'the buyer output text, private: 7f3c91';
      const t0 = Date.now() - 2 * 86_400_000; // two days old
      expect(s.begin('acct', 'k', 'h1', 'req-1', t0)).toEqual({ kind: 'new' });
      s.finish('acct', 'k', { ...response, body: new TextEncoder().encode(`{"content":"${text}"}`) }, t0);
      const holding = () => ['state.db', 'state.db-wal'].filter((f) => fs.existsSync(path.join(dir, f)) && fs.readFileSync(path.join(dir, f)).includes(text));
      expect(holding()).toEqual(['state.db-wal']); // (recorded: in the WAL until a checkpoint)
      db.pragma('wal_checkpoint(PASSIVE)'); // as SQLite's auto-checkpoint does: now in both
      expect(holding()).toEqual(['state.db', 'state.db-wal']);
      for (const f of ['state.db', 'state.db-wal', 'state.db-shm']) expect((fs.statSync(path.join(dir, f)).mode & 0o777).toString(8), f).toBe('600');
      expect(s.forgetOlderThan()).toBe(1);
      expect(holding()).toEqual([]);
      // A reader in the way (a backup tool holding a read transaction): pruning does not wait for
      // it (the busy timeout is 5 s), and the next pruning, with nothing new to forget, truncates.
      s.begin('acct', 'k2', 'h2', 'req-2', t0);
      s.finish('acct', 'k2', { ...response, body: new TextEncoder().encode(`{"content":"${text}"}`) }, t0);
      const reader = new Database(file, { readonly: true });
      reader.exec('BEGIN');
      reader.prepare('SELECT count(*) FROM idempotency').get();
      const t = performance.now();
      expect(s.forgetOlderThan()).toBe(1);
      expect(performance.now() - t).toBeLessThan(4000);
      expect(db.pragma('busy_timeout', { simple: true })).toBe(5000); // (put back)
      expect(holding()).toContain('state.db-wal'); // (the reader kept the truncation from running)
      reader.exec('COMMIT');
      reader.close();
      expect(s.forgetOlderThan()).toBe(0);
      expect(holding()).toEqual([]);
      db.close();
      expect(holding()).toEqual([]);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
