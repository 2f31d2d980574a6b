import { describe, expect, test } from 'vitest';
import { utf8 } from '../attestation/bytes.ts';
import { MAX_JSON_DEPTH, nestsDeeperThan } from '../src/json-depth.ts';
import { ContractError, parseRequest } from '../src/serve/contract.ts';

// (padded past 64 KiB, to show that large bodies are scanned like small ones)
const pad = ' '.repeat(70_000);
const nested = (depth: number, inner = '0') => utf8(`${pad}{"a":${'['.repeat(depth - 1)}${inner}${']'.repeat(depth - 1)}}`);

describe('nestsDeeperThan', () => {
  test('counts objects and arrays; MAX_JSON_DEPTH levels pass, one more does not', () => {
    expect(nestsDeeperThan(nested(MAX_JSON_DEPTH))).toBe(false);
    expect(nestsDeeperThan(nested(MAX_JSON_DEPTH + 1))).toBe(true);
    expect(nestsDeeperThan(utf8(`${pad}${'{"a":'.repeat(6)}1${'}'.repeat(6)}`), 5)).toBe(true);
    expect(nestsDeeperThan(utf8(`${pad}[[],[],[[]]]`), 3)).toBe(false);
  });

  test('brackets inside strings, escaped quotes and backslashes, and non-ASCII text do not count', () => {
    expect(nestsDeeperThan(utf8(`${pad}["${'['.repeat(2000)}"]`), 3)).toBe(false);
    expect(nestsDeeperThan(utf8(`${pad}["\\"${'{'.repeat(2000)}"]`), 3)).toBe(false);
    expect(nestsDeeperThan(utf8(`${pad}["\\\\",${'['.repeat(5)}${']'.repeat(5)}]`), 3)).toBe(true);
    expect(nestsDeeperThan(utf8(`${pad}["é😀[[[[", {"b": "ü"}]`), 2)).toBe(false);
  });

  test('small bodies are held to the same limit (s25 hT: a 4 KB body 600 deep was parsed and billed)', () => {
    expect(nestsDeeperThan(utf8('['.repeat(6) + ']'.repeat(6)), 5)).toBe(true);
    expect(nestsDeeperThan(utf8('['.repeat(5) + ']'.repeat(5)), 5)).toBe(false);
    expect(nestsDeeperThan(utf8(`{"a":${'['.repeat(600)}${']'.repeat(600)}}`))).toBe(true);
  });
});

test("the node's contract refuses a body nested past the limit before parsing it, naming the limit", () => {
  const body = utf8(`{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":{"a":${'['.repeat(4_000_000)}${']'.repeat(4_000_000)}}}`);
  let err: unknown;
  try {
    parseRequest('chat/completions', body);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(ContractError);
  expect((err as Error).message).toContain(`body nests objects and arrays more than ${MAX_JSON_DEPTH} deep`);
  // At the limit (the body's own object and MAX_JSON_DEPTH - 1 arrays), the same shape is parsed
  // and judged by the contract on its fields.
  const at = (arrays: number) => () => parseRequest('chat/completions', utf8(`{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":${'['.repeat(arrays)}${']'.repeat(arrays)}${pad}}`));
  expect(at(MAX_JSON_DEPTH - 1)).toThrow(ContractError);
  expect(at(MAX_JSON_DEPTH - 1)).not.toThrow(/nests/);
  expect(at(MAX_JSON_DEPTH)).toThrow(/nests/);
});
