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
});
