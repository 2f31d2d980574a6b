// EstimateStore (src/gateway/estimates.ts): estimates live ten minutes, and at most `max` are kept
// however fast a buyer asks for them (the oldest forgotten first), with no scan of them all per add.
import { describe, expect, test } from 'vitest';
import { EstimateStore } from '../src/gateway/estimates.ts';

const fields = { endpoint: 'chat/completions', model: 'm', bodySha256: '00'.repeat(32), routing: '{}', keyId: null, provider: 'ab'.repeat(32), priceVersion: 'p', inputTokens: 1, maxOutputTokens: 1, expectedMicroUsd: 1n, maxHoldMicroUsd: 2n };

describe('EstimateStore', () => {
  test('an estimate lives ten minutes', () => {
    let t = 1_000_000;
    const s = new EstimateStore(() => t);
    const e = s.add(fields);
    expect(e.estimateId).toMatch(/^est_[0-9a-f]{24}$/);
    t += 10 * 60_000 - 1;
    expect(s.get(e.estimateId)).toEqual(e);
    t += 1;
    expect(s.get(e.estimateId)).toBeUndefined();
  });

  test('at most `max` are kept: the oldest is forgotten first; expired ones go as new ones come', () => {
    let t = 0;
    const s = new EstimateStore(() => t, 3);
    const ids = Array.from({ length: 5 }, () => s.add(fields).estimateId);
    expect(ids.map((id) => s.get(id) !== undefined)).toEqual([false, false, true, true, true]);
    t += 10 * 60_000; // all expired
    const fresh = s.add(fields).estimateId;
    expect(ids.map((id) => s.get(id) !== undefined)).toEqual([false, false, false, false, false]);
    expect(s.get(fresh)).toBeDefined();
    expect((s as unknown as { byId: Map<string, unknown> }).byId.size).toBe(1);
  });
});
