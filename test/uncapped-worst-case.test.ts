// The bound a spend-limited key without a cost cap reserves for one request: what it can cost at
// any listed provider of its model (src/gateway/paid-routes.ts uncappedWorstCase).
import { describe, expect, test } from 'vitest';
import type { ProviderEntry } from '../src/gateway/market-client.ts';
import { uncappedWorstCase } from '../src/gateway/paid-routes.ts';

const entry = (provider: string, context: number | undefined, rates?: { input_per_mtok: string; output_per_mtok: string }): ProviderEntry => ({
  provider: provider.repeat(64),
  peer_id: 'p',
  addresses: [],
  models: [{ id: 'm', ...(context === undefined ? {} : { context }) }],
  ...(rates ? { rates: { m: rates } } : {}),
});

describe('uncappedWorstCase', () => {
  const listing = [entry('a', 512, { input_per_mtok: '150000', output_per_mtok: '600000' }), entry('b', 4096, { input_per_mtok: '700000', output_per_mtok: '100000' }), entry('c', 100_000)];
  test('text: the largest context × higher rate over the priced providers, rounded up; twice that for a hedge', () => {
    // a: 512 × 0.6 = 307.2 → 308; b: 4096 × 0.7 = 2867.2 → 2868; c has no price.
    expect(uncappedWorstCase(listing, 'chat/completions', 'm', new Uint8Array(10), false)).toBe(2868n);
    expect(uncappedWorstCase(listing.slice(0, 1), 'completions', 'm', new Uint8Array(10), false)).toBe(308n);
    expect(uncappedWorstCase(listing, 'responses', 'm', new Uint8Array(10), true)).toBe(5736n);
  });
  test('a hedge where one provider prices the model runs once: not doubled', () => {
    expect(uncappedWorstCase(listing.slice(0, 1), 'chat/completions', 'm', new Uint8Array(10), true)).toBe(308n);
    expect(uncappedWorstCase([listing[1]!, listing[2]!], 'chat/completions', 'm', new Uint8Array(10), true)).toBe(2868n); // (c has no price)
  });
  test('embeddings: a token a byte of the body at the highest input rate, never doubled', () => {
    expect(uncappedWorstCase(listing, 'embeddings', 'm', new Uint8Array(1000), false)).toBe(700n);
    expect(uncappedWorstCase(listing, 'embeddings', 'm', new Uint8Array(1000), true)).toBe(700n);
  });
  test('no provider prices the model (or knows its context): no bound', () => {
    expect(uncappedWorstCase([entry('c', 100_000)], 'chat/completions', 'm', new Uint8Array(1), false)).toBeUndefined();
    expect(uncappedWorstCase([entry('d', undefined, { input_per_mtok: '1', output_per_mtok: '1' })], 'chat/completions', 'm', new Uint8Array(1), false)).toBeUndefined();
    expect(uncappedWorstCase(listing, 'chat/completions', 'other', new Uint8Array(1), false)).toBeUndefined();
  });
});
