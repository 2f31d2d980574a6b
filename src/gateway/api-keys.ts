// Optional API keys for the gateway, as the spec has them (marketplace-api.md, Authentication): every
// route but the /models ones needs `Authorization: Bearer <key>` (or, as MCP apps send it,
// `X-Service-API-Key: <key>`); a missing or unknown key is 401. Without keys the gateway serves
// whoever reaches it, which is why it listens on the loopback by default. Keys are kept as their
// SHA-256 only, and a presented key is looked up by its hash, so no comparison runs over the secret.
//
// Each key carries the spec's per-key limits that a gateway can hold on its own:
//   rate_limit    requests a minute, an exact sliding window (default 300): 429 with Retry-After
//                 beyond it; every authenticated response says X-RateLimit-Limit and -Remaining
//   scopes        CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS, … or * (default): 403 insufficient_scope
//   models        a model allowlist (default every model): 403 model_not_allowed
//   max_cost_usd  a cost cap per request: the stricter of it and X-Service-Max-Cost-Usd applies
//   expires       an ISO 8601 time from which the key no longer authenticates (401 api_key_expired)
//   spend_limit_usd, spend_interval (daily, weekly, monthly; default lifetime)
//                 a budget: settled charges plus open holds (key-spend.ts); 403 key_spend_limit_exceeded
import type { FastifyReply, FastifyRequest } from 'fastify';
import { sha256Hex } from '../../attestation/hash.ts';
import { parseUsd } from '../../attestation/money.ts';
import { fsProblem } from '../fs-problem.ts';
import { readTextFile } from '../read-text-file.ts';
import { GatewayError } from './errors.ts';
import { SlidingWindow } from './rate-window.ts';
import { SPEND_INTERVALS, type SpendInterval, type SpendLimit } from './key-spend.ts';

/** What a key must look like: 16 to 256 visible ASCII characters (the spec's are `sk-svc-v1-<secret>`). */
const KEY_RE = /^[\x21-\x7e]{16,256}$/;
const NAME_RE = /^[A-Za-z0-9._-]{1,64}$/;
const MODEL_RE = /^[\x21-\x7e]{1,256}$/;
const INT_RE = /^[0-9]{1,7}$/;

/** The spec's scope values. */
export const SCOPES = ['CHAT', 'COMPLETIONS', 'RESPONSES', 'EMBEDDINGS', 'DECISIONS', 'IMAGES', 'VIDEOS', 'AUDIO_SPEECH', 'AUDIO_TRANSCRIPTIONS', 'AUDIO_GENERATIONS', 'MUSIC', 'WORKFLOWS', 'BILLING_READ', 'PROFILE'] as const;
export type Scope = (typeof SCOPES)[number];

export const RATE_LIMIT_DEFAULT = 300;
export const RATE_LIMIT_MAX = 1_000_000;
const MINUTE_MS = 60_000;

/**
 * The scope each of the gateway's routes needs (the spec: GET /requests/{id} requires CHAT).
 * tokenize, count_tokens and estimates name none: any key may use them.
 */
const ROUTE_SCOPES: Record<string, Scope> = {
  'POST /v1/chat/completions': 'CHAT',
  'POST /v1/completions': 'COMPLETIONS',
  'POST /v1/responses': 'RESPONSES',
  'POST /v1/embeddings': 'EMBEDDINGS',
  'GET /v1/requests/:id': 'CHAT',
  'HEAD /v1/requests/:id': 'CHAT',
};

/** One key and its limits, as a keys file line or the gateway's options give it. */
export interface ApiKeySpec {
  key: string;
  /** A label for logs (default: the first 12 hex characters of the key's SHA-256). */
  name?: string;
  /** Requests a minute (default 300). */
  rateLimit?: number;
  /** Scopes the key has (default ['*']: all). */
  scopes?: readonly string[];
  /** Models the key may use (default: every model). */
  models?: readonly string[];
  /** Cost cap per request, micro-USD. */
  maxCostMicroUsd?: bigint;
  /** The key stops authenticating at this time (ms since the epoch). */
  expiresAt?: number;
  /** A spend limit, micro-USD, over `spendInterval` (default lifetime). */
  spendLimitMicroUsd?: bigint;
  spendInterval?: SpendInterval;
}

/** A key's limits as the gateway holds them. */
export interface KeyPolicy {
  /** A stable id of the key (a prefix of its SHA-256), never the key. */
  readonly id: string;
  readonly label: string;
  readonly scopes: ReadonlySet<string>;
  readonly models: ReadonlySet<string> | undefined;
  readonly maxCostMicroUsd: bigint | undefined;
  readonly expiresAt: number | undefined;
  readonly window: SlidingWindow;
  readonly spend: SpendLimit | undefined;
}

/** Clocks the check reads: wall time for expiry, a monotonic one for the rate window. */
export interface ApiKeyClock {
  wallMs(): number;
  monotonicMs(): number;
}

const systemClock: ApiKeyClock = { wallMs: () => Date.now(), monotonicMs: () => performance.now() };

/** Each authenticated request's key (requests are objects of their own: nothing outlives them). */
const keyOfRequest = new WeakMap<FastifyRequest, KeyPolicy>();

/** The key a request authenticated with (undefined without keys, or on an open route). */
export function keyOf(req: FastifyRequest): KeyPolicy | undefined {
  return keyOfRequest.get(req);
}

/** 403 insufficient_scope when the request's key lacks `scope` (for a route that names the scope it judges: estimates). */
export function assertScope(req: FastifyRequest, scope: Scope): void {
  const k = keyOf(req);
  if (k && !k.scopes.has('*') && !k.scopes.has(scope)) throw new GatewayError(403, 'insufficient_scope', `this API key lacks the ${scope} scope this request needs`);
}

/** 403 model_not_allowed when the request's key may not use `model`. */
export function assertModelAllowed(req: FastifyRequest, model: string): void {
  const k = keyOf(req);
  if (k?.models && !k.models.has(model)) throw new GatewayError(403, 'model_not_allowed', `this API key may not use ${JSON.stringify(model.slice(0, 256))} (its model allowlist)`);
}

/** 403 request_cost_limit_exceeded when a worst case of `worst` micro-USD is above the request's key's cost cap. */
export function assertWithinKeyCap(req: FastifyRequest, worst: bigint): void {
  const cap = keyOf(req)?.maxCostMicroUsd;
  if (cap !== undefined && worst > cap) throw new GatewayError(403, 'request_cost_limit_exceeded', `the request's worst case ${worst} micro-USD is above this API key's cost cap ${cap}`);
}

/** The stricter of the request's X-Service-Max-Cost-Usd (micro-USD string) and its key's cost cap. */
export function effectiveCostCap(req: FastifyRequest, header: string | undefined): string | undefined {
  const keyCap = keyOf(req)?.maxCostMicroUsd;
  if (keyCap === undefined) return header;
  return header === undefined || BigInt(header) > keyCap ? keyCap.toString() : header;
}

function problem(where: string, message: string): Error {
  return new Error(`${where}: ${message}`);
}

/** A keys file line's options (`name=value`, space-separated after the key) as a spec. Throws naming the option. */
function parseOptions(where: string, key: string, words: string[]): ApiKeySpec {
  const spec: ApiKeySpec = { key };
  const seen = new Set<string>();
  for (const w of words) {
    const eq = w.indexOf('=');
    // (The word is not quoted: it may be a second key pasted on the line, and this goes to logs.)
    if (eq <= 0) throw problem(where, 'expected name=value after the key, got a word without "=" (one key a line)');
    const name = w.slice(0, eq);
    const value = w.slice(eq + 1);
    if (seen.has(name)) throw problem(where, `${name} given twice`);
    seen.add(name);
    const usd = (example: string): bigint => {
      const micro = parseUsd(value);
      if (micro === undefined) throw problem(where, `${name}: expected a USD amount with at most 6 decimal places (like "${example}"), got "${value.slice(0, 64)}"`);
      return micro;
    };
    const list = (): string[] => {
      const items = value.split(',');
      if (items.some((s) => s === '')) throw problem(where, `${name}: expected a comma-separated list without empty items`);
      return items;
    };
    switch (name) {
      case 'name':
        spec.name = value;
        break;
      case 'rate_limit': {
        const n = INT_RE.test(value) ? Number(value) : NaN;
        if (!(n >= 1 && n <= RATE_LIMIT_MAX)) throw problem(where, `rate_limit: expected requests a minute, 1 to ${RATE_LIMIT_MAX}, got "${value.slice(0, 64)}"`);
        spec.rateLimit = n;
        break;
      }
      case 'scopes':
        spec.scopes = list();
        break;
      case 'models':
        spec.models = list();
        break;
      case 'max_cost_usd':
        spec.maxCostMicroUsd = usd('0.25');
        break;
      case 'expires': {
        const m = /^(\d{4})-(\d{2})-(\d{2})T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:\d{2})$/.exec(value);
        // (Date.parse rolls 31 February over into March: the day must exist in its month.)
        const t = m && new Date(Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3]))).getUTCDate() === Number(m[3]) ? Date.parse(value) : NaN;
        if (!Number.isFinite(t)) throw problem(where, `expires: expected an ISO 8601 time with its zone (like 2027-01-31T00:00:00Z), got "${value.slice(0, 64)}"`);
        spec.expiresAt = t;
        break;
      }
      case 'spend_limit_usd':
        spec.spendLimitMicroUsd = usd('25');
        break;
      case 'spend_interval':
        if (!(SPEND_INTERVALS as readonly string[]).includes(value)) throw problem(where, `spend_interval: expected ${SPEND_INTERVALS.join(', ')} (omitted: a lifetime budget), got "${value.slice(0, 64)}"`);
        spec.spendInterval = value as SpendInterval;
        break;
      default:
        throw problem(where, `unknown option${/^[a-z_]{1,32}$/.test(name) ? ` "${name}"` : ''} (expected name, rate_limit, scopes, models, max_cost_usd, expires, spend_limit_usd or spend_interval)`);
    }
  }
  return spec;
}

/**
 * Reads an API keys file: one key a line, optionally followed by its limits as name=value words
 * (`sk-svc-v1-… name=ci rate_limit=60 scopes=CHAT,EMBEDDINGS models=acme/tiny max_cost_usd=0.05
 * expires=2027-01-31T00:00:00Z`); blank lines and lines starting with # are skipped. Throws with
 * the line at fault.
 */
export function readApiKeysFile(file: string): ApiKeySpec[] {
  let text: string;
  try {
    text = readTextFile(file);
  } catch (e) {
    throw new Error(`cannot read the API keys file ${file}: ${fsProblem(e)}`);
  }
  const specs: ApiKeySpec[] = [];
  const seen = new Set<string>();
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) return;
    const where = `${file}:${i + 1}`;
    const [key, ...words] = line.split(/[ \t]+/);
    if (!KEY_RE.test(key!)) throw problem(where, 'an API key is 16 to 256 visible ASCII characters, without spaces');
    // A line of options alone (a long line wrapped) would otherwise be a key anyone could guess.
    if (/^[a-z_]{1,32}=/.test(key!)) throw problem(where, 'starts with name=value, not a key: a key\'s options follow it on its own line');
    if (seen.has(key!)) throw problem(where, 'the API key is listed twice');
    seen.add(key!);
    const spec = parseOptions(where, key!, words);
    try {
      policyOf(spec);
    } catch (e) {
      throw problem(where, (e as Error).message.replace(/^gateway: /, ''));
    }
    specs.push(spec);
  });
  if (specs.length === 0) throw new Error(`${file} holds no API key`);
  return specs;
}

/** A spec checked and turned into the policy the gateway holds. Throws TypeError naming the field. */
function policyOf(spec: ApiKeySpec): KeyPolicy {
  if (!KEY_RE.test(spec.key)) throw new TypeError('gateway: an API key is 16 to 256 visible ASCII characters, without spaces');
  if (spec.name !== undefined && !NAME_RE.test(spec.name)) throw new TypeError('gateway: name: expected 1 to 64 letters, digits, ".", "_" or "-"');
  const rate = spec.rateLimit ?? RATE_LIMIT_DEFAULT;
  if (!Number.isSafeInteger(rate) || rate < 1 || rate > RATE_LIMIT_MAX) throw new TypeError(`gateway: rate_limit: expected 1 to ${RATE_LIMIT_MAX} requests a minute`);
  const scopes = spec.scopes ?? ['*'];
  for (const s of scopes) if (s !== '*' && !(SCOPES as readonly string[]).includes(s)) throw new TypeError(`gateway: scopes: unknown scope "${s.slice(0, 64)}" (expected * or ${SCOPES.join(', ')})`);
  if (spec.models) for (const m of spec.models) if (!MODEL_RE.test(m)) throw new TypeError(`gateway: models: "${m.slice(0, 64)}" is not a model id`);
  if (spec.maxCostMicroUsd !== undefined && spec.maxCostMicroUsd < 0n) throw new TypeError('gateway: max_cost_usd: expected an amount of at least 0');
  if (spec.expiresAt !== undefined && !Number.isFinite(spec.expiresAt)) throw new TypeError('gateway: expires: expected a time');
  if (spec.spendLimitMicroUsd !== undefined && spec.spendLimitMicroUsd < 0n) throw new TypeError('gateway: spend_limit_usd: expected an amount of at least 0');
  if (spec.spendInterval !== undefined && spec.spendLimitMicroUsd === undefined) throw new TypeError('gateway: spend_interval: given without spend_limit_usd');
  const hash = sha256Hex(spec.key);
  const label = spec.name ?? hash.slice(0, 12);
  return {
    id: hash.slice(0, 32),
    label,
    scopes: new Set(scopes),
    models: spec.models ? new Set(spec.models) : undefined,
    maxCostMicroUsd: spec.maxCostMicroUsd,
    expiresAt: spec.expiresAt,
    window: new SlidingWindow(rate, MINUTE_MS),
    // (The spend is kept under a hash of the key: stable across restarts, and not the key.)
    spend: spec.spendLimitMicroUsd === undefined ? undefined : { id: hash.slice(0, 32), label, limitMicroUsd: spec.spendLimitMicroUsd, interval: spec.spendInterval ?? 'lifetime' },
  };
}

/** Keys by their SHA-256, each checked (TypeError naming the field); a key kept from `before` with the same rate limit keeps its rate window. */
function policies(keys: readonly (string | ApiKeySpec)[], before?: ReadonlyMap<string, KeyPolicy>): Map<string, KeyPolicy> {
  const known = new Map<string, KeyPolicy>();
  for (const k of keys) {
    const spec = typeof k === 'string' ? { key: k } : k;
    const hash = sha256Hex(spec.key);
    if (known.has(hash)) throw new TypeError('gateway: an API key is listed twice');
    const p = policyOf(spec);
    const old = before?.get(hash);
    known.set(hash, old && old.window.limit === p.window.limit ? { ...p, window: old.window } : p);
  }
  return known;
}

/**
 * The gateway's API keys: the onRequest check (routes under /v1/models are open, as the spec has
 * them), and replace() for a changed keys file: a key no longer listed is refused from the next
 * request on (the spec: "Revocation takes effect immediately").
 */
export class ApiKeys {
  private known: Map<string, KeyPolicy>;
  private readonly clock: ApiKeyClock;

  constructor(keys: readonly (string | ApiKeySpec)[], clock: ApiKeyClock = systemClock) {
    this.known = policies(keys);
    this.clock = clock;
  }

  /** How many keys are accepted. */
  get size(): number {
    return this.known.size;
  }

  /** Takes `keys` instead (all checked first: a bad list changes nothing). Keys kept keep their rate windows. */
  replace(keys: readonly (string | ApiKeySpec)[]): void {
    if (keys.length === 0) throw new TypeError('gateway: no API key: a gateway started with keys keeps at least one');
    this.known = policies(keys, this.known);
  }

  readonly onRequest = async (req: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const { known, clock } = this;
    const path = req.url.split('?')[0]!;
    if ((req.method === 'GET' || req.method === 'HEAD') && (path === '/v1/models' || path.startsWith('/v1/models/'))) return;
    const auth = req.headers.authorization;
    const bearer = typeof auth === 'string' ? /^Bearer[ \t]+(.*)$/is.exec(auth)?.[1]?.trim() : undefined;
    const alt = req.headers['x-service-api-key'];
    const presented = bearer ?? (typeof alt === 'string' ? alt.trim() : undefined);
    if (presented === undefined || presented === '') throw unauthorized(reply, 'missing_api_key', 'this gateway needs an API key: send Authorization: Bearer <key>');
    const k = known.get(sha256Hex(presented));
    if (!k) throw unauthorized(reply, 'invalid_api_key', 'the API key is not one this gateway accepts');
    if (k.expiresAt !== undefined && clock.wallMs() >= k.expiresAt) throw unauthorized(reply, 'api_key_expired', `the API key expired at ${new Date(k.expiresAt).toISOString()}`);
    keyOfRequest.set(req, k);
    // On the raw response, so streamed answers (written past fastify) carry them too.
    const raw = reply.raw;
    raw.setHeader('x-ratelimit-limit', String(k.window.limit));
    const taken = k.window.take(clock.monotonicMs());
    if (!taken.ok) {
      raw.setHeader('x-ratelimit-remaining', '0');
      const seconds = Math.ceil(taken.retryAfterMs / 1000);
      void reply.header('retry-after', String(seconds));
      throw new GatewayError(429, 'rate_limit_exceeded', `this API key may make ${k.window.limit} requests a minute: try again in ${seconds} s`);
    }
    raw.setHeader('x-ratelimit-remaining', String(taken.remaining));
    const need = ROUTE_SCOPES[`${req.method} ${req.routeOptions.url ?? ''}`];
    if (need !== undefined && !k.scopes.has('*') && !k.scopes.has(need)) throw new GatewayError(403, 'insufficient_scope', `this API key lacks the ${need} scope this route needs`);
  };
}

/** A 401, with the challenge HTTP asks of one (RFC 9110 §11.6.1). */
function unauthorized(reply: FastifyReply, code: string, message: string): GatewayError {
  void reply.header('www-authenticate', 'Bearer');
  return new GatewayError(401, code, message);
}

