// The gateway's request records: in memory, and written through to SQLite when given a file.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import type { ReceiptPayload } from '../attestation/receipt.ts';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import { RequestRecords } from '../src/gateway/records.ts';

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
    again.close();
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
    expect(() => new RequestRecords(10, file)).toThrow(/request records .*c\.db: database is locked/);
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

  test('a record whose latest change the file lacks is never evicted, so it never reads as older than it is', () => {
    const r = new RequestRecords(2, path.join(dir, 'e.db'), () => undefined);
    begin(r, 'saved');
    r.close(); // the file fails from here on
    for (const id of ['a', 'b', 'c']) begin(r, id);
    r.settle('a', receipt('a'), { ok: true });
    // Over the limit of 2: only 'saved' (in the file) could go; the unsaved ones all stay.
    expect(r.size).toBe(3);
    expect(r.get('a')).toMatchObject({ status: 'completed' });
    for (const id of ['b', 'c']) expect(r.get(id)).toMatchObject({ status: 'in_progress' });
    expect(r.get('saved')).toBeUndefined(); // evicted, and the file cannot be read: a miss
  });

  test('a file that is not a database is refused with its path', () => {
    const file = path.join(dir, 'not-a-db');
    fs.writeFileSync(file, 'hello, this is not SQLite '.repeat(100));
    expect(() => new RequestRecords(10, file)).toThrow(/request records .*not-a-db/);
  });
});
