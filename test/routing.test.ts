import { describe, expect, test } from 'vitest';
import { checkOffer, checkRouting, quantizationBucket, representativePrice, textNeed, worstCaseCost, type Offer } from '../src/dispatch/routing.ts';
import type { TicketRouting } from '../attestation/ticket.ts';

const offer: Offer = { contextLength: 2048, quantization: 'q4-k-m', tokensPerSecond: 1500, tier: 'T2', rates: { input_per_mtok: 150_000n, output_per_mtok: 600_000n } };
const need = { inputTokens: 100, maxOutputTokens: 400 };
const code = (routing: object, n = need) => checkRouting(offer, routing, n)?.code ?? 'ok';

describe('routing controls at the node', () => {
  test('a request within every control passes', () => {
    expect(code({})).toBe('ok');
    expect(code({ min_context: 2048, quantization: 'Q4_K_M', min_tokens_per_second: 1500, min_attestation_tier: 'T2', max_input_price_micro_usd_per_mtok: '150000', max_output_price_micro_usd_per_mtok: '600000', max_cost_micro_usd: String(worstCaseCost(need, offer.rates)) })).toBe('ok');
  });
  test('context: the effective floor is never below input + output need', () => {
    expect(checkRouting(offer, {}, { inputTokens: 2000, maxOutputTokens: 49 })).toMatchObject({ status: 400, code: 'context_length_exceeded' });
    expect(code({}, { inputTokens: 2000, maxOutputTokens: 48 })).toBe('ok');
    expect(checkRouting(offer, { min_context: 4096 }, need)).toMatchObject({ status: 503, code: 'routing_unsatisfied' });
  });
  test('quantization bucket, throughput, tier', () => {
    expect(quantizationBucket(' Q8_0 ')).toBe('q8-0');
    expect(code({ quantization: 'q8_0' })).toBe('routing_unsatisfied');
    expect(code({ min_tokens_per_second: 1500.5 })).toBe('routing_unsatisfied');
    expect(code({ min_attestation_tier: 'T3' })).toBe('routing_unsatisfied');
    expect(code({ min_attestation_tier: 'T1' })).toBe('ok');
  });
  test('price ceilings are 403 price_ceiling_exceeded, the cost cap 403 request_cost_limit_exceeded', () => {
    expect(checkRouting(offer, { max_input_price_micro_usd_per_mtok: '149999' }, need)).toMatchObject({ status: 403, code: 'price_ceiling_exceeded' });
    expect(code({ max_output_price_micro_usd_per_mtok: '599999' })).toBe('price_ceiling_exceeded');
    const worst = worstCaseCost(need, offer.rates); // ceil((100·150000 + 400·600000) / 10^6) = 255
    expect(worst).toBe(255n);
    // The representative request (1,000 in + 1,000 out) costs 150 + 600 = 750 micro-USD here,
    // whatever this request's own size: the ceiling judges the price, not the request.
    expect(representativePrice(offer.rates)).toBe(750n);
    expect(code({ max_request_price_micro_usd: '749' })).toBe('price_ceiling_exceeded');
    expect(code({ max_request_price_micro_usd: '750' })).toBe('ok');
    expect(code({ max_request_price_micro_usd: '750' }, { inputTokens: 1500, maxOutputTokens: 500 })).toBe('ok'); // a bigger request, same price
    expect(checkRouting(offer, { max_cost_micro_usd: String(worst - 1n) }, need)).toMatchObject({ status: 403, code: 'request_cost_limit_exceeded' });
    expect(code({ max_cost_micro_usd: String(worst) })).toBe('ok');
  });
});

describe('what a text request needs (textNeed), as the node, the gateway and estimates judge it', () => {
  test('max_tokens as asked; without it, the room the context leaves, and never less than one token', () => {
    expect(textNeed(100, 20, 2048)).toEqual({ inputTokens: 100, maxOutputTokens: 20 });
    expect(textNeed(100, undefined, 2048)).toEqual({ inputTokens: 100, maxOutputTokens: 1948 });
    expect(code({}, textNeed(2047, undefined, 2048))).toBe('ok');
    // An input that fills the context leaves no room to answer: too long, not an answer of nothing.
    expect(textNeed(2048, undefined, 2048)).toEqual({ inputTokens: 2048, maxOutputTokens: 1 });
    expect(checkRouting(offer, {}, textNeed(2048, undefined, 2048))).toMatchObject({ status: 400, code: 'context_length_exceeded' });
    expect(checkRouting(offer, {}, textNeed(3000, undefined, 2048))).toMatchObject({ status: 400, code: 'context_length_exceeded' });
  });
  test('checkOffer judges the offer alone: the same verdicts as checkRouting on a request that fits, whatever its size', () => {
    const controls: TicketRouting[] = [{}, { min_context: 4096 }, { quantization: 'q8_0' }, { min_tokens_per_second: 2000 }, { min_attestation_tier: 'T3' }, { max_input_price_micro_usd_per_mtok: '1' }, { max_request_price_micro_usd: '749' }, { max_cost_micro_usd: '1' }];
    for (const r of controls) {
      const viaRouting = checkRouting(offer, r, need);
      expect(checkOffer(offer, r)?.code, JSON.stringify(r)).toBe(viaRouting?.code === 'request_cost_limit_exceeded' ? undefined : viaRouting?.code);
    }
  });
});
