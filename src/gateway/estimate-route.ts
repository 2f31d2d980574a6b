// POST /v1/estimates: what a request would cost, without a hold or a charge (see estimates.ts).
// The body is checked against the same contract as execution, the input counted by a live
// provider's own tokenizer, and the request judged as that node would judge it (its listed offer:
// candidates; context fit: checkRouting); the estimate's maximum is the worst case at its rates.
import type { FastifyInstance } from 'fastify';
import { formatUsd } from '../../attestation/money.ts';
import { ratesFromWire } from '../../attestation/receipt.ts';
import { contextUnfit, textNeed, worstCaseCost, type Need } from '../dispatch/routing.ts';
import type { Host } from '../p2p/host.ts';
import { ContractError, MAX_REQUEST_BODY, parseRequestValue, type ParsedRequest } from '../serve/contract.ts';
import { modelServes } from '../market/registration-payload.ts';
import { candidates, type Candidate } from './candidates.ts';
import { GatewayError, invalid } from './errors.ts';
import { canonicalBodySha256, ESTIMATE_ENDPOINTS, routingKey, type EstimateStore } from './estimates.ts';
import { acceptsModel, type MarketClient } from './market-client.ts';
import { JSON_TYPE } from '../service-error.ts';
import { bodyBytes, decodeJson, isObj } from './request-body.ts';
import { parseRoutingHeaders } from './routing-headers.ts';
import { assertModelAllowed, assertScope, assertWithinKeyCap, keyOf, type Scope } from './api-keys.ts';
import type { KeySpend } from './key-spend.ts';
import { askTokens, ProviderUnreached } from './token-routes.ts';
import { UNSERVED_ESTIMATE_ENDPOINTS } from './unserved-routes.ts';

const REFUSED_HEADERS = { 'x-service-max-cost-usd': 'X-Service-Max-Cost-Usd', 'x-service-estimate': 'X-Service-Estimate' } as const;

export function registerEstimateRoute(app: FastifyInstance, d: { host: Host; market: MarketClient; estimates: EstimateStore; spend?: KeySpend }): void {
  app.post('/v1/estimates', async (req, reply) => {
    for (const [h, name] of Object.entries(REFUSED_HEADERS)) if (req.headers[h] !== undefined) throw invalid(name, 'not accepted on /estimates');
    const controls = parseRoutingHeaders(req.headers);
    const decoded = decodeJson(bodyBytes(req));
    if (!decoded) throw invalid('body', 'expected a JSON object {endpoint, body}');
    const ask = decoded.value as { endpoint?: unknown; body?: unknown }; // (null: no endpoint, refused next)
    // (Nothing in a body is ignored: the wrapper's fields are these two.)
    const extra = isObj(ask) ? Object.keys(ask).find((k) => k !== 'endpoint' && k !== 'body') : undefined;
    if (extra !== undefined) throw invalid(extra.slice(0, 64), 'not a field of an estimate request ({endpoint, body})');
    const endpoint = typeof ask?.endpoint === 'string' && Object.hasOwn(ESTIMATE_ENDPOINTS, ask.endpoint) ? ESTIMATE_ENDPOINTS[ask.endpoint] : undefined;
    if (!endpoint && typeof ask?.endpoint === 'string' && UNSERVED_ESTIMATE_ENDPOINTS.has(ask.endpoint)) throw new GatewayError(501, 'not_supported', `endpoint: ${ask.endpoint} is not served by this gateway (it estimates ${Object.keys(ESTIMATE_ENDPOINTS).join(', ')})`);
    if (!endpoint) throw invalid('endpoint', `expected one of ${Object.keys(ESTIMATE_ENDPOINTS).join(', ')}`);
    // (The estimate's endpoint names are the spec's scopes: a key estimates only what it may run.)
    assertScope(req, ask.endpoint as Scope);
    if (!isObj(ask.body)) throw invalid('body', 'expected the request body of that endpoint');
    let bytes: Buffer;
    try {
      bytes = Buffer.from(JSON.stringify(ask.body));
    } catch {
      throw invalid('body', 'nested too deeply'); // (JSON.stringify's stack)
    }
    let parsed: ParsedRequest;
    try {
      if (bytes.length > MAX_REQUEST_BODY) throw new ContractError('', `body larger than ${MAX_REQUEST_BODY} bytes`);
      parsed = parseRequestValue(endpoint, ask.body);
    } catch (e) {
      if (e instanceof ContractError) throw invalid(e.field ? `body.${e.field}` : 'body', e.message.replace(/^[^:]*: /, ''));
      throw e;
    }
    assertModelAllowed(req, parsed.model);
    // Only routes sold for the endpoint (a model without a chat template is not sold for chat's),
    // judged first, as the market tickets: then the routing controls.
    const listing = await d.market.providers();
    const selling = listing.filter((p) => p.models.some((m) => m.id === parsed.model && modelServes(m, endpoint)));
    if (selling.length === 0 && listing.some((p) => p.models.some((m) => m.id === parsed.model))) {
      throw new GatewayError(404, 'model_not_found', `no provider sells "${parsed.model.slice(0, 256)}" for ${endpoint}`);
    }
    const priced = candidates(selling, parsed.model, controls).filter((x) => x.provider.rates?.[parsed.model] !== undefined);
    if (priced.length === 0) throw new GatewayError(503, 'no_provider', 'no provider that meets the routing controls publishes a price for this model');
    // The first candidate that can take it, as execution would find it (it fails over past a
    // provider whose context is too small, or whose worst case the key's limits cannot pay for).
    // Each is counted by its own tokenizer; one that cannot be reached is skipped.
    let counted: { c: Candidate; need: Need; maxHold: bigint; worst: bigint } | undefined;
    let refused: GatewayError | undefined;
    let unreached: ProviderUnreached | undefined;
    const spendLimit = keyOf(req)?.spend;
    for (const c of priced) {
      let need: Need;
      try {
        need = await needAt(d.host, c, parsed);
      } catch (e) {
        if (!(e instanceof ProviderUnreached)) throw e;
        unreached = e;
        continue;
      }
      try {
        // The node's own judgement of context fit. The listing already met every other control
        // (candidates: checkOffer), and a cost cap is refused on this route.
        const unfit = contextUnfit(c.context ?? 0, need);
        if (unfit) throw new GatewayError(unfit.status, unfit.code, unfit.message);
        const worst = worstCaseCost(need, ratesFromWire(c.provider.rates![parsed.model]!));
        // The key's limits, as execution would apply them (the spec: estimates validate "key limits").
        const withinKey = (hold: bigint): void => {
          assertWithinKeyCap(req, hold);
          if (spendLimit && d.spend) d.spend.assertRoomFor(spendLimit, hold);
        };
        withinKey(worst);
        // A hedge runs two attempts, each capped at half the hold (paid-routes.ts): its hold is twice
        // the worst case, or neither half of an execution under this estimate could start. A key
        // whose limits leave less runs it once, unhedged, as execution would: the hold of one run;
        // so does a model only one provider meeting the controls prices (no second to race).
        let maxHold = worst;
        if (controls.routing.hedge === true && endpoint !== 'embeddings' && priced.length >= 2) {
          try {
            withinKey(2n * worst);
            maxHold = 2n * worst;
          } catch (e) {
            if (!(e instanceof GatewayError)) throw e;
          }
        }
        counted = { c, need, maxHold, worst };
        break;
      } catch (e) {
        if (!(e instanceof GatewayError)) throw e;
        refused ??= e;
      }
    }
    if (!counted) throw refused ?? unreached!;
    const { c, need, maxHold, worst } = counted;
    const est = d.estimates.add({
      endpoint,
      model: parsed.model,
      bodySha256: canonicalBodySha256(bytes),
      routing: routingKey(controls),
      keyId: keyOf(req)?.id ?? null,
      provider: c.provider.provider,
      priceVersion: c.provider.price_version ?? '',
      inputTokens: need.inputTokens,
      maxOutputTokens: need.maxOutputTokens,
      expectedMicroUsd: worst,
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
      can_start: { provider: est.provider, live: c.provider.live !== false, accepting: acceptsModel(c.provider, est.model) },
    });
  });
}

/** Embeddings inputs counted at once, at most this many at a time (each one a stream to the node). */
const COUNT_CONCURRENCY = 8;

/**
 * What the request needs at this provider, counted by its own tokenizer (and chat template): the
 * input, and the output as the node would allow it (textNeed). Embeddings inputs are counted each on
 * its own, since each must fit the context by itself.
 */
async function needAt(host: Host, c: Candidate, parsed: ParsedRequest): Promise<Need> {
  const count = async (body: object): Promise<number> => (await askTokens(host, c, 'count_tokens', Buffer.from(JSON.stringify({ model: parsed.model, ...body })))).count;
  if (parsed.endpoint === 'embeddings') {
    const counts = new Array<number>(parsed.input.length);
    let next = 0;
    let failed = false; // one count failed: the others take no more inputs
    const worker = async (): Promise<void> => {
      while (next < parsed.input.length && !failed) {
        const i = next++;
        try {
          counts[i] = await count({ prompt: parsed.input[i] });
        } catch (e) {
          failed = true;
          throw e;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(COUNT_CONCURRENCY, parsed.input.length) }, worker));
    return { inputTokens: counts.reduce((a, b) => a + b, 0), maxOutputTokens: 0, contextNeed: counts.reduce((a, b) => Math.max(a, b), 0) };
  }
  const inputTokens = await count(parsed.endpoint === 'completions' ? { prompt: parsed.prompt } : { messages: parsed.messages });
  // As the node: max_tokens beyond what the context leaves is refused, never cut (textNeed).
  return textNeed(inputTokens, 'maxTokens' in parsed ? parsed.maxTokens : undefined, c.context ?? 0);
}
