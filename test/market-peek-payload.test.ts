// The market reads an unverified payload only for the key and ticket it claims, and not at all when
// it nests deeply (JSON.parse of MiBs of nesting cost ~250 ms a request; s29 review).
import { expect, test } from 'vitest';
import { toBase64, utf8 } from '../attestation/bytes.ts';
import { peekPayload } from '../attestation/signed-payload.ts';
import { PEEK_MAX_DEPTH, peekShallow } from '../src/market/peek-payload.ts';

const env = (text: string) => ({ payload: toBase64(utf8(text)) });

test('a payload is read for its claims unless it nests deeper than PEEK_MAX_DEPTH; what cannot be read is undefined', () => {
  const provider = 'ab'.repeat(32);
  expect(peekShallow(env(JSON.stringify({ provider, models: [{ id: 'a' }] })))).toEqual({ provider, models: [{ id: 'a' }] });
  const nested = (depth: number) => `{"provider":"${provider}","x":${'['.repeat(depth - 1)}${']'.repeat(depth - 1)}}`;
  expect(peekShallow(env(nested(PEEK_MAX_DEPTH)))).toMatchObject({ provider });
  expect(peekShallow(env(nested(PEEK_MAX_DEPTH + 1)))).toBeUndefined();
  expect(peekShallow(env('['.repeat(1_000_000) + ']'.repeat(1_000_000)))).toBeUndefined();
  // Brackets inside strings are text, not nesting.
  expect(peekShallow(env(JSON.stringify({ provider, note: '['.repeat(100) })))).toMatchObject({ provider });
  for (const bad of [{ payload: 'not base64!' }, { payload: 7 }, env('not json'), env('[1]')]) expect(peekShallow(bad as never)).toBeUndefined();
});

test('peekPayload never throws: no envelope, a payload that is not a string, a getter that throws are all undefined', () => {
  const evil = { get payload(): string { throw new Error('boom'); } };
  for (const env of [undefined, null, {}, { payload: 7 }, evil]) expect(peekPayload(env as never)).toBeUndefined();
  expect(peekPayload(env(JSON.stringify({ seq: '3' })))).toEqual({ seq: '3' });
});
