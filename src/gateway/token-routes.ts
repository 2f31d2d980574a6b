// POST /v1/tokenize and /v1/count_tokens: free (no ticket, hold or receipt). The body goes to a
// live provider of the model, which counts with its own tokenizer and chat template; a provider
// that cannot be reached is skipped for the next.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Multiaddr } from '@multiformats/multiaddr';
import type { Host } from '../p2p/host.ts';
import { INFER_PROTOCOL } from '../p2p/infer-protocol.ts';
import { readResponse, request as p2pRequest } from '../p2p/request-stream.ts';
import { candidates, type Candidate } from './candidates.ts';
import { dialTarget } from './dial-target.ts';
import { GatewayError, headStatus, providerRefusal } from './errors.ts';
import type { MarketClient } from './market-client.ts';
import { FREE_ENDPOINTS } from '../serve/contract.ts';
import { JSON_TYPE } from '../service-error.ts';
import { bodyBytes, isObj, peekModel } from './request-body.ts';
import { parseRoutingHeaders } from './routing-headers.ts';
import { assertModelAllowed } from './api-keys.ts';


/** Not reaching a provider at all: tokenize fails over to the next provider on these. */
export class ProviderUnreached extends GatewayError {}

/** Each candidate's dial target, worked out once (an estimate asks one candidate once per embeddings input). */
const targets = new WeakMap<Candidate, Multiaddr[]>();
function targetOf(c: Candidate): Multiaddr[] {
  let t = targets.get(c);
  if (!t) targets.set(c, (t = dialTarget(c.provider.provider, c.provider.peer_id, c.provider.addresses)));
  return t;
}

/** A provider's own tokenization of a body (its tokenizer and chat template). */
export async function askTokens(host: Host, c: Candidate, endpoint: 'tokenize' | 'count_tokens', body: Uint8Array): Promise<{ count: number; tokens: unknown[] | null }> {
  let r;
  try {
    const target = targetOf(c);
    r = await readResponse(await p2pRequest(host, target, INFER_PROTOCOL, { endpoint }, body, { signal: AbortSignal.timeout(30_000) }));
  } catch (e) {
    throw e instanceof GatewayError ? new ProviderUnreached(e.status, e.code, e.message) : new ProviderUnreached(503, 'provider_unreachable', `could not reach provider ${c.provider.provider}: ${(e as Error).message}`);
  }
  const status = headStatus(r.head);
  if (status !== 200) throw providerRefusal(status, r.trailer).error;
  let v: unknown;
  try {
    v = JSON.parse(Buffer.from(r.body).toString('utf8'));
  } catch {
    v = undefined;
  }
  if (!isObj(v) || typeof v.count !== 'number' || !Number.isSafeInteger(v.count) || v.count < 0 || (v.tokens !== undefined && !Array.isArray(v.tokens))) {
    throw new GatewayError(502, 'bad_provider_response', "the provider's tokenization is malformed");
  }
  return { count: v.count, tokens: Array.isArray(v.tokens) ? v.tokens : null };
}

export function registerTokenRoutes(app: FastifyInstance, d: { host: Host; market: MarketClient }): void {
  async function tokenize(endpoint: 'tokenize' | 'count_tokens', req: FastifyRequest, reply: FastifyReply): Promise<unknown> {
    const controls = parseRoutingHeaders(req.headers);
    const body = bodyBytes(req);
    const model = peekModel(body);
    assertModelAllowed(req, model);
    const list = candidates(await d.market.providers(), model, controls);
    let lastError: GatewayError | undefined;
    for (const c of list) {
      let t;
      try {
        t = await askTokens(d.host, c, endpoint, body);
      } catch (e) {
        if (e instanceof ProviderUnreached) {
          lastError = e;
          continue; // failover to the next provider
        }
        throw e;
      }
      return reply
        .code(200)
        .type(JSON_TYPE)
        .send({ object: 'tokenization', model, count: t.count, tokens: t.tokens, max_model_len: c.context ?? null, provider: c.provider.provider });
    }
    throw lastError!; // candidates() is never empty: it throws instead
  }

  for (const endpoint of FREE_ENDPOINTS) app.post(`/v1/${endpoint}`, (req, reply) => tokenize(endpoint, req, reply));
}
