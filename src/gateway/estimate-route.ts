// POST /v1/estimates: what a request would cost, without a hold or a charge (see estimates.ts).
// The body is checked against the same contract as execution, the input counted by a live
// provider's own tokenizer, and the request judged as that node would judge it (context and
// price ceilings: checkRouting); the estimate's maximum is the worst case at the provider's rates.
import type { FastifyInstance } from 'fastify';
import { formatUsd } from '../../attestation/money.ts';
import { ratesFromWire } from '../../attestation/receipt.ts';
import { checkRouting, worstCaseCost, type Need } from '../dispatch/routing.ts';
import type { Host } from '../p2p/host.ts';
import { ContractError, parseRequest, type ParsedRequest } from '../serve/contract.ts';
import { candidates } from './candidates.ts';
import { GatewayError, invalid } from './errors.ts';
import { canonicalBodySha256, ESTIMATE_ENDPOINTS, routingKey, type EstimateStore } from './estimates.ts';
import type { MarketClient } from './market-client.ts';
import { JSON_TYPE } from '../service-error.ts';
import { bodyBytes, isObj } from './request-body.ts';
import { parseRoutingHeaders } from './routing-headers.ts';
import { askTokens } from './token-routes.ts';

const REFUSED_HEADERS = { 'x-service-max-cost-usd': 'X-Service-Max-Cost-Usd', 'x-service-estimate': 'X-Service-Estimate' } as const;

export function registerEstimateRoute(app: FastifyInstance, d: { host: Host; market: MarketClient; estimates: EstimateStore }): void {
  app.post('/v1/estimates', async (req, reply) => {
    for (const [h, name] of Object.entries(REFUSED_HEADERS)) if (req.headers[h] !== undefined) throw invalid(name, 'not accepted on /estimates');
    const controls = parseRoutingHeaders(req.headers);
    let ask: { endpoint?: unknown; body?: unknown };
    try {
      ask = JSON.parse(bodyBytes(req).toString('utf8')) as typeof ask;
    } catch {
      throw invalid('body', 'expected a JSON object {endpoint, body}');
    }
    const endpoint = typeof ask?.endpoint === 'string' && Object.hasOwn(ESTIMATE_ENDPOINTS, ask.endpoint) ? ESTIMATE_ENDPOINTS[ask.endpoint] : undefined;
    if (!endpoint) throw invalid('endpoint', `expected one of ${Object.keys(ESTIMATE_ENDPOINTS).join(', ')}`);
    if (!isObj(ask.body)) throw invalid('body', 'expected the request body of that endpoint');
    const bytes = Buffer.from(JSON.stringify(ask.body));
    let parsed: ParsedRequest;
    try {
      parsed = parseRequest(endpoint, bytes);
    } catch (e) {
      if (e instanceof ContractError) throw invalid(e.field ? `body.${e.field}` : 'body', e.message.replace(/^[^:]*: /, ''));
      throw e;
    }
    const [c] = candidates(await d.market.providers(), parsed.model, controls);
    const wire = c!.provider.rates?.[parsed.model];
    if (!wire) throw new GatewayError(503, 'no_provider', 'the provider publishes no price for this model');
    const rates = ratesFromWire(wire);
    const context = c!.context ?? 0;
    // Counted by the provider's own tokenizer (and chat template), each embeddings input on its own.
    const count = async (body: object): Promise<number> => (await askTokens(d.host, c!, 'count_tokens', Buffer.from(JSON.stringify({ model: parsed.model, ...body })))).count;
    let need: Need;
    if (parsed.endpoint === 'embeddings') {
      let inputTokens = 0;
      let longest = 0;
      for (const text of parsed.input) {
        const n = await count({ prompt: text });
        inputTokens += n;
        longest = Math.max(longest, n);
      }
      need = { inputTokens, maxOutputTokens: 0, contextNeed: longest };
    } else {
      const inputTokens = await count(parsed.endpoint === 'completions' ? { prompt: parsed.prompt } : { messages: parsed.messages });
      // As the node: max_tokens beyond what the context leaves is refused (checkRouting), never cut.
      const asked = 'maxTokens' in parsed ? parsed.maxTokens : undefined;
      need = { inputTokens, maxOutputTokens: asked ?? Math.max(0, context - inputTokens) };
    }
    // The node's own judgement of context and price ceilings. The listing already met the other
    // controls (candidates), and a cost cap is refused on this route.
    const r = controls.routing;
    const ceilings = {
      ...(r.max_input_price_micro_usd_per_mtok !== undefined ? { max_input_price_micro_usd_per_mtok: r.max_input_price_micro_usd_per_mtok } : {}),
      ...(r.max_output_price_micro_usd_per_mtok !== undefined ? { max_output_price_micro_usd_per_mtok: r.max_output_price_micro_usd_per_mtok } : {}),
      ...(r.max_request_price_micro_usd !== undefined ? { max_request_price_micro_usd: r.max_request_price_micro_usd } : {}),
    };
    const refusal = checkRouting({ contextLength: context, quantization: '', tokensPerSecond: 0, tier: 'T1', rates }, ceilings, need);
    if (refusal) throw new GatewayError(refusal.status, refusal.code, refusal.message);
    const maxHold = worstCaseCost(need, rates);
    const est = d.estimates.add({
      endpoint,
      model: parsed.model,
      bodySha256: canonicalBodySha256(bytes),
      routing: routingKey(controls),
      provider: c!.provider.provider,
      priceVersion: c!.provider.price_version ?? '',
      inputTokens: need.inputTokens,
      maxOutputTokens: need.maxOutputTokens,
      expectedMicroUsd: maxHold,
      maxHoldMicroUsd: maxHold,
    });
    return reply.code(200).type(JSON_TYPE).send({
      object: 'estimate',
      estimate_id: est.estimateId,
      endpoint: ask.endpoint,
      model: est.model,
      price_version: est.priceVersion,
      input_tokens: est.inputTokens,
      max_output_tokens: est.maxOutputTokens,
      expected_cost: formatUsd(est.expectedMicroUsd),
      max_hold: formatUsd(est.maxHoldMicroUsd),
      expires_at: Math.floor(est.expiresAt / 1000),
      can_start: { provider: est.provider, live: c!.provider.live !== false, accepting: c!.provider.accepting !== false },
    });
  });
}
