import fs from 'node:fs';
import { describe, expect, test } from 'vitest';
import { canonicalize, canonicalBytes, parseCanonical, CanonicalJsonError } from '../attestation/canonical-json.ts';
import { vectorPath } from './helpers/vectors.ts';

const dir = vectorPath('jcs', 'cyberphone-json-canonicalization');
const names = fs.readdirSync(`${dir}/input`).filter((n) => n.endsWith('.json'));

describe('RFC 8785 vectors (cyberphone/json-canonicalization)', () => {
  test('all six vectors are present', () => {
    expect(names.sort()).toEqual(['arrays.json', 'french.json', 'structures.json', 'unicode.json', 'values.json', 'weird.json']);
  });
  test.each(names)('%s canonicalises byte for byte', (name) => {
    const input = JSON.parse(fs.readFileSync(`${dir}/input/${name}`, 'utf8'));
    const expected = fs.readFileSync(`${dir}/output/${name}`);
    const hex = fs.readFileSync(`${dir}/outhex/${name.replace('.json', '.txt')}`, 'utf8').replace(/\s+/g, '');
    const got = canonicalBytes(input);
    expect(Buffer.from(got).equals(expected)).toBe(true);
    expect(Buffer.from(got).toString('hex')).toBe(hex);
    // The canonical output is a fixed point and is recognised as canonical.
    expect(parseCanonical(expected.toString('utf8'))).toEqual({ value: input, canonical: true });
  });
});

describe('canonicalize', () => {
  test('sorts keys by UTF-16 code units at every level', () => {
    expect(canonicalize({ b: 1, a: { d: [3, { z: 1, y: 2 }], c: null } })).toBe('{"a":{"c":null,"d":[3,{"y":2,"z":1}]},"b":1}');
    // U+E000 sorts after U+D83D (a surrogate) in UTF-16 order, before it in code point order.
    expect(canonicalize({ '\uE000': 1, '\u{1F600}': 2 })).toBe('{"\u{1F600}":2,"\uE000":1}');
  });
  test('numbers use the ECMAScript shortest form; -0 is 0', () => {
    expect(canonicalize([1e21, 1e-7, -0, 0.1 + 0.2, 100, 4.5])).toBe('[1e+21,1e-7,0,0.30000000000000004,100,4.5]');
  });
  test('refuses what JSON cannot carry exactly', () => {
    for (const bad of [NaN, Infinity, 10n, () => 1, Symbol('x'), new Date(0), new Map(), '\uD800', { k: '\uDC00x' }]) {
      expect(() => canonicalize(bad)).toThrow(CanonicalJsonError);
    }
  });
  test('refuses absurd nesting instead of overflowing the stack', () => {
    let v: unknown = 1;
    for (let i = 0; i < 200; i++) v = [v];
    expect(() => canonicalize(v)).toThrow(/nesting/);
  });
  test('parseCanonical tells non-canonical text apart', () => {
    expect(parseCanonical('{"a":1,"b":2}')?.canonical).toBe(true);
    expect(parseCanonical('{"b":2,"a":1}')?.canonical).toBe(false);
    expect(parseCanonical('{"a": 1}')?.canonical).toBe(false);
    expect(parseCanonical('{"a":1,"a":1}')?.canonical).toBe(false); // duplicate key
    expect(parseCanonical('{"a":1.0}')?.canonical).toBe(false);
    expect(parseCanonical('{"a":"\\u0041"}')?.canonical).toBe(false);
    expect(parseCanonical('{"a":1')).toBeUndefined();
    // Nested deeper than the check walks: not canonical, with the reason.
    const deep = '['.repeat(200) + ']'.repeat(200);
    expect(parseCanonical(deep)).toMatchObject({ canonical: false, why: 'nesting deeper than 128 levels' });
    expect(parseCanonical('{"b":2,"a":1}')?.why).toBeUndefined();
  });
});

describe('lone surrogates', () => {
  test('an escaped lone surrogate in text is never canonical; an escaped backslash before "ud800" is fine', () => {
    expect(parseCanonical('{"a":"\\ud800"}')?.canonical).toBe(false);
    expect(parseCanonical('{"a":"\\\\ud800"}')?.canonical).toBe(true);
    expect(parseCanonical('{"a":"\u{1F600}"}')?.canonical).toBe(true);
    expect(parseCanonical('{"a":"\\ud83d\\ude00"}')?.canonical).toBe(false); // a pair is written raw
  });
});
