// The gateway's hold for an embeddings request: the body's length (a bound on its tokens) at the
// highest input rate among the providers that may serve it, whichever order the listing has.
import { describe, expect, test } from 'vitest';
import { embeddingsHold } from '../src/gateway/tickets.ts';

describe('embeddingsHold', () => {
  test('the hold is the body length at the HIGHEST input rate among the listing, whatever the order', () => {
    const body = new Uint8Array(1_000_000);
    const listing = [
      { rates: { m: { input_per_mtok: '1000', output_per_mtok: '0' } } },
      { rates: { m: { input_per_mtok: '5000', output_per_mtok: '0' } } },
      { rates: { m: { input_per_mtok: '3000', output_per_mtok: '0' } } },
    ] as never;
    expect(embeddingsHold(listing, 'm', body)).toBe('5000');
  });
});
