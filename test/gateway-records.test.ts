// The gateway's request records: in memory, and written through to SQLite when given a file.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, describe, expect, test, vi } from 'vitest';
import type { ReceiptPayload } from '../attestation/receipt.ts';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import { keyLabel, RequestRecords, type UnsettledJob } from '../src/gateway/records.ts';
import { GatewayError } from '../src/gateway/errors.ts';
import { Ticketing, type AnsweredAttempt } from '../src/gateway/tickets.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-records-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const envelope: DsseEnvelope = { payload: 'eyJ9', payloadType: 'application/vnd.test', signatures: [{ keyid: 'k', sig: 'c2ln' }] };
const receipt = (id: string) => ({
  envelope,
  payload: { request_id: id, status: 'completed', provider: 'ab'.repeat(32), usage: { input_tokens: 7, output_tokens: 3 }, cost_micro_usd: '1234567' } as unknown as ReceiptPayload,
});
const begin = (r: RequestRecords, id: string) => r.begin({ request_id: id, endpoint: 'chat/completions', model: 'tiny/llama', provider: null });

describe('RequestRecords', () => {
  test('in memory: the most recent `limit` records, begin → settle with exact cost', () => {
    const r = new RequestRecords(2);
    for (const id of ['a', 'b', 'c']) begin(r, id);
    expect(r.get('a')).toBeUndefined();
    const rec = r.settle('c', receipt('c'), { ok: true })!;
    expect(rec).toMatchObject({ status: 'completed', cost: '1.234567', cost_micro_usd: '1234567', usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 }, settled: true });
    r.close();
  });

  test('with a file: every change is kept, aliases too, and a record evicted from memory is still answered', () => {
    const file = path.join(dir, 'a.db');
    const r = new RequestRecords(1, file);
    begin(r, 'one');
    r.settle('one', receipt('one'), { ok: false, code: 'market_down', message: 'the market did not answer' });
    r.alias('retry-of-one', 'one');
    begin(r, 'two');
    r.fail('two', 'refused', { code: 'no_provider', message: 'nobody sells that' });
    // 'one' fell out of memory (limit 1) but the file has it, under both ids.
    expect(r.get('one')).toMatchObject({ status: 'completed', settled: false, settlement_error: { code: 'market_down' } });
    expect(r.get('retry-of-one')).toEqual(r.get('one'));
    r.close();
    const again = new RequestRecords(10, file);
    expect(again.get('one')).toMatchObject({ status: 'completed', receipt: envelope });
    expect(again.get('retry-of-one')?.request_id).toBe('one');
    expect(again.get('two')).toMatchObject({ status: 'refused', error: { code: 'no_provider' } });
    expect(again.get('three')).toBeUndefined();
    // Buyers' Idempotency-Keys and receipts: the file and its WAL are this user's only.
    for (const f of [file, `${file}-wal`]) expect((fs.statSync(f).mode & 0o777).toString(8), f).toBe('600');
    again.close();
  });

  test('the provider that answered under an idempotency key is kept in the file for 24 h (none without a file)', () => {
    const file = path.join(dir, 'idempotent.db');
    const day = 24 * 60 * 60 * 1000;
    const now = Date.now();
    const clock = vi.spyOn(Date, 'now');
    try {
      clock.mockReturnValue(now - day - 1000);
      const old = new RequestRecords(10, file);
      old.rememberIdempotent('chat/completions\nstale', 'aa'.repeat(32), 'req-stale');
      old.close();
      clock.mockReturnValue(now);
      const a = new RequestRecords(10, file);
      a.rememberIdempotent('chat/completions\nk', 'bb'.repeat(32), 'req-1');
      a.rememberIdempotent('chat/completions\nk', 'cc'.repeat(32), 'req-2'); // the latest answer counts
      expect(a.idempotentProvider('chat/completions\nk')).toEqual({ provider: 'cc'.repeat(32), requestId: 'req-2' });
      a.close();
      const b = new RequestRecords(10, file); // a restart
      expect(b.idempotentProvider('chat/completions\nk')).toEqual({ provider: 'cc'.repeat(32), requestId: 'req-2' });
      expect(b.idempotentProvider('completions\nk')).toBeUndefined();
      expect(b.idempotentProvider('chat/completions\nstale')).toBeUndefined(); // older than a node keeps its record
      // An attempt that did not complete is forgotten, only while it is still the one kept.
      b.rememberIdempotent('completions\nleft', 'dd'.repeat(32), 'req-left');
      b.rememberIdempotent('completions\nleft', 'dd'.repeat(32), 'req-retry'); // a retry answered since, at the same provider
      b.forgetIdempotent('completions\nleft', 'req-left');
      expect(b.idempotentProvider('completions\nleft')).toEqual({ provider: 'dd'.repeat(32), requestId: 'req-retry' });
      b.forgetIdempotent('completions\nleft', 'req-retry');
      expect(b.idempotentProvider('completions\nleft')).toBeUndefined();
      clock.mockReturnValue(now + day + 1000);
      expect(b.idempotentProvider('chat/completions\nk')).toBeUndefined();
      b.close();
      const rows = new Database(file, { readonly: true });
      expect(rows.prepare('SELECT count(*) AS n FROM idempotent_providers').get()).toEqual({ n: 1 }); // the stale row was pruned at open
      rows.close();
    } finally {
      clock.mockRestore();
    }
    const memory = new RequestRecords(10);
    memory.rememberIdempotent('chat/completions\nk', 'bb'.repeat(32), 'req-1');
    expect(memory.idempotentProvider('chat/completions\nk')).toBeUndefined();
    memory.close();
  });

  test('a file from before keys kept their request id gets the column; its keys are kept, and never forgotten by an attempt', () => {
    const file = path.join(dir, 'idempotent-v1.db');
    const old = new Database(file);
    old.exec('CREATE TABLE idempotent_providers (key TEXT PRIMARY KEY, provider TEXT NOT NULL, at INTEGER NOT NULL) WITHOUT ROWID');
    old.prepare('INSERT INTO idempotent_providers VALUES (?, ?, ?)').run('chat/completions\nk', 'aa'.repeat(32), Date.now());
    old.close();
    const r = new RequestRecords(10, file);
    expect(r.idempotentProvider('chat/completions\nk')).toEqual({ provider: 'aa'.repeat(32), requestId: null });
    r.forgetIdempotent('chat/completions\nk', 'req-any');
    expect(r.idempotentProvider('chat/completions\nk')).toEqual({ provider: 'aa'.repeat(32), requestId: null });
    r.rememberIdempotent('completions\nk', 'bb'.repeat(32), 'req-2');
    expect(r.idempotentProvider('completions\nk')).toEqual({ provider: 'bb'.repeat(32), requestId: 'req-2' });
    r.close();
  });

  test('the file keeps records for its retention period (default 7 days): older ones, and aliases to them, are deleted at open and as it is written; a file of an older version is brought up to date', () => {
    const file = path.join(dir, 'retention.db');
    const day = 24 * 60 * 60 * 1000;
    const now = Date.now();
    const clock = vi.spyOn(Date, 'now');
    try {
      clock.mockReturnValue(now - 8 * day);
      const old = new RequestRecords(10, file);
      begin(old, 'old');
      old.alias('retry-of-old', 'old');
      old.close();
      clock.mockReturnValue(now - 6 * day);
      const mid = new RequestRecords(10, file);
      begin(mid, 'recent');
      mid.close();
      clock.mockReturnValue(now);
      const a = new RequestRecords(10, file);
      expect(a.get('old')).toBeUndefined();
      expect(a.get('retry-of-old')).toBeUndefined();
      expect(a.get('recent')).toMatchObject({ request_id: 'recent' });
      a.close();
      const rows = new Database(file, { readonly: true });
      expect(rows.prepare('SELECT count(*) AS n FROM request_aliases').get()).toEqual({ n: 0 });
      rows.close();
      // A shorter period, given: the 6-day-old record goes too; prune() says how many.
      const short = new RequestRecords(10, file, undefined, 5 * day);
      expect(short.get('recent')).toBeUndefined();
      expect(short.prune()).toBe(0);
      // As it is written: every 1000 writes, records that have aged past the period go.
      begin(short, 'aging');
      clock.mockReturnValue(now + 6 * day);
      for (let i = 0; i < 999; i++) begin(short, `w${i}`);
      expect(short.get('w0')).toBeDefined();
      const agingRows = () => {
        const db = new Database(file, { readonly: true });
        const ids = db.prepare<[], { request_id: string }>("SELECT request_id FROM request_records WHERE request_id = 'aging'").all();
        db.close();
        return ids.length;
      };
      short.close();
      expect(agingRows()).toBe(0); // pruned by the 1000th write, not by an open
    } finally {
      clock.mockRestore();
    }
    // A file from before records had a created_at column: the column is added and filled.
    const legacy = path.join(dir, 'legacy.db');
    const db = new Database(legacy);
    db.exec('CREATE TABLE request_records (request_id TEXT PRIMARY KEY, record TEXT NOT NULL) WITHOUT ROWID');
    const rec = (id: string, at: number) => JSON.stringify({ request_id: id, status: 'completed', endpoint: 'chat/completions', model: 'm', provider: null, usage: null, cost: null, cost_micro_usd: null, receipt: null, settled: true, created_at: at, finished_at: at });
    db.prepare('INSERT INTO request_records VALUES (?, ?)').run('ancient', rec('ancient', now - 30 * day));
    db.prepare('INSERT INTO request_records VALUES (?, ?)').run('fresh', rec('fresh', now - day));
    db.close();
    const upgraded = new RequestRecords(10, legacy);
    expect(upgraded.get('ancient')).toBeUndefined();
    expect(upgraded.get('fresh')).toMatchObject({ status: 'completed' });
    upgraded.close();
  });

  test('a request running when the gateway stopped reads `interrupted` after the restart', () => {
    const file = path.join(dir, 'b.db');
    const r = new RequestRecords(10, file);
    begin(r, 'running');
    r.close();
    const again = new RequestRecords(10, file);
    expect(again.get('running')).toMatchObject({ status: 'interrupted', error: { code: 'gateway_interrupted' }, finished_at: expect.any(Number) });
    // A record that settles after its eviction from memory is loaded from the file and saved.
    again.settle('running', receipt('running'), { ok: true });
    again.close();
    const third = new RequestRecords(10, file);
    expect(third.get('running')?.status).toBe('completed');
    third.close();
  });

  test('one gateway a file: a second opener is refused at once, the first keeps working', () => {
    const file = path.join(dir, 'c.db');
    const a = new RequestRecords(10, file);
    begin(a, 'live');
    expect(() => new RequestRecords(10, file)).toThrow(/request records .*c\.db: another gateway uses this file \(one gateway a records file\)$/);
    expect(a.get('live')?.status).toBe('in_progress'); // not marked interrupted by the second opener
    a.fail('live', 'refused', { code: 'no_provider', message: 'x' });
    a.close();
    expect(new RequestRecords(10, file).get('live')?.status).toBe('refused');
  });

  test('a file that fails is reported and the records still change in memory (the file is bookkeeping, never the answer)', () => {
    const errors: string[] = [];
    const r = new RequestRecords(10, path.join(dir, 'd.db'), (e, id, op) => errors.push(`${op} ${id}: ${e.message}`));
    begin(r, 'x');
    expect(r.fileErrors).toBe(0);
    r.close(); // every later read and write fails
    expect(r.fail('x', 'refused', { code: 'no_provider', message: 'x' })?.status).toBe('refused');
    expect(r.get('x')?.status).toBe('refused');
    begin(r, 'y');
    expect(r.settle('y', receipt('y'), { ok: true })).toMatchObject({ status: 'completed', cost_micro_usd: '1234567' });
    r.alias('retry-of-y', 'y');
    expect(r.get('retry-of-y')?.request_id).toBe('y');
    // An id in neither memory nor a readable file is a miss, reported, never an exception.
    expect(r.get('never-seen')).toBeUndefined();
    expect(r.fileErrors).toBe(5);
    expect(errors).toEqual([
      expect.stringMatching(/^write x: .*not open/),
      expect.stringMatching(/^write y: /),
      expect.stringMatching(/^write y: /),
      expect.stringMatching(/^write retry-of-y: /),
      expect.stringMatching(/^read never-seen: /),
    ]);
  });

  test('a failed read or write about an Idempotency-Key names a short hash of it, never the buyer\'s key', () => {
    const errors: string[] = [];
    const r = new RequestRecords(10, path.join(dir, 'keys.db'), (_e, id, op) => errors.push(`${op} ${id}`));
    r.close(); // every later read and write fails
    r.rememberIdempotent('chat/completions\nmy-secret-key', 'cc'.repeat(32), 'req-1');
    expect(r.idempotentProvider('chat/completions\nmy-secret-key')).toBeUndefined();
    expect(errors).toEqual([`write ${keyLabel('chat/completions\nmy-secret-key')}`, `read ${keyLabel('chat/completions\nmy-secret-key')}`]);
    expect(errors.join('\n')).not.toContain('my-secret-key');
    expect(keyLabel('a')).toMatch(/^idempotency-key sha256:[0-9a-f]{16}$/);
  });

  /** A records file that refuses the writes `when` selects (an SQLite trigger on NEW), as a failing disk. */
  function failingFile(name: string, when: string): string {
    const file = path.join(dir, name);
    const db = new Database(file);
    db.exec(`CREATE TABLE request_records (request_id TEXT PRIMARY KEY, record TEXT NOT NULL) WITHOUT ROWID;
      CREATE TABLE request_aliases (request_id TEXT PRIMARY KEY, target TEXT NOT NULL) WITHOUT ROWID;
      CREATE TABLE failures_left (n INTEGER); INSERT INTO failures_left VALUES (2);
      CREATE TRIGGER failing BEFORE INSERT ON request_records WHEN ${when}
        BEGIN UPDATE failures_left SET n = n - 1; SELECT RAISE(FAIL, 'disk I/O error (simulated)'); END;`);
    db.close();
    return file;
  }

  test('a record whose latest change the file lacks is never evicted, so it never reads as older than it is', () => {
    const r = new RequestRecords(3, failingFile('pinned.db', "NEW.request_id LIKE 'unsaved%'"), () => undefined);
    begin(r, 'unsaved'); // the oldest, and not in the file
    for (const id of ['s1', 's2', 's3']) begin(r, id);
    // Over the limit of 3: the oldest record the file has goes, not the older one it lacks.
    expect(r.size).toBe(3);
    expect(r.get('unsaved')).toMatchObject({ status: 'in_progress' });
    expect(r.get('s1')).toMatchObject({ status: 'in_progress' }); // evicted from memory, read from the file
    expect(['unsaved', 's1', 's2', 's3'].filter((id) => r.inMemory(id))).toEqual(['unsaved', 's2', 's3']);
    expect(r.unsavedDropped).toBe(0);
    r.close();
  });

  test('writes the file refused are written once it takes writes again, and the records can then be evicted', () => {
    const file = failingFile('flaky.db', '(SELECT n FROM failures_left) > 0'); // the next two writes fail
    const errors: string[] = [];
    const r = new RequestRecords(2, file, (_e, id, op) => errors.push(`${op} ${id}`));
    begin(r, 'a'); // refused
    r.settle('a', receipt('a'), { ok: true }); // refused
    begin(r, 'b'); // written, and then a's settled record too
    expect(errors).toEqual(['write a', 'write a']);
    for (const id of ['c', 'd']) begin(r, id);
    expect(r.size).toBe(2); // a is in the file now: evictable like any other
    r.close();
    const again = new RequestRecords(2, file);
    expect(again.get('a')).toMatchObject({ status: 'completed', cost_micro_usd: '1234567' });
    expect(again.get('b')?.status).toBe('interrupted');
    again.close();
  });

  test("a settlement job and an Idempotency-Key's provider that the file refused are written once it takes writes again (s25 hS)", () => {
    const file = path.join(dir, 'jobs.db');
    new RequestRecords(2, file).close(); // (its tables)
    const db = new Database(file);
    db.exec(`CREATE TABLE failures_left (n INTEGER); INSERT INTO failures_left VALUES (2);
      CREATE TRIGGER failing_jobs BEFORE INSERT ON unsettled WHEN (SELECT n FROM failures_left) > 0
        BEGIN UPDATE failures_left SET n = n - 1; SELECT RAISE(FAIL, 'disk I/O error (simulated)'); END;
      CREATE TRIGGER failing_keys BEFORE INSERT ON idempotent_providers WHEN (SELECT n FROM failures_left) > 0
        BEGIN UPDATE failures_left SET n = n - 1; SELECT RAISE(FAIL, 'disk I/O error (simulated)'); END;`);
    db.close();
    const errors: string[] = [];
    const r = new RequestRecords(2, file, (_e, id, op) => errors.push(`${op} ${id}`));
    const job: UnsettledJob = { request_id: 'req-j', provider: 'ab'.repeat(32), target: ['/ip4/127.0.0.1/tcp/1'], exp: { provider: 'ab'.repeat(32), requestId: 'req-j', ticketId: 't-j', endpoint: 'chat/completions', model: 'm', bodySha256: '00'.repeat(32), holdMicroUsd: '9', priceVersion: 'p' }, created_at: 0, next_at: 0, tries: 0 };
    r.watch(job); // refused
    r.rememberIdempotent('chat/completions\nsecret-key', 'cd'.repeat(32), 'req-1'); // refused
    expect(errors).toEqual(['write settlement job of req-j', `write ${keyLabel('chat/completions\nsecret-key')}`]);
    begin(r, 'later'); // written, and then the two refused ones
    r.close();
    const again = new RequestRecords(2, file);
    expect(again.dueJobs(Date.now()).map((j) => j.request_id)).toEqual(['req-j']);
    expect(again.idempotentProvider('chat/completions\nsecret-key')).toEqual({ provider: 'cd'.repeat(32), requestId: 'req-1' });
    again.close();
  });

  test('closing tries the refused writes once more, and reports the ones still refused as given up', () => {
    const file = failingFile('closing.db', "NEW.request_id = 'stuck' OR (SELECT n FROM failures_left) > 1");
    const errors: string[] = [];
    const r = new RequestRecords(10, file, (_e, id, op) => errors.push(`${op} ${id}`));
    begin(r, 'late'); // refused: the first of two failures
    begin(r, 'stuck'); // refused, and always will be
    r.close(); // 'late' is written now; 'stuck' is given up, and said so
    expect(errors).toEqual(['write late', 'write stuck', 'write stuck', 'drop stuck']);
    expect(r.unsavedDropped).toBe(1);
    const again = new RequestRecords(10, file);
    expect(again.get('late')?.status).toBe('interrupted');
    expect(again.get('stuck')).toBeUndefined();
    again.close();
  });

  test('a file that stays broken costs bounded memory: beyond `limit` waiting records the oldest change is given up, and said so', () => {
    const errors: string[] = [];
    const r = new RequestRecords(3, path.join(dir, 'broken.db'), (_e, id, op) => errors.push(`${op} ${id}`));
    r.close(); // every write fails from here on
    for (let i = 0; i < 10; i++) begin(r, `r${i}`);
    expect(r.unsavedDropped).toBe(7);
    expect(errors.filter((e) => e.startsWith('drop '))).toEqual(['drop r0', 'drop r1', 'drop r2', 'drop r3', 'drop r4', 'drop r5', 'drop r6']);
    expect(r.size).toBe(3); // the three waiting records; the given-up ones were evicted
    for (const id of ['r7', 'r8', 'r9']) expect(r.get(id)?.status).toBe('in_progress');
  });

  test('a file that is not a database is refused with its path', () => {
    const file = path.join(dir, 'not-a-db');
    fs.writeFileSync(file, 'hello, this is not SQLite '.repeat(100));
    expect(() => new RequestRecords(10, file)).toThrow(/request records .*not-a-db/);
  });
});

describe('Ticketing and the records file', () => {
  test('a request under an Idempotency-Key reads the file once per endpoint, hit or miss; a provider remembered later is answered from memory', async () => {
    const { Ticketing } = await import('../src/gateway/tickets.ts');
    const reads: string[] = [];
    const file = new Map<string, AnsweredAttempt>([['chat/completions\nold', { provider: 'aa'.repeat(32), requestId: 'req-old' }]]);
    const store = {
      idempotentProvider: (k: string) => (reads.push(k), file.get(k)),
      rememberIdempotent: (k: string, provider: string, requestId: string) => void file.set(k, { provider, requestId }),
      forgetIdempotent: (k: string, requestId: string) => void (file.get(k)?.requestId === requestId && file.delete(k)),
    };
    const t = new Ticketing({} as never, store);
    expect([t.isRetry('chat/completions', 'new'), t.isRetry('chat/completions', 'new')]).toEqual([false, false]);
    expect([t.isRetry('chat/completions', 'old'), t.isRetry('chat/completions', 'old')]).toEqual([true, true]);
    // (a miss looks under every paid endpoint: a key reused on another goes back to its provider too)
    expect(reads).toEqual(['chat/completions\nnew', ...['completions', 'responses', 'embeddings'].map((e) => `${e}\nnew`), 'chat/completions\nold']);
    t.remember('chat/completions', 'new', 'bb'.repeat(32), 'req-new');
    expect(t.isRetry('chat/completions', 'new')).toBe(true);
    expect(t.isRetry('embeddings', 'old')).toBe(true); // (answered under chat/completions: its provider refuses it for the other endpoint)
    expect(reads).toHaveLength(6); // (+ 'embeddings\nold', a miss; chat/completions' hit was remembered)
    // An attempt under the key ended cancelled: forgotten (here and in the file) only while it is
    // the attempt kept; one answered since (a retry) keeps the key (s30 review: a late cancelled
    // receipt erased it, and the next retry ran, and was billed, again).
    t.remember('chat/completions', 'new', 'bb'.repeat(32), 'req-retry');
    t.forget('chat/completions\nnew', 'req-new');
    expect(t.isRetry('chat/completions', 'new')).toBe(true);
    t.forget('chat/completions\nnew', 'req-retry');
    expect(t.isRetry('chat/completions', 'new')).toBe(false);
    expect(file.has('chat/completions\nnew')).toBe(false);
    // A key read from the file is forgotten by its own attempt only.
    t.forget('chat/completions\nold', 'req-other');
    expect(t.isRetry('chat/completions', 'old')).toBe(true);
    t.forget('chat/completions\nold', 'req-old');
    expect(t.isRetry('chat/completions', 'old')).toBe(false);
  });
});

describe('Ticketing keeps the attempt that answered under a key as long as nodes keep their records', () => {
  test('without a records file, a key kept in memory is no longer kept after 24 h (its provider, gone since, would refuse its retries for good)', () => {
    let now = 1_000_000;
    const t = new Ticketing({} as never, undefined, undefined, () => now);
    t.remember('chat/completions', 'k', 'aa'.repeat(32), 'req-1');
    now += 24 * 60 * 60 * 1000;
    expect(t.isRetry('chat/completions', 'k')).toBe(true);
    now += 1;
    expect(t.isRetry('chat/completions', 'k')).toBe(false);
  });
});

describe('Ticketing.ticketFor on an Idempotency-Key retry', () => {
  test('a 403 for the first provider is the answer: the market is not asked again for anyone else', async () => {
    const asks: unknown[] = [];
    const market = {
      ticket: async (ask: unknown) => {
        asks.push(ask);
        throw new GatewayError(403, 'price_ceiling_exceeded', 'above the ceiling');
      },
      marketKey: async () => ({ public_key: '00'.repeat(32), key_id: 'k' }),
    } as never;
    const t = new Ticketing(market);
    t.remember('chat/completions', 'idem-1', 'a'.repeat(64), 'req-0');
    const ask = { endpoint: 'chat/completions', model: 'm', bodySha256: 'b'.repeat(64), controls: { routing: {} }, idem: 'idem-1' } as never;
    await expect(t.ticketFor(ask, 'req-1')).rejects.toMatchObject({ code: 'price_ceiling_exceeded' });
    expect(asks).toHaveLength(1);
    expect(asks[0]).toMatchObject({ providers: ['a'.repeat(64)] });
  });
});
