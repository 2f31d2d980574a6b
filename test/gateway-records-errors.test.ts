// The gateway's records-file failures, said at a bounded rate (s25 hS: a full disk gave one error
// line a request).
import { describe, expect, test } from 'vitest';
import { recordsFileErrors, RECORDS_FILE_ERROR } from '../src/gateway/records-errors.ts';

describe('records file errors', () => {
  test('each kind is said at once, then at most once per interval with how many were not said; kinds do not hide each other', () => {
    const lines: { fields: Record<string, unknown>; msg: string }[] = [];
    let t = 0;
    const say = recordsFileErrors({ error: (fields, msg) => lines.push({ fields, msg }) }, 10_000, () => t);
    const full = new Error('SQLITE_FULL: database or disk is full');
    for (let i = 0; i < 500; i++) say(full, `req-${i}`, 'write');
    expect(lines).toEqual([{ fields: { request_id: 'req-0', op: 'write', err: full.message }, msg: RECORDS_FILE_ERROR.write }]);
    say(new Error('given up'), 'req-x', 'drop');
    expect(lines.at(-1)).toEqual({ fields: { request_id: 'req-x', op: 'drop', err: 'given up' }, msg: RECORDS_FILE_ERROR.drop });
    t += 10_000;
    say(full, 'req-500', 'write');
    expect(lines.at(-1)).toEqual({ fields: { request_id: 'req-500', op: 'write', err: full.message, failures_since_last_line: 499 }, msg: RECORDS_FILE_ERROR.write });
    expect(lines).toHaveLength(3);
  });
});
