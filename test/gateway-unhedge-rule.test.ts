// runsUnhedged (src/gateway/paid-routes.ts): when a hedged pair that failed is run again, once,
// unhedged and with the whole cap. End to end: gateway-misbehaving.test.ts ("a hedge whose half
// caps cannot start it runs once with the whole cap", and "is not rerun unhedged when its other
// half may have started").
import { describe, expect, test } from 'vitest';
import { runsUnhedged } from '../src/gateway/paid-routes.ts';

const COST = 'request_cost_limit_exceeded';

describe('runsUnhedged: only a refusal that halving the cap can cause earns the run with the whole cap', () => {
  test('both halves refused for their cost, or one for its cost and the other busy or unreachable: run unhedged', () => {
    for (const codes of [[COST, COST], [COST, 'no_capacity'], ['no_capacity', COST], ['provider_unreachable', COST], [COST, undefined]]) {
      expect(runsUnhedged({ halved: true, otherNotStarted: true, codes }), codes.join(' + ')).toBe(true);
    }
  });

  test('refusals the whole cap would meet just the same are the answer: no second run', () => {
    for (const codes of [['no_capacity', 'no_capacity'], ['price_ceiling_exceeded', 'price_ceiling_exceeded'], ['no_capacity', 'provider_unreachable'], ['context_length_exceeded', undefined], [undefined, undefined]]) {
      expect(runsUnhedged({ halved: true, otherNotStarted: true, codes }), codes.join(' + ')).toBe(false);
    }
  });

  test('the other half may have started, or the halves did not halve the cap: no second run', () => {
    expect(runsUnhedged({ halved: true, otherNotStarted: false, codes: [COST, COST] })).toBe(false);
    expect(runsUnhedged({ halved: false, otherNotStarted: true, codes: [COST, COST] })).toBe(false);
  });
});
