import crypto from 'node:crypto';
import { describe, expect, test } from 'vitest';
import { LENIENT_BASE64, base64Candidates } from './helpers/base64-cases.ts';
import { fromBase64, fromHex, fromUtf8, isHex, toBase64, toHex } from '../attestation/bytes.ts';

describe('base64 is strict: one accepted encoding per byte string', () => {
  test('round trips and matches Node for random lengths', () => {
    for (let n = 0; n < 70; n++) {
      const b = new Uint8Array(crypto.randomBytes(n));
      const s = toBase64(b);
      expect(s).toBe(Buffer.from(b).toString('base64'));
      expect(Buffer.from(fromBase64(s)!).equals(Buffer.from(b))).toBe(true);
    }
  });
  test('refuses lenient forms', () => {
    for (const bad of LENIENT_BASE64) expect(fromBase64(bad), bad).toBeUndefined();
    expect(fromBase64('')).toEqual(new Uint8Array(0));
  });
  test('the bytes are the caller\'s own array (no shared pool slab behind them)', () => {
    const key = fromBase64(toBase64(new Uint8Array(32).fill(7)))!;
    expect([key.byteOffset, key.buffer.byteLength]).toEqual([0, 32]);
  });
  test('accepts exactly the strings that are the canonical encoding of their bytes (fuzz)', () => {
    let accepted = 0;
    for (const { s, canonical } of base64Candidates(20000)) {
      const got = fromBase64(s);
      expect(got !== undefined, JSON.stringify(s)).toBe(canonical);
      if (got) accepted++;
    }
    expect(accepted).toBeGreaterThan(0);
  });
});

describe('hex is lowercase and exact', () => {
  test('round trip', () => {
    const b = new Uint8Array(crypto.randomBytes(33));
    expect(fromHex(toHex(b))).toEqual(b);
  });
  test('refuses upper case, odd length, other characters', () => {
    // Characters beyond ASCII too: a table indexed by char code must not wrap or overflow.
    for (const bad of ['A0', 'abc', 'zz', ' 00', 'a\u00e1', '\u0130a', '\u{1F600}']) expect(() => fromHex(bad)).toThrow(TypeError);
    expect(isHex('ab'.repeat(32), 32)).toBe(true);
    expect(isHex('AB'.repeat(32), 32)).toBe(false);
    expect(isHex('ab', 32)).toBe(false);
  });
});

describe('UTF-8 decoding is strict and keeps every byte', () => {
  test('malformed is undefined; a BOM is kept', () => {
    expect(fromUtf8(Uint8Array.of(0xff))).toBeUndefined();
    expect(fromUtf8(Uint8Array.of(0xed, 0xa0, 0x80))).toBeUndefined(); // encoded surrogate
    expect(fromUtf8(Uint8Array.of(0xef, 0xbb, 0xbf, 0x41))).toBe('\uFEFFA');
  });
});
