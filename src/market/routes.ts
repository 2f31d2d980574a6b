// The market's HTTP routes (docs/market-api.md), each with a JSON schema for its body. Schema
// errors and fastify's own client errors become {error: {code, message}} with the route's code
// for a malformed body and a message naming the field.
import type { FastifyError, FastifyInstance } from 'fastify';
import { errorBody, MarketError } from './errors.ts';
import { heartbeat, providerView, register } from './providers.ts';
import { collectReceipt } from './receipts.ts';
import type { MarketStore } from './store.ts';
import { issueTicket, type TicketRequest } from './tickets.ts';
import { RepeatLimit } from '../ops/repeat-limit.ts';

export interface RouteContext {
  store: MarketStore;
  signer: { seed: Uint8Array; keyid: string };
  publicKey: string;
  now: () => number;
  heartbeatIntervalMs: number;
}

const envelopeSchema = {
  type: 'object',
  required: ['payloadType', 'payload', 'signatures'],
  properties: {
    payloadType: { type: 'string' },
    payload: { type: 'string' },
    signatures: {
      type: 'array',
      minItems: 1,
      items: { type: 'object', required: ['sig'], properties: { keyid: { type: 'string' }, sig: { type: 'string' } } },
    },
  },
} as const;

const ticketRequestSchema = {
  type: 'object',
  required: ['endpoint', 'model', 'body_sha256'],
  additionalProperties: false,
  properties: {
    endpoint: { type: 'string' },
    model: { type: 'string' },
    body_sha256: { type: 'string' },
    routing: { type: 'object' },
    max_cost_micro_usd: { type: 'string' },
    request_id: { type: 'string' },
    account: { type: 'string' },
    providers: { type: 'array', items: { type: 'string', pattern: '^[0-9a-f]{64}$' }, minItems: 1, maxItems: 64 },
  },
} as const;

const receiptBodySchema = {
  type: 'object',
  required: ['receipt'],
  additionalProperties: false,
  properties: { receipt: { type: 'string', minLength: 1, maxLength: 1_000_000 } },
} as const;

interface RouteConfig {
  /** The code of a malformed body on this route. */
  invalidCode?: string;
}

interface AjvIssue {
  instancePath?: string;
  keyword?: string;
  message?: string;
  params?: { missingProperty?: string; additionalProperty?: string };
}

/** "routing.min_context: must be …", "endpoint: missing", "extra: unknown field". */
function validationMessage(issues: readonly AjvIssue[]): string {
  const i = issues[0];
  if (!i) return 'the body does not match the schema';
  const at = (i.instancePath ?? '').split('/').filter(Boolean).join('.');
  const join = (k: string) => (at ? `${at}.${k}` : k);
  if (i.keyword === 'required' && i.params?.missingProperty) return `${join(i.params.missingProperty)}: missing`;
  if (i.keyword === 'additionalProperties' && i.params?.additionalProperty) return `${join(i.params.additionalProperty)}: unknown field`;
  return `${at || 'body'}: ${i.message ?? 'invalid'}`;
}

export function registerRoutes(app: FastifyInstance, ctx: RouteContext): void {
  const { store } = ctx;
  // Writes to the market's file that fail: said at once, then at most every 10 s with how many since.
  const storageFailures = new RepeatLimit();

  app.setErrorHandler(async (err: FastifyError | MarketError, req, reply) => {
    if (err instanceof MarketError) {
      if (err.code === 'market_storage_failed') {
        const unsaid = storageFailures.take();
        if (unsaid !== undefined) req.log.error({ reason: err.message.slice(0, 600), failures_since_last_line: unsaid }, 'market: its file refused a write: tickets and receipts are refused (503) until it takes writes again');
      }
      // A receipt refused is money disputed (forged, for another ticket, a second one for a ticket): the operator hears of it.
      if (req.routeOptions.url === '/v1/receipts' && req.method === 'POST') req.log.warn({ code: err.code, reason: err.message.slice(0, 600) }, 'receipt refused');
      return reply.code(err.status).send(errorBody(err.code, err.message));
    }
    // A body that is not JSON, by its Content-Type too, is a malformed body like any other (400, the route's code).
    const notJson = err.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE';
    const status = notJson ? 400 : typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500 ? err.statusCode : 500;
    if (status === 500) {
      req.log.error({ err }, 'market: request failed');
      return reply.code(500).send(errorBody('internal_error', 'internal error'));
    }
    const code = status === 400 ? ((req.routeOptions.config as RouteConfig | undefined)?.invalidCode ?? 'invalid_request') : status === 413 ? 'request_too_large' : 'invalid_request';
    const message = notJson ? 'body: expected JSON (Content-Type: application/json)' : err.validation ? validationMessage(err.validation as AjvIssue[]) : err.message;
    return reply.code(status).send(errorBody(code, message));
  });

  app.setNotFoundHandler(async (req, reply) => {
    const path = (req.url.split('?')[0] ?? '').slice(0, 200);
    return reply.code(404).send(errorBody('not_found', `no route for ${req.method} ${path}`));
  });

  app.get('/v1/market', async () => ({ public_key: ctx.publicKey, key_id: ctx.signer.keyid }));

  app.post('/v1/providers/register', { schema: { body: envelopeSchema }, config: { invalidCode: 'registration_invalid' } }, async (req) => {
    const now = ctx.now();
    const p = register(store, req.body, now);
    req.log.info({ provider: p.provider, peer_id: p.peer_id, models: p.models.map((m) => m.id), price_version: p.price_version }, 'provider registered');
    return { registered: true, heartbeat_interval_ms: ctx.heartbeatIntervalMs };
  });

  app.post('/v1/providers/heartbeat', { schema: { body: envelopeSchema }, config: { invalidCode: 'heartbeat_invalid' } }, async (req) => {
    heartbeat(store, req.body, ctx.now());
    return { ok: true };
  });

  // The request contracts (~10 KiB a provider) only when asked for: routing reads the listing for
  // every request, the catalog alone reads contracts.
  app.get('/v1/providers', async (req) => {
    const now = ctx.now();
    const q = req.query as Record<string, unknown>;
    if (q.request_contracts !== undefined && q.request_contracts !== 'true' && q.request_contracts !== 'false') throw new MarketError(400, 'invalid_request', 'request_contracts: expected true or false');
    const contracts = q.request_contracts === 'true';
    return [...store.providers.values()].map((p) => providerView(p, now, ctx.heartbeatIntervalMs, contracts));
  });

  app.post('/v1/tickets', { schema: { body: ticketRequestSchema }, config: { invalidCode: 'invalid_request' } }, async (req) => {
    const t = issueTicket({ store, signer: ctx.signer, now: ctx.now(), heartbeatIntervalMs: ctx.heartbeatIntervalMs }, req.body as TicketRequest);
    req.log.debug({ request_id: t.request_id, provider: t.provider }, 'ticket issued');
    return t;
  });

  app.post('/v1/tickets/:ticket_id/release', async (req) => {
    const id = (req.params as { ticket_id: string }).ticket_id;
    const released = store.release(id, ctx.now());
    if (released === undefined) throw new MarketError(404, 'unknown_ticket', `no ticket ${id.slice(0, 200)} issued by this market (or forgotten)`);
    return { released };
  });

  app.post('/v1/receipts', { schema: { body: receiptBodySchema }, config: { invalidCode: 'invalid_request' } }, async (req) => {
    const { result, duplicate } = collectReceipt(store, (req.body as { receipt: string }).receipt, ctx.now());
    if (!duplicate) req.log.info({ request_id: result.request_id, cost_micro_usd: result.cost_micro_usd }, 'receipt collected');
    return result;
  });

  app.get('/v1/receipts', async () =>
    store.allReceipts().map((r) => ({ request_id: r.request_id, provider: r.provider, model: r.model, status: r.status, cost_micro_usd: r.cost_micro_usd, seq: r.seq })),
  );

  app.get('/v1/receipts/:request_id', async (req) => {
    const id = (req.params as { request_id: string }).request_id;
    const found = store.receiptsForRequest(id)[0];
    if (!found) throw new MarketError(404, 'not_found', `no receipt collected for request ${id.slice(0, 200)}`);
    return found;
  });

  app.get('/v1/totals', async () => store.totals());
}
