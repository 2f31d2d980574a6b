// TokenLedger: a token is handed over with the chunk that sends the end of its text, and not before.
import { expect, test } from 'vitest';
import { groupEnd, TokenLedger } from '../adapters/token-ledger.ts';

test('tokens are released once all their text is sent; held text keeps them; a stop\'s tokens are the rest', () => {
  const l = new TokenLedger();
  l.add(1);
  l.decoded('quee'); // token 1: "quee"
  expect(l.sent(2)).toEqual([]); // "qu" out, "ee" held (a possible stop)
  l.add(2);
  l.decoded(' lit'); // token 2: " lit"
  expect(l.sent(6)).toEqual([1, 2]); // "ee lit" out
  l.add(3);
  l.add(4); // a character not complete yet: no end known
  expect(l.sent(0)).toEqual([]);
  l.decoded('\uFFFD p', [1]); // token 3 ends with its U+FFFD, token 4 with " p"
  expect(l.sent(1)).toEqual([3]);
  l.add(5);
  l.decoded('e!');
  expect(l.sent(2)).toEqual([4]); // (" p" then "e" of a stop "e!": token 5 ends in the stop)
  expect(l.rest()).toEqual([5]);
  expect(l.sent(10)).toEqual([]);
});

test('groupEnd: where a token decoded with others ends', () => {
  // A byte that is no character's start: its U+FFFD stays, and it ends there.
  expect(groupEnd('a\uFFFD', 'a\uFFFD pu', 0)).toBe(2);
  // The first bytes of a character: it ends with the character (one unit, or two for an astral one).
  expect(groupEnd('\uFFFD', '中x', 0)).toBe(1);
  expect(groupEnd('\uFFFD', '😀x', 0)).toBe(2);
  // Never before the token before it.
  expect(groupEnd('\uFFFD', '中x', 2)).toBe(2);
  // A prefix that is not the text's start, or does not end in U+FFFD: the whole text.
  expect(groupEnd('b\uFFFD', 'a\uFFFD pu', 0)).toBe(5);
  expect(groupEnd('ab', 'abc', 0)).toBe(3);
});
