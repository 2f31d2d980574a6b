// Ticket issuance: pick a live provider that serves the model and meets the routing, set the hold,
// sign a ticket valid for 60 s, and remember it so receipts can be matched to it.
import crypto from 'node:crypto';
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import { FieldError } from '../../attestation/fields.ts';
import type { Rates } from '../../attestation/money.ts';
import { ratesToWire, type WireRates } from '../../attestation/receipt.ts';
import { signTicket, TICKET_VERSION, validateTicketPayload, type TicketPayload, type TicketRouting } from '../../attestation/ticket.ts';
import { checkOffer, contextWorstCase, MODEL_NOT_ACCEPTING, NOT_ACCEPTING, quantizationBucket, type Refusal } from '../dispatch/routing.ts';
import { PAID_ENDPOINTS } from '../serve/contract.ts';
import { MarketError } from './errors.ts';
import { isLive } from './providers.ts';
import { modelServes, type RegisteredModel } from './registration-payload.ts';
import type { MarketStore, ProviderRecord } from './store.ts';

export const TICKET_TTL_MS = 60_000;
export const DEFAULT_ACCOUNT = 'dev';

export interface TicketRequest {
  endpoint: string;
  model: string;
  body_sha256: string;
  routing?: TicketRouting;
  max_cost_micro_usd?: string;
  request_id?: string;
  account?: string;
  /** X-Service-Prefer-Providers: an ordered strict set; the first eligible one in the list wins. */
  providers?: string[];
}

export interface IssuedTicketResponse {
  ticket: DsseEnvelope;
  request_id: string;
  provider: string;
  peer_id: string;
  addresses: string[];
  price_version: string;
  /** The model's rates under that price version: what the receipt must bill at (optional for other markets). */
  rates?: WireRates;
}

export interface TicketContext {
  store: MarketStore;
  signer: { seed: Uint8Array; keyid: string };
  now: number;
  heartbeatIntervalMs: number;
}

/**
 * Why a live provider cannot take this request, or undefined when it can: the node's own check of
 * its offer (checkOffer in src/dispatch/routing.ts) against what the provider registered. The
 * market does not know the request's tokens, so only the node judges context fit and the cost cap.
 */
function unmet(r: TicketRouting, p: ProviderRecord, m: RegisteredModel, rates: Rates): Refusal | undefined {
  if (p.capacity && !p.capacity.accepting) return NOT_ACCEPTING;
  if (p.capacity?.models.find((c) => c.id === m.id)?.accepting === false) return MODEL_NOT_ACCEPTING;
  const offer = { contextLength: m.context, quantization: m.quantization, tokensPerSecond: m.tokens_per_second, tier: p.attestation_tier, rates };
  return checkOffer(offer, r);
}

/** Free slots as the latest heartbeat reported them (all slots when none arrived yet). */
function freeSlots(p: ProviderRecord, model: RegisteredModel): number {
  const c = p.capacity?.models.find((m) => m.id === model.id);
  return c ? c.free_slots : model.slots;
}

function validated(payload: TicketPayload): TicketPayload {
  try {
    return validateTicketPayload(payload);
  } catch (e) {
    if (e instanceof FieldError) throw new MarketError(400, 'invalid_request', e.message);
    throw e;
  }
}

export function issueTicket(ctx: TicketContext, req: TicketRequest): IssuedTicketResponse {
  const { store, now } = ctx;
  // Check the request's own fields (and the routing) before choosing anyone.
  const draft: TicketPayload = {
    v: TICKET_VERSION,
    ticket_id: 'tkt-' + crypto.randomUUID(),
    request_id: req.request_id ?? 'req-' + crypto.randomUUID(),
    provider: '0'.repeat(64),
    account: req.account ?? DEFAULT_ACCOUNT,
    endpoint: req.endpoint,
    model: req.model,
    price_version: 'p',
    max_cost_micro_usd: req.max_cost_micro_usd ?? '0',
    body_sha256: req.body_sha256,
    // Passed through as given, except the quantization, which is resolved to its bucket.
    routing: req.routing?.quantization === undefined || typeof req.routing.quantization !== 'string' ? (req.routing ?? {}) : { ...req.routing, quantization: quantizationBucket(req.routing.quantization) },
    issued_at: now,
    expires_at: now + TICKET_TTL_MS,
  };
  validated(draft);
  // Only endpoints nodes bill: they answer tokenize and count_tokens free, without a ticket, so a
  // ticket for them would hold money that no receipt ever settles.
  if (!(PAID_ENDPOINTS as readonly string[]).includes(req.endpoint)) {
    throw new MarketError(400, 'invalid_request', `endpoint: "${req.endpoint.slice(0, 64)}" is not one nodes take tickets for (${PAID_ENDPOINTS.join(', ')})`);
  }
  // Tickets need no credentials, so their number is bounded: each holds money until it settles or expires.
  const outstanding = store.outstandingTickets(now);
  if (outstanding >= store.limits.maxOutstandingTickets) {
    throw new MarketError(503, 'too_many_tickets', `${outstanding} tickets are outstanding (issued, neither settled nor expired), the market's limit: try again when some settle or expire (a ticket lives ${TICKET_TTL_MS / 1000} s)`);
  }
  if (!store.roomForTicket(now)) {
    throw new MarketError(503, 'too_many_tickets', `the market remembers ${store.limits.maxTickets} tickets, its limit, none of them settled or expired: try again when some expire (a ticket lives ${TICKET_TTL_MS / 1000} s)`);
  }

  const allowed = req.providers;
  const listing = [...store.providers.values()].flatMap((p) => {
    const m = p.models.find((x) => x.id === req.model);
    return m ? [{ p, m, rates: p.rates.get(m.id)! }] : [];
  });
  // A model is sold for the endpoints its registration names (one without a chat template: not chat's).
  const all = listing.filter((c) => modelServes(c.m, req.endpoint));
  if (listing.length > 0 && all.length === 0) {
    throw new MarketError(404, 'model_not_found', `no registered provider serves ${req.endpoint} for model "${req.model.slice(0, 200)}" (it is sold for ${[...new Set(listing.flatMap((c) => c.m.endpoints ?? []))].join(', ')} only)`);
  }
  if (all.length > 0 && allowed && !all.some((c) => allowed.includes(c.p.provider))) {
    throw new MarketError(503, 'no_provider', `none of the preferred providers serves "${req.model.slice(0, 200)}"`);
  }
  const serving = allowed ? all.filter((c) => allowed.includes(c.p.provider)) : all;
  if (serving.length === 0) throw new MarketError(404, 'model_not_found', `no registered provider serves model "${req.model.slice(0, 200)}"`);
  const live = serving.filter((c) => isLive(c.p, now, ctx.heartbeatIntervalMs));
  if (live.length === 0) throw new MarketError(503, 'no_provider', `${serving.length} registered provider(s) serve "${req.model.slice(0, 200)}", none is live`);
  const reasons: Refusal[] = [];
  const eligible = live.filter((c) => {
    const why = unmet(draft.routing, c.p, c.m, c.rates);
    if (why) reasons.push(why);
    return !why;
  });
  // With a preference list its order decides (failover follows it); otherwise the most free slots.
  const best = allowed
    ? eligible.sort((a, b) => allowed.indexOf(a.p.provider) - allowed.indexOf(b.p.provider))[0]
    : eligible.sort((a, b) => freeSlots(b.p, b.m) - freeSlots(a.p, a.m) || a.p.last_ticket_at - b.p.last_ticket_at)[0];
  if (!best) {
    // The spec: a price ceiling refuses the request before any hold, with 403 price_ceiling_exceeded.
    if (reasons.length > 0 && reasons.every((r) => r.code === 'price_ceiling_exceeded')) throw new MarketError(403, 'price_ceiling_exceeded', `every provider of "${req.model.slice(0, 200)}" is above the price ceiling: ${reasons[0]!.message}`);
    throw new MarketError(503, 'no_provider', `no live provider of "${req.model.slice(0, 200)}" meets the routing: ${reasons[0]?.message}`);
  }

  const hold = req.max_cost_micro_usd ?? contextWorstCase(best.m.context, best.rates).toString();
  const payload = validated({ ...draft, provider: best.p.provider, price_version: best.p.price_version, max_cost_micro_usd: hold });
  const ticket = signTicket(payload, ctx.signer);
  best.p.last_ticket_at = now;
  store.addTicket(
    { ticket_id: payload.ticket_id, request_id: payload.request_id, provider: payload.provider, endpoint: payload.endpoint, model: payload.model, price_version: payload.price_version, body_sha256: payload.body_sha256, rates: best.rates, hold: BigInt(hold), issued_at: payload.issued_at, expires_at: payload.expires_at },
    now,
  );
  return { ticket, request_id: payload.request_id, provider: best.p.provider, peer_id: best.p.peer_id, addresses: best.p.addresses, price_version: best.p.price_version, rates: ratesToWire(best.rates) };
}
