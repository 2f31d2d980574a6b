// The routing controls a buyer set (X-Service-*), as the marketplace resolved them into the
// ticket, checked again at the node against what it really offers. A request the node cannot
// honour is refused before any work, and so before any charge.
import { ATTESTATION_TIERS, type AttestationTier } from '../../attestation/receipt.ts';
import type { Rates } from '../../attestation/money.ts';
import { computeCost } from '../../attestation/money.ts';
import type { TicketRouting } from '../../attestation/ticket.ts';

export interface Offer {
  contextLength: number;
  /** Canonical bucket: lowercase, "_" → "-". */
  quantization: string;
  /** Measured sustained throughput, tokens per second. */
  tokensPerSecond: number;
  tier: AttestationTier;
  rates: Rates;
}

export interface Need {
  inputTokens: number;
  /** Output tokens the request asks for at most (its max_tokens, or what the context leaves). */
  maxOutputTokens: number;
  /** Tokens that must fit in the context at once (default input + output; embeddings: the longest input). */
  contextNeed?: number;
}

export interface Refusal {
  status: 400 | 403 | 503;
  code: 'context_length_exceeded' | 'routing_unsatisfied' | 'price_ceiling_exceeded' | 'request_cost_limit_exceeded';
  message: string;
}

export function quantizationBucket(q: string): string {
  return q.trim().toLowerCase().replaceAll('_', '-');
}

const tierRank = (t: AttestationTier) => ATTESTATION_TIERS.indexOf(t);

/**
 * The representative request of a text model, which X-Service-Max-Representative-Request-Price-Usd
 * bounds (the spec's pricing.representative_request_au; it does not say what the request is):
 * 1,000 input and 1,000 output tokens.
 */
const REPRESENTATIVE_REQUEST = { input_tokens: 1000, output_tokens: 1000 } as const;
/** How the representative request is named in refusals. */
export const REPRESENTATIVE_REQUEST_TEXT = `the representative request (${REPRESENTATIVE_REQUEST.input_tokens.toLocaleString('en-US')} input + ${REPRESENTATIVE_REQUEST.output_tokens.toLocaleString('en-US')} output tokens)`;

/** What the representative request costs at these rates. */
export function representativePrice(rates: Rates): bigint {
  return computeCost(REPRESENTATIVE_REQUEST, rates);
}

/** The worst case a request can cost: all its input and every output token it may generate. */
export function worstCaseCost(need: Need, rates: Rates): bigint {
  return computeCost({ input_tokens: need.inputTokens, output_tokens: need.maxOutputTokens }, rates);
}

/**
 * The most a text request can cost at a context, whatever its split of input and output (the two
 * together never exceed the context): ceil(context × max(in, out rate) / 10^6). The market's
 * hold without a cap; the gateway's bound for a spend-limited key's request without one.
 */
export function contextWorstCase(context: number, rates: Rates): bigint {
  const rate = rates.input_per_mtok > rates.output_per_mtok ? rates.input_per_mtok : rates.output_per_mtok;
  return (BigInt(context) * rate + 999_999n) / 1_000_000n;
}

/**
 * What a text request needs, as the node judges it: all its input, and max_tokens as asked or,
 * without it, whatever room the context leaves (at least one token, so that an input that fills the
 * context is refused as too long rather than served with no room to answer).
 */
export function textNeed(inputTokens: number, maxTokens: number | undefined, contextLength: number): Need {
  return { inputTokens, maxOutputTokens: Math.max(1, maxTokens ?? contextLength - inputTokens) };
}

/** A request that does not fit a context of `contextLength` tokens: 400 context_length_exceeded. */
export function contextUnfit(contextLength: number, need: Need): Refusal | undefined {
  if (need.contextNeed !== undefined) {
    if (need.contextNeed > contextLength) {
      return { status: 400, code: 'context_length_exceeded', message: `an input of ${need.contextNeed} tokens exceeds the model's context of ${contextLength}` };
    }
  } else if (need.inputTokens + need.maxOutputTokens > contextLength) {
    return { status: 400, code: 'context_length_exceeded', message: `input (${need.inputTokens}) plus output (${need.maxOutputTokens}) tokens exceed the model's context of ${contextLength}` };
  }
  return undefined;
}

/** A provider that is stopping takes no new work (the marketplace's and the gateway's reason). */
export const NOT_ACCEPTING: Refusal = { status: 503, code: 'routing_unsatisfied', message: 'not accepting work (the node is stopping, or cannot take paid work now)' };
/** A node that takes no paid work for one of its models now (its model file changed under it); its other models go on. */
export const MODEL_NOT_ACCEPTING: Refusal = { status: 503, code: 'routing_unsatisfied', message: 'not accepting work for this model now (the node must restart to serve it again)' };

/** Undefined when the node can serve the request as asked; otherwise the first reason it cannot. */
export function checkRouting(offer: Offer, routing: TicketRouting, need: Need): Refusal | undefined {
  const unfit = contextUnfit(offer.contextLength, need);
  if (unfit) return unfit;
  const unmet = checkOffer(offer, routing);
  if (unmet) return unmet;
  if (routing.max_cost_micro_usd !== undefined) {
    const worst = worstCaseCost(need, offer.rates);
    if (worst > BigInt(routing.max_cost_micro_usd)) {
      return { status: 403, code: 'request_cost_limit_exceeded', message: `the request's worst case ${worst} micro-USD is above the cost cap ${routing.max_cost_micro_usd}` };
    }
  }
  return undefined;
}

/**
 * The routing controls that judge the offer alone, whatever the request: minimum context,
 * quantization, throughput and tier, and the three price ceilings. The marketplace and the gateway
 * judge a listing with this before they know the request's tokens; the node judges it again.
 */
export function checkOffer(offer: Offer, routing: TicketRouting): Refusal | undefined {
  if (routing.min_context !== undefined && offer.contextLength < routing.min_context) {
    return { status: 503, code: 'routing_unsatisfied', message: `context ${offer.contextLength} is below ${routing.min_context}, the requested minimum` };
  }
  if (routing.quantization !== undefined && quantizationBucket(routing.quantization) !== offer.quantization) {
    return { status: 503, code: 'routing_unsatisfied', message: `quantization is ${offer.quantization}, not ${quantizationBucket(routing.quantization)}` };
  }
  if (routing.min_tokens_per_second !== undefined && offer.tokensPerSecond < routing.min_tokens_per_second) {
    return { status: 503, code: 'routing_unsatisfied', message: `measured throughput ${offer.tokensPerSecond} tokens/s is below ${routing.min_tokens_per_second}` };
  }
  if (routing.min_attestation_tier !== undefined && tierRank(offer.tier) < tierRank(routing.min_attestation_tier)) {
    return { status: 503, code: 'routing_unsatisfied', message: `attestation tier ${offer.tier} is below ${routing.min_attestation_tier}` };
  }
  const ceilings: [string | undefined, bigint, string][] = [
    [routing.max_input_price_micro_usd_per_mtok, offer.rates.input_per_mtok, 'input price'],
    [routing.max_output_price_micro_usd_per_mtok, offer.rates.output_per_mtok, 'output price'],
  ];
  for (const [ceiling, price, what] of ceilings) {
    if (ceiling !== undefined && price > BigInt(ceiling)) {
      return { status: 403, code: 'price_ceiling_exceeded', message: `${what} ${price} micro-USD per million tokens is above the ceiling ${ceiling}` };
    }
  }
  if (routing.max_request_price_micro_usd !== undefined) {
    const representative = representativePrice(offer.rates);
    if (representative > BigInt(routing.max_request_price_micro_usd)) {
      return { status: 403, code: 'price_ceiling_exceeded', message: `${REPRESENTATIVE_REQUEST_TEXT} costs ${representative} micro-USD, above the ceiling ${routing.max_request_price_micro_usd}` };
    }
  }
  return undefined;
}
