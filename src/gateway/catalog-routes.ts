// GET /v1/models, /v1/models/by-id?id=…, /v1/models/{id}: the models the marketplace's providers
// list, merged by id (how many providers, the largest context, the quantization buckets).
import type { FastifyInstance, FastifyReply } from 'fastify';
import { quantizationBucket } from '../dispatch/routing.ts';
import { GatewayError, invalid } from './errors.ts';
import type { MarketClient } from './market-client.ts';
import { JSON_TYPE } from '../service-error.ts';

async function catalog(market: MarketClient): Promise<Record<string, unknown>[]> {
  const byId = new Map<string, { id: string; providers: Set<string>; context: number; quantizations: Set<string>; seen: number }>();
  for (const p of await market.providers()) {
    for (const m of p.models) {
      const e = byId.get(m.id) ?? { id: m.id, providers: new Set<string>(), context: 0, quantizations: new Set<string>(), seen: Number.MAX_SAFE_INTEGER };
      e.providers.add(p.provider);
      e.context = Math.max(e.context, m.context ?? 0);
      if (m.quantization) e.quantizations.add(quantizationBucket(m.quantization));
      if (typeof p.last_seen === 'number') e.seen = Math.min(e.seen, p.last_seen);
      byId.set(m.id, e);
    }
  }
  return [...byId.values()]
    .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
    .map((e) => ({
      id: e.id,
      object: 'model',
      created: e.seen === Number.MAX_SAFE_INTEGER ? 0 : Math.floor(e.seen / 1000),
      owned_by: e.id.includes('/') ? e.id.split('/')[0] : 'service',
      context_length: e.context,
      quantizations: [...e.quantizations].sort(),
      providers: e.providers.size,
    }));
}

export function registerCatalogRoutes(app: FastifyInstance, d: { market: MarketClient }): void {
  async function oneModel(id: unknown, reply: FastifyReply): Promise<unknown> {
    if (typeof id !== 'string' || id.length === 0) throw invalid('id', 'expected a model id');
    const m = (await catalog(d.market)).find((e) => e.id === id);
    if (!m) throw new GatewayError(404, 'model_not_found', `unknown model "${id.slice(0, 256)}"`);
    return reply.type(JSON_TYPE).send(m);
  }

  app.get('/v1/models', async (_req, reply) => reply.type(JSON_TYPE).send({ object: 'list', data: await catalog(d.market) }));
  app.get('/v1/models/by-id', async (req, reply) => oneModel((req.query as Record<string, unknown>).id, reply));
  // (the router has already decoded the path: decoding it again would misread a literal "%")
  app.get('/v1/models/*', async (req, reply) => oneModel((req.params as Record<string, string>)['*'] ?? '', reply));
}
