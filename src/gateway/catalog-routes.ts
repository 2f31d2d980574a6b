// GET /v1/models (filtered, sorted, paged: src/gateway/catalog.ts), /v1/models/by-id?id=…,
// /v1/models/{id}: the models the marketplace's providers list, merged by id.
import type { FastifyInstance, FastifyReply } from 'fastify';
import { catalogEntry, catalogPage, parseCatalogQuery } from './catalog.ts';
import { GatewayError, invalid } from './errors.ts';
import type { MarketClient } from './market-client.ts';
import { JSON_TYPE } from '../service-error.ts';

/** The spec's per-model statistics and histories, which this gateway keeps no record of. */
const NOT_KEPT = ['stats', 'activity', 'availability', 'pricing-history'] as const;

export function registerCatalogRoutes(app: FastifyInstance, d: { market: MarketClient }): void {
  async function oneModel(id: unknown, reply: FastifyReply): Promise<unknown> {
    if (typeof id !== 'string' || id.length === 0) throw invalid('id', 'expected a model id');
    const m = catalogEntry(await d.market.providers({ requestContracts: true }), id);
    if (!m) throw new GatewayError(404, 'model_not_found', `unknown model "${id.slice(0, 256)}"`);
    return reply.type(JSON_TYPE).send(m);
  }

  app.get('/v1/models', async (req, reply) => {
    const q = parseCatalogQuery(req.query as Record<string, unknown>); // (400 before the market is asked)
    return reply.type(JSON_TYPE).send({ object: 'list', ...catalogPage(await d.market.providers({ requestContracts: true }), q) });
  });
  app.get('/v1/models/by-id', async (req, reply) => oneModel((req.query as Record<string, unknown>).id, reply));
  for (const what of NOT_KEPT) {
    app.get(`/v1/models/by-id/${what}`, async () => {
      throw new GatewayError(501, 'not_supported', `GET /v1/models/by-id/${what}: this gateway keeps no ${what.replace('-', ' ')} of its providers; GET /v1/models/by-id?id= gives the model as listed now`);
    });
  }
  // (the router has already decoded the path: decoding it again would misread a literal "%")
  app.get('/v1/models/*', async (req, reply) => oneModel((req.params as Record<string, string>)['*'] ?? '', reply));
}
