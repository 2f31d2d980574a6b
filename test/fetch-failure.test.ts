// fetchFailure: why a fetch threw, in a word (undici's "fetch failed" hides the cause).
import { describe, expect, test } from 'vitest';
import { fetchFailure } from '../src/fetch-failure.ts';

describe('fetchFailure', () => {
  test('the cause\'s code, a timeout, the cause\'s message, else the error\'s own', async () => {
    // Real: nothing listens on port 2 of loopback.
    expect(fetchFailure(await fetch('http://127.0.0.1:2/').catch((e: unknown) => e))).toBe('ECONNREFUSED');
    expect(fetchFailure(await fetch('http://127.0.0.1:6000/').catch((e: unknown) => e))).toBe('bad port'); // (a cause with a message, no code)
    expect(fetchFailure(new DOMException('The operation was aborted due to timeout', 'TimeoutError'))).toBe('no answer in time');
    expect(fetchFailure(new Error('something else'))).toBe('something else');
    expect(fetchFailure(new Error(''))).toBe('no answer');
    expect(fetchFailure(null)).toBe('no answer');
  });
});
