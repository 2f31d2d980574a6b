// The operator's HTTP server: liveness, readiness, a status document and Prometheus metrics.
// Loopback by default and unauthenticated: expose it beyond the host only behind something that
// authenticates.
//
//   GET /healthz  200 {"status":"ok", ...}   503 {"status":"unhealthy", ...} if health() says ok: false
//   GET /readyz   200 {"ready":true,"reasons":[]}   503 {"ready":false,"reasons":[...]}
//   GET /status   200 whatever status() returns (bigints become decimal strings)
//   GET /metrics  200 Prometheus text exposition, Content-Type from the registry
// HEAD works on all four. A known path with another method is 405 (Allow: GET, HEAD); any other
// path is 404; a callback that throws, times out or returns junk is 500. Every error body is
// {"error":{"code","message"}}; no stack trace or callback error message is ever sent.
import { isLoopbackHost, isLoopbackHostHeader } from '../host-port.ts';
import type { AddressInfo } from 'node:net';
import { fastify, LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance } from 'fastify';
import type { Registry } from 'prom-client';
import { closeHttp } from '../http-close.ts';
import { answerBareRefusals, clientErrorHandler, frameworkErrorReply } from '../http-errors.ts';
import { requestDeadlineOptions } from '../http-deadline.ts';
import { errorBody, JSON_TYPE } from '../service-error.ts';

type MaybePromise<T> = T | Promise<T>;

/** health(): `ok` false makes /healthz 503; other fields are passed through in the body. */
export interface HealthResult {
  ok: boolean;
  [key: string]: unknown;
}

/** ready(): `reasons` says why not (e.g. "model llama-3-8b loading", "marketplace unreachable"). */
export interface ReadyResult {
  ready: boolean;
  reasons?: string[];
}

export interface OpsServerOptions {
  /** Interface to bind; default 127.0.0.1 (loopback only). */
  host?: string;
  /** Port to bind; 0 picks a free one (see listen()'s result). */
  port: number;
  /** Anything with a prom-client registry, e.g. createMetrics()'s result. */
  metrics: { readonly registry: Registry };
  /** Pino logger (e.g. createLogger()); without one the server logs nothing. */
  logger?: FastifyBaseLogger;
  /** Liveness details; default always ok. */
  health?: () => MaybePromise<HealthResult>;
  ready: () => MaybePromise<ReadyResult>;
  /** The /status document: provider id, models, slots, queue, receipts, uptime, as the caller sees fit. */
  status: () => MaybePromise<object>;
  /** How long an async callback may take before the request fails with 500 (default 5000 ms). */
  callbackTimeoutMs?: number;
  /** A whole request (headers and body) must arrive within this (default 10 s). */
  requestTimeoutMs?: number;
}

export interface OpsServerAddress {
  host: string;
  port: number;
  /** e.g. http://127.0.0.1:9464 */
  url: string;
}

export interface OpsServer {
  /** The fastify instance (routes registered; `app.inject()` works without listening). */
  readonly app: FastifyInstance;
  /** Bind host:port (127.0.0.1 unless `host` was given) and start serving. */
  listen(): Promise<OpsServerAddress>;
  /** Stop accepting connections; requests under way get 2 s, keep-alive connections close as they fall idle. */
  close(): Promise<void>;
}

const OPS_CLOSE_GRACE_MS = 2_000;

const OPS_ROUTES: readonly string[] = ['/healthz', '/readyz', '/status', '/metrics'];


const errorSchema = {
  type: 'object',
  required: ['error'],
  additionalProperties: false,
  properties: {
    error: {
      type: 'object',
      required: ['code', 'message'],
      additionalProperties: false,
      properties: { code: { type: 'string' }, message: { type: 'string' } },
    },
  },
} as const;

const healthSchema = {
  type: 'object',
  required: ['status'],
  additionalProperties: true,
  properties: { status: { type: 'string', enum: ['ok', 'unhealthy'] } },
} as const;

const readySchema = {
  type: 'object',
  required: ['ready', 'reasons'],
  additionalProperties: false,
  properties: { ready: { type: 'boolean' }, reasons: { type: 'array', items: { type: 'string' } } },
} as const;

const statusSchema = { type: 'object', additionalProperties: true } as const;

/** A failure whose code and message are safe to send to the client. */
class OpsFailure extends Error {
  readonly code: string;
  readonly statusCode: number;
  constructor(statusCode: number, code: string, message: string) {
    super(message);
    this.name = 'OpsFailure';
    this.statusCode = statusCode;
    this.code = code;
  }
}


function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}


/** JSON round trip with bigints as decimal strings (the project's convention for micro-USD). */
function toJson(value: object): Record<string, unknown> {
  const text = JSON.stringify(value, (_key, v: unknown) => (typeof v === 'bigint' ? v.toString() : v));
  return JSON.parse(text) as Record<string, unknown>;
}

export function createOpsServer(options: OpsServerOptions): OpsServer {
  const host = options.host ?? '127.0.0.1';
  const { port, metrics, logger } = options;
  if (typeof host !== 'string' || host === '') throw new TypeError('ops server: host must be a non-empty string');
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new RangeError(`ops server: port must be an integer 0..65535, got ${String(port)}`);
  if (!metrics || typeof metrics.registry?.metrics !== 'function') throw new TypeError('ops server: metrics.registry must be a prom-client Registry');
  if (typeof options.ready !== 'function' || typeof options.status !== 'function') throw new TypeError('ops server: ready and status callbacks are required');
  const health = options.health ?? ((): HealthResult => ({ ok: true }));
  const timeoutMs = options.callbackTimeoutMs ?? 5000;
  const requestTimeoutMs = options.requestTimeoutMs ?? 10_000;
  if (!(timeoutMs > 0)) throw new RangeError('ops server: callbackTimeoutMs must be positive');

  const app: FastifyInstance = fastify({
    ...(logger ? { loggerInstance: logger } : { logger: false }),
    // Fastify's per-request info lines would log every scrape; we log at debug instead.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: 16 * 1024,
    ...requestDeadlineOptions(requestTimeoutMs),
    return503OnClosing: true,
    // Requests that reach no route (a URL that does not decode, HTTP that does not parse) get the
    // same error body as the rest.
    frameworkErrors: (err, _req, reply) => frameworkErrorReply(err, reply, 'bad_request'),
    clientErrorHandler: clientErrorHandler('bad_request', () => app.log),
  });
  answerBareRefusals(app, 'bad_request');

  /** Runs a caller's callback; any failure becomes a safe 500 and is logged server-side. */
  async function call<T>(name: string, fn: () => MaybePromise<T>, log: FastifyBaseLogger): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    try {
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
      });
      return await Promise.race([Promise.resolve().then(fn), timeout]);
    } catch (err) {
      log.error({ err, callback: name }, `ops: ${name} callback failed`);
      throw new OpsFailure(500, 'internal_error', `${name} callback failed`);
    } finally {
      clearTimeout(timer);
    }
  }

  function invalid(name: string, log: FastifyBaseLogger, what: string): OpsFailure {
    log.error({ callback: name }, `ops: ${name} callback returned ${what}`);
    return new OpsFailure(500, 'internal_error', `${name} callback returned an invalid result`);
  }

  // On a loopback address (the default), the Host must name the loopback too: a web page whose
  // own name resolves to 127.0.0.1 (DNS rebinding) would otherwise read /status and /metrics, the
  // node's earnings and addresses among them (s23 h7), as the gateway refuses it.
  if (isLoopbackHost(host)) {
    app.addHook('onRequest', async (req) => {
      const asked = req.headers.host ?? '';
      if (!isLoopbackHostHeader(asked)) throw new OpsFailure(403, 'host_not_allowed', `Host ${JSON.stringify(asked.slice(0, 100))} is not this machine's loopback, which is all the ops server listens on (a name that resolves here is not enough: DNS rebinding)`);
    });
  }

  app.addHook('onSend', async (_req, reply, payload) => {
    reply.header('cache-control', 'no-store');
    reply.header('x-content-type-options', 'nosniff');
    return payload;
  });

  app.addHook('onResponse', async (req, reply) => {
    req.log.debug({ method: req.method, path: req.url.split('?')[0], statusCode: reply.statusCode, ms: Math.round(reply.elapsedTime) }, 'ops request');
  });

  app.get('/healthz', { schema: { response: { 200: healthSchema, 503: healthSchema, 500: errorSchema } } }, async (req, reply) => {
    const result: unknown = await call('health', health, req.log);
    if (!isPlainObject(result) || typeof result.ok !== 'boolean') throw invalid('health', req.log, 'no boolean "ok"');
    const { ok, ...rest } = result;
    const body = toJson({ ...rest, status: ok ? 'ok' : 'unhealthy' });
    return reply.code(ok ? 200 : 503).type(JSON_TYPE).send(body);
  });

  app.get('/readyz', { schema: { response: { 200: readySchema, 503: readySchema, 500: errorSchema } } }, async (req, reply) => {
    const result: unknown = await call('ready', options.ready, req.log);
    if (!isPlainObject(result) || typeof result.ready !== 'boolean') throw invalid('ready', req.log, 'no boolean "ready"');
    const reasons = result.reasons ?? [];
    if (!Array.isArray(reasons) || !reasons.every((r) => typeof r === 'string')) throw invalid('ready', req.log, '"reasons" that are not strings');
    return reply.code(result.ready ? 200 : 503).type(JSON_TYPE).send({ ready: result.ready, reasons });
  });

  app.get('/status', { schema: { response: { 200: statusSchema, 500: errorSchema } } }, async (req, reply) => {
    const result: unknown = await call('status', options.status, req.log);
    if (!isPlainObject(result)) throw invalid('status', req.log, 'a non-object');
    let body: Record<string, unknown>;
    try {
      body = toJson(result);
    } catch (err) {
      req.log.error({ err, callback: 'status' }, 'ops: status result is not serialisable');
      throw new OpsFailure(500, 'internal_error', 'status callback returned an invalid result');
    }
    return reply.code(200).type(JSON_TYPE).send(body);
  });

  app.get('/metrics', { schema: { response: { 200: { type: 'string' }, 500: errorSchema } } }, async (req, reply) => {
    let text: string;
    try {
      text = await metrics.registry.metrics();
    } catch (err) {
      req.log.error({ err }, 'ops: collecting metrics failed');
      throw new OpsFailure(500, 'internal_error', 'collecting metrics failed');
    }
    return reply.code(200).type(metrics.registry.contentType).send(text);
  });

  app.setNotFoundHandler(async (req, reply) => {
    const path = (req.url.split('?')[0] ?? '').slice(0, 200);
    if (OPS_ROUTES.includes(path)) {
      return reply.code(405).header('allow', 'GET, HEAD').type(JSON_TYPE)
        .send(errorBody('method_not_allowed', `${req.method} is not allowed on ${path}; use GET`));
    }
    return reply.code(404).type(JSON_TYPE).send(errorBody('not_found', `no route for ${req.method} ${path}; try ${OPS_ROUTES.join(', ')}`));
  });

  app.setErrorHandler(async (err: FastifyError, req, reply) => {
    if (err instanceof OpsFailure) return reply.code(err.statusCode).type(JSON_TYPE).send(errorBody(err.code, err.message));
    const status = typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500 ? err.statusCode : 500;
    if (status === 500) {
      req.log.error({ err }, 'ops: request failed');
      return reply.code(500).type(JSON_TYPE).send(errorBody('internal_error', 'internal error'));
    }
    // Fastify's own client errors (bad content type, body too large, ...): their messages are safe.
    return reply.code(status).type(JSON_TYPE).send(errorBody('bad_request', err.message));
  });

  let listening = false;
  return {
    app,
    async listen(): Promise<OpsServerAddress> {
      if (listening) throw new Error('ops server: already listening');
      listening = true;
      try {
        await app.listen({ host, port });
      } catch (err) {
        listening = false;
        throw err;
      }
      const address = app.server.address() as AddressInfo;
      const shown = address.family === 'IPv6' || address.address.includes(':') ? `[${address.address}]` : address.address;
      if (!isLoopbackHost(host)) app.log.warn({ host, port: address.port }, 'ops: listening beyond loopback; /status and /metrics are unauthenticated');
      return { host: address.address, port: address.port, url: `http://${shown}:${address.port}` };
    },
    async close(): Promise<void> {
      await closeHttp(app, OPS_CLOSE_GRACE_MS);
    },
  };
}

export { isLoopbackHost };
