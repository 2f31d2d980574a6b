// POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings: the paid endpoints.
// The exact body bytes are hashed, the X-Service-* headers become the ticket's routing, the
// marketplace issues a ticket (Ticketing), the provider is dialled by its PeerId, and its answer
// is relayed (Relay). A provider that cannot start the request fails over to the next; a hedged
// request races two providers.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { sha256Hex } from '../../attestation/hash.ts';
import type { JsonObject } from '../p2p/frames.ts';
import type { Host } from '../p2p/host.ts';
import { INFER_PROTOCOL } from '../p2p/infer-protocol.ts';
import { isUnsupportedProtocol, readResponse, request as p2pRequest, type Response as P2pResponse } from '../p2p/request-stream.ts';
import { ratesFromWire } from '../../attestation/receipt.ts';
import { contextWorstCase } from '../dispatch/routing.ts';
import { fitProvidersOf, notSellingFor } from './candidates.ts';
import { GatewayError, headStatus, invalid, providerRefusal } from './errors.ts';
import { canonicalBodySha256, routingKey, type EstimateStore } from './estimates.ts';
import { IdleWatch } from './idle-watch.ts';
import type { RequestRecords } from './records.ts';
import type { Relay } from './relay.ts';
import { bodyBytes, idempotencyKey, isObj } from './request-body.ts';
import { parseRoutingHeaders, type RoutingControls } from './routing-headers.ts';
import { assertModelAllowed, effectiveCostCap, keyOf } from './api-keys.ts';
import { budgetTooSmall, type KeySpend, type SpendReservation } from './key-spend.ts';
import type { Settlements } from './settlement.ts';
import type { ProviderEntry } from './market-client.ts';
import { ContractError, PAID_ENDPOINTS, parseRequest, type PaidEndpoint } from '../serve/contract.ts';
import { embeddingsHold, idempotencyProviderUnavailable, idempotentKey, paidOf, type Granted, type Paid, type TicketAsk, type Ticketing } from './tickets.ts';

export interface PaidRouteDeps {
  host: Host;
  ticketing: Ticketing;
  relay: Relay;
  settlements: Settlements;
  records: RequestRecords;
  estimates: EstimateStore;
  /** How long a provider may send nothing (IdleWatch). */
  providerIdleMs: number;
  /** How long keepalives alone may keep a provider (IdleWatch; its default unless given). */
  providerKeepaliveMaxMs?: number;
  /** When the reconciler first looks at a request after it starts (reconcile.ts). */
  firstLookMs: number;
  /** The API keys' spend limits (when a key has one). */
  spend?: KeySpend;
}

/** How many times a paid request moves on to another provider that could not start it. */
const MAX_FAILOVERS = 2;

/** A provider could not start the request (nothing done, nothing charged): the next one may. */
class Failover extends Error {
  readonly provider: string;
  readonly error: GatewayError;
  /** Not the provider's fault: the hedge's half cap was too small; run once, unhedged. */
  readonly unhedge: boolean;
  constructor(provider: string, error: GatewayError, unhedge = false) {
    super(error.message);
    this.provider = provider;
    this.error = error;
    this.unhedge = unhedge;
  }
}

/** A paid request as the buyer sent it: the same for every attempt at it. */
/** A paid request once its caps are set: what paidCapped runs. */
interface CappedRequest {
  endpoint: PaidEndpoint;
  req: FastifyRequest;
  reply: FastifyReply;
  idem: string | undefined;
  answered: () => void;
  controls: RoutingControls;
  model: string;
  body: Buffer;
  spend: SpendReservation | undefined;
  /** The market's listing, when it was read already. */
  listing: Promise<ProviderEntry[]> | undefined;
}

/**
 * The most an uncapped request can cost at any listed provider of its model: the worst case at
 * the provider's context (input and output together never exceed it) at its higher rate, or for
 * embeddings a token a byte of the body at the highest input rate; twice that for a hedge (two
 * runs) when two providers or more price the model (with one, a hedge runs once). Undefined when
 * no provider prices the model.
 */
export function uncappedWorstCase(listing: readonly ProviderEntry[], endpoint: PaidEndpoint, model: string, body: Uint8Array, hedge: boolean): bigint | undefined {
  let worst: bigint | undefined;
  let priced = 0;
  if (endpoint === 'embeddings') {
    const hold = embeddingsHold(listing, model, body);
    worst = hold === undefined ? undefined : BigInt(hold);
  } else {
    for (const p of listing) {
      const r = p.rates?.[model];
      const context = p.models.find((m) => m.id === model)?.context;
      if (!r || context === undefined || !Number.isSafeInteger(context) || context < 0) continue;
      const w = contextWorstCase(context, ratesFromWire(r));
      priced++;
      if (worst === undefined || w > worst) worst = w;
    }
  }
  return worst === undefined ? undefined : hedge && priced >= 2 ? 2n * worst : worst;
}

interface PaidAsk {
  endpoint: PaidEndpoint;
  body: Buffer;
  model: string;
  bodySha256: string;
  idem: string | undefined;
  /** Called once the buyer has the whole answer. */
  answered: () => void;
  /** The hold when the buyer sets no cap: for embeddings, one that covers the whole batch. */
  uncappedHold: string | undefined;
  /** The market's listing, fetched once for the whole request (hedge and failover lists, the embeddings hold). */
  providers: () => Promise<ProviderEntry[]>;
  /** Providers that could not start it (failover): not asked again, not even as a hedge's second half. */
  tried: string[];
  /** Its share of its API key's spend limit, when the key has one: each attempt's hold is held under it. */
  spend: SpendReservation | undefined;
}

export function registerPaidRoutes(app: FastifyInstance, d: PaidRouteDeps): void {
  const { ticketing, relay, settlements, records } = d;
  /**
   * Idempotency-Keys of the paid requests running now, whatever their endpoint. A second request
   * under one of them is 409 idempotency_in_progress, as a node answers: until the first has its
   * provider's answer, the retry would be ticketed afresh, probably to another provider (each node
   * guards only its own requests), and both would run and be billed. (Per key alone: the same key
   * on two endpoints at once ran, and was billed, twice; one after the other, the provider that
   * answered the first refuses the second, idempotency_key_reused.)
   */
  const running = new Set<string>();

  /** A paid request; one under an Idempotency-Key already running here is refused (see `running`). */
  async function paid(endpoint: PaidEndpoint, req: FastifyRequest, reply: FastifyReply): Promise<unknown> {
    const idem = idempotencyKey(req.raw);
    if (idem === undefined) return paidOnce(endpoint, req, reply, idem, () => {});
    if (running.has(idem)) throw new GatewayError(409, 'idempotency_in_progress', 'a request under this Idempotency-Key is still running here; retry once it has ended');
    running.add(idem);
    // Released once the buyer has the whole answer (a stream's relay then waits for the market's
    // settlement, which a retry, answered from the provider's record, need not wait for), or at the
    // end; once only (a retry that came in between holds the key by then).
    let held = true;
    const release = (): void => {
      if (held) running.delete(idem);
      held = false;
    };
    try {
      return await paidOnce(endpoint, req, reply, idem, release);
    } finally {
      release();
    }
  }

  /** A paid request: its body judged, its API key's allowlist, cost cap and spend limit applied, then run. */
  async function paidOnce(endpoint: PaidEndpoint, req: FastifyRequest, reply: FastifyReply, idem: string | undefined, answered: () => void): Promise<unknown> {
    const controls = parseRoutingHeaders(req.headers);
    const body = bodyBytes(req);
    // The node's own request contract, judged here first: a body any node would refuse (400 naming
    // the field) takes no ticket, no hold and no round trip to a provider.
    let model: string;
    try {
      model = parseRequest(endpoint, body).model;
    } catch (e) {
      if (e instanceof ContractError) throw new GatewayError(400, 'invalid_request', e.message); // (as the node words it)
      throw e;
    }
    assertModelAllowed(req, model);
    // The API key's cost cap, if it has one, where it is stricter than X-Service-Max-Cost-Usd.
    const costCap = effectiveCostCap(req, controls.routing.max_cost_micro_usd);
    if (costCap !== undefined) controls.routing.max_cost_micro_usd = costCap;
    // A key with a spend limit: what is left of it (if less) is the cap too, reserved until the end.
    const limit = keyOf(req)?.spend;
    let listing: Promise<ProviderEntry[]> | undefined;
    let spend: SpendReservation | undefined;
    if (limit && d.spend) {
      // Without a cap, what the request can cost wherever it may run bounds the reservation (not
      // the whole remainder), so a key's requests run side by side while its budget allows.
      const cap = costCap !== undefined ? BigInt(costCap) : uncappedWorstCase(await (listing = ticketing.providers()), endpoint, model, body, controls.routing.hedge === true);
      // (A retry of a request already answered reserves 0 when nothing is left: its node answers it from its record, free.)
      spend = d.spend.reserve(limit, cap, { retry: ticketing.isRetry(endpoint, idem) });
      controls.routing.max_cost_micro_usd = spend.amount.toString();
    }
    try {
      return await paidCapped({ endpoint, req, reply, idem, answered, controls, model, body, spend, listing });
    } catch (e) {
      // The node's refusal of a request whose worst case the budget left cannot pay for.
      if (spend?.budgetBound && e instanceof GatewayError && e.code === 'request_cost_limit_exceeded') throw budgetTooSmall(limit!, spend.amount);
      throw e;
    } finally {
      spend?.end();
    }
  }

  /**
   * A paid request, run. When its provider cannot start it (unreachable, or no capacity: nothing done,
   * nothing charged) it fails over to the next provider: the next of X-Service-Prefer-Providers in
   * order (never one outside the set), else any other live provider of the model; a few times at
   * most, each attempt under its own request id and ticket. Hedged requests already run twice and
   * do not fail over.
   */
  async function paidCapped(r: CappedRequest): Promise<unknown> {
    const { endpoint, req, reply, idem, answered, model, body, spend } = r;
    let controls = r.controls;
    // What every attempt sends: worked out once, however many attempts there are.
    let listing = r.listing;
    const ask: PaidAsk = { endpoint, body, model, bodySha256: sha256Hex(body), idem, answered, uncappedHold: undefined, providers: () => (listing ??= ticketing.providers()), tried: [], spend };
    if (controls.estimateId !== undefined) {
      // The request must be the one estimated, under the same routing controls; its hold is capped
      // at the estimate's maximum, so a higher live maximum is refused (403) before any hold.
      const est = d.estimates.get(controls.estimateId);
      if (!est) throw invalid('X-Service-Estimate', 'unknown or expired estimate');
      if (est.endpoint !== endpoint || est.model !== model || est.bodySha256 !== canonicalBodySha256(body)) throw invalid('X-Service-Estimate', 'the estimate is for another request');
      if (est.routing !== routingKey(controls)) throw invalid('X-Service-Estimate', 'the estimate was made under other routing controls');
      if (est.keyId !== (keyOf(req)?.id ?? null)) throw invalid('X-Service-Estimate', 'the estimate was made under another API key');
      const asked = controls.routing.max_cost_micro_usd;
      const cap = asked === undefined || BigInt(asked) > est.maxHoldMicroUsd ? est.maxHoldMicroUsd : BigInt(asked);
      controls.routing.max_cost_micro_usd = cap.toString();
    }
    if (endpoint === 'embeddings' && controls.routing.max_cost_micro_usd === undefined) ask.uncappedHold = embeddingsHold(await ask.providers(), model, body);
    const { tried } = ask;
    let lastFailure: GatewayError | undefined;
    /** A provider that failed over had the buyer's wait (no capacity, or a failure at the node): the next must start at once. */
    let waited = false;
    /** The hedge was given up for one run with the whole cap (see runsUnhedged): its attempts' ids say so. */
    let unhedged = false;
    for (;;) {
      const n = tried.length; // failovers so far
      let routed = controls;
      if (n > 0) {
        const listing = await ask.providers();
        const fit = fitProvidersOf(listing, model, endpoint, controls.routing, tried);
        // X-Service-Prefer-Providers keeps its order; a provider whose context is known too small,
        // or that does not sell the model for this endpoint, is skipped.
        const notSold = notSellingFor(listing, model, endpoint);
        const rest = controls.preferredProviders
          ? controls.preferredProviders.filter((id) => !tried.includes(id) && !notSold.has(id) && (controls.routing.min_context === undefined || fit.includes(id)))
          : fit;
        if (rest.length === 0) throw lastFailure!;
        // A provider already had the buyer's whole wait: the next starts now or refuses.
        routed = { ...controls, preferredProviders: rest, routing: { ...controls.routing, ...(waited ? { max_wait_ms: 0 } : {}) } };
      }
      const id = `${req.id}${unhedged ? '-whole' : ''}${n > 0 ? `-f${n}` : ''}`;
      try {
        return await paidAttempt(ask, reply, routed, id, n < MAX_FAILOVERS);
      } catch (e) {
        if (!(e instanceof Failover)) throw e;
        lastFailure = e.error;
        if (e.unhedge && !unhedged) {
          // Half the cap could not pay for a hedged attempt: run once, with the whole cap. Not a
          // failover: the refusals came at once, so the buyer's wait and failovers are still theirs.
          unhedged = true;
          controls = { ...controls, routing: { ...controls.routing, hedge: false } };
          continue;
        }
        // A retry that went back to the provider holding its answer goes nowhere else: it would run
        // and be billed again there.
        const answeredBy = ticketing.answeredBy(endpoint, ask.idem);
        if (answeredBy !== undefined && e.provider === answeredBy) throw idempotencyProviderUnavailable(answeredBy, e.error.message);
        // (Only an attempt with failovers left throws a plain Failover: see paidAttempt's mayFailOver.)
        tried.push(e.provider);
        if (e.error.code === 'context_length_exceeded') {
          // Its context cannot hold the request (the market picks without counting tokens): the next
          // provider must have a larger one (spec: the effective X-Service-Min-Ctx floor is never
          // below the request's need). Refused at once: the buyer's wait is still whole.
          const context = listedContext(await ask.providers(), e.provider, model);
          if (context === undefined) throw e.error;
          controls = { ...controls, routing: { ...controls.routing, min_context: Math.max(controls.routing.min_context ?? 0, context + 1) } };
        } else if (e.error.code === 'no_capacity' || e.error.status === 500) waited = true;
        // (Not one unreachable, which no node queued, nor a cost or ticket refusal, which came at
        // once: the next keeps the buyer's wait. Until session 23 an unreachable provider cost the
        // wait too, and after a node's crash most requests failed over to a busy healthy one were
        // refused 503 no_capacity at once: s23 h1.)
      }
    }
  }

  async function paidAttempt(ask: PaidAsk, reply: FastifyReply, controls: RoutingControls, requestId: string, mayFailOver: boolean): Promise<unknown> {
    const { endpoint, body, model, bodySha256, idem, uncappedHold, tried } = ask;
    // A hedge runs twice: under X-Service-Max-Cost-Usd each attempt holds half the cap, so the two
    // together never hold more than the buyer allowed (the cap still judges the request; each node
    // caps its generation at what its hold pays for). Without a second provider it runs once, with
    // the whole cap; if half the cap cannot pay for an attempt, it runs once too (see paid()).
    // A retry going back to the provider that answered it is answered from its record: nothing to race.
    const retry = ticketing.isRetry(endpoint, idem);
    const live = controls.routing.hedge === true && endpoint !== 'embeddings' && !retry ? fitProvidersOf(await ask.providers(), model, endpoint, controls.routing, tried) : [];
    const hedge = live.length >= 2;
    const cap = controls.routing.max_cost_micro_usd;
    const halved = hedge && cap !== undefined;
    const hold = halved ? (BigInt(cap) / 2n).toString() : cap ?? uncappedHold;
    // Each half is also judged by its half (the node's cost cap), never only capped by it: a request
    // whose worst case half the cap cannot pay for is refused by both halves and run once, unhedged,
    // with the whole cap (see paid()), rather than cut short to what half the cap pays for.
    const halfControls = halved ? { ...controls, routing: { ...controls.routing, max_cost_micro_usd: hold! } } : controls;
    const tickets: TicketAsk = { endpoint, model, bodySha256, controls: halfControls, idem };
    let granted = await ticketing.ticketFor(tickets, requestId, hold);
    // (A retry going back to its first provider is never hedged: `retry` turned the hedge off.)
    const hedged = hedge ? await ticketing.hedgeTicket(tickets, live, granted.provider, `${requestId}-hedge`, hold) : undefined;
    // The second provider was listed but could not be ticketed: one attempt, with the whole cap.
    if (halved && !hedged) granted = await ticketing.ticketFor({ ...tickets, controls }, requestId, cap);
    const attempts: Attempt[] = [granted, ...(hedged ? [hedged] : [])].map((g) => {
      const ac = new AbortController();
      return { g, p: paidOf(g, idem !== undefined ? idempotentKey(endpoint, idem) : undefined), ac, idle: new IdleWatch(ac, d.providerIdleMs, d.providerKeepaliveMaxMs) };
    });
    // Each half of a hedge names the other, in its record and (the winner) in the answer's `service`.
    if (attempts.length === 2) [attempts[0]!.p.hedgedWith, attempts[1]!.p.hedgedWith] = [attempts[1]!.p.requestId, attempts[0]!.p.requestId];
    for (const a of attempts) {
      records.begin({ request_id: a.p.requestId, endpoint, model, provider: a.p.provider, ...(a.p.hedgedWith ? { hedged_with: a.p.hedgedWith } : {}) });
      ask.spend?.hold(a.p.requestId, BigInt(a.p.exp.holdMicroUsd));
      d.settlements.watch(a.p, d.firstLookMs);
    }

    // A buyer who leaves cancels the request at the node: its stream is reset, generation stops,
    // and the node writes a `cancelled` receipt for what it delivered.
    const raw = reply.raw;
    const gone = new AbortController();
    let finishedStream = false; // the whole SSE answer ([DONE]) was relayed: nothing left to cancel
    const onClose = (): void => {
      if (!raw.writableFinished && !finishedStream) gone.abort(new Error('the buyer left'));
    };
    // (Each attempt listens before a buyer already gone, while the ticket was asked for, aborts
    // it: an abort reaches no listener added after it, and the request would run and be billed.)
    for (const a of attempts) gone.signal.addEventListener('abort', () => a.ac.abort(gone.signal.reason), { once: true });
    raw.on('close', onClose);
    if (raw.destroyed) onClose();

    // Dispatch every attempt; the first to answer 200 wins, a refusal waits for the other.
    const dispatch = async (a: Attempt): Promise<Outcome> => {
      let res: P2pResponse;
      try {
        res = await p2pRequest(d.host, a.p.target, INFER_PROTOCOL, { endpoint, ticket: a.g.envelope as JsonObject, ...(idem !== undefined ? { idempotency_key: idem } : {}) }, body, { signal: a.ac.signal, onActivity: (keepalive) => (keepalive ? a.idle.keepalive() : a.idle.kick()) });
      } catch (e) {
        return { ok: false, a, stage: 'connect', e: e as Error, aborted: a.ac.signal.aborted };
      }
      try {
        const head = await res.head;
        a.idle.kick();
        return { ok: true, a, res, head, status: headStatus(head) };
      } catch (e) {
        // A node that does not take the protocol refused the stream before any handler saw it.
        return { ok: false, a, stage: isUnsupportedProtocol(e) ? 'connect' : 'head', e: e as Error, res, aborted: a.ac.signal.aborted };
      }
    };
    for (const a of attempts) a.running = dispatch(a).then((o) => (a.outcome = o));
    let outcome = await Promise.race(attempts.map((a) => a.running!));
    /** Whether the other half of a hedge failed without starting (not reached, or refused before work), and its refusal's code. */
    let otherNotStarted = false;
    let otherCode: string | undefined;
    if (attempts.length > 1 && !(outcome.ok && outcome.status === 200)) {
      const other = await attempts.find((a) => a !== outcome.a)!.running!;
      if (other.ok && other.status === 200) outcome = other;
      else if (other.ok) {
        otherNotStarted = other.status === 403 || other.status === 503;
        if (otherNotStarted) otherCode = (await refusalOf(other)).error.code;
      } else otherNotStarted = other.stage === 'connect';
    }
    // The loser is cancelled; what it did is settled from its node's log. One already refused, or
    // never reached (and not for the buyer's leaving), did nothing: it is recorded as such, with
    // nothing to fetch. Tracked at once, so close() waits for it before it closes the records.
    for (const a of attempts) {
      if (a === outcome.a) continue;
      const before = a.outcome; // known before the loser is cancelled: its own
      if (before?.ok && before.status !== 200) {
        // Its trailer is read before anything resets the stream (its idle clock still bounds the read).
        void settlements.track(
          a.p.requestId,
          refusalOf(before).then(({ error, refused }) => {
            a.idle.stop();
            records.fail(a.p.requestId, refused ? 'refused' : 'bad_provider_response', { code: error.code, message: error.message });
          }),
        );
        continue;
      }
      a.idle.stop();
      a.ac.abort(new Error('lost the hedge'));
      if (before && !before.ok && before.stage === 'connect' && !before.aborted) {
        records.fail(a.p.requestId, 'failed', { code: 'provider_unreachable', message: `could not reach provider ${a.p.provider}: ${before.e.message}` });
        settlements.releaseTicket(a.p);
        continue;
      }
      if (before && !before.ok && before.stage === 'head' && !before.aborted) {
        // Its own stream broke before its HEAD (neither half answered): the buyer got nothing of
        // it, so a receipt its log holds is recorded, never settled, as for the other half (s24 hA).
        void settlements.settleFromNode(a.p, 'failed', { undelivered: true });
        continue;
      }
      void settlements.track(
        a.p.requestId,
        a.running!.then((r) => {
          r.res?.abort('lost the hedge');
          const why = gone.signal.aborted ? 'abandoned' : 'lost_hedge';
          return sentNothing(r) ? settlements.nothingSent(a.p, why) : settlements.settleFromNode(a.p, why);
        }),
      );
    }
    const p = outcome.a.p;
    reply.header('x-request-id', p.requestId);
    const fail = (status: 'refused' | 'failed' | 'bad_provider_response', e: GatewayError): never => {
      records.fail(p.requestId, status, { code: e.code, message: e.message });
      // Nothing was done and nothing charged: the next provider may start it.
      // (A node's own failure before any work, a refusal 500 with no receipt, is the node's, not the request's.)
      const failOver =
        mayFailOver &&
        attempts.length === 1 &&
        !gone.signal.aborted &&
        ((e.status === 503 && (e.code === 'provider_unreachable' || e.code === 'no_capacity')) ||
          (e.status === 400 && e.code === 'context_length_exceeded') ||
          // It took the request and sent nothing (frozen, or its connection dead): its receipt, if
          // any, is withheld (no HEAD reached the buyer), so another provider may run it (s24 hD).
          (e.status === 504 && e.code === 'provider_timeout' && !settlements.stopping) ||
          // Its worst case (its context, its rates) is above the cap; another's may not be: the
          // market picks without counting tokens (the spec: "a request that no provider can serve
          // within the caller's limits stops": one that some provider can, runs).
          (e.status === 403 && e.code === 'request_cost_limit_exceeded') ||
          (status === 'refused' && e.status === 500) ||
          // It refused the market's ticket (another market key, a clock, a used id): it disagrees
          // with the market, did no work, and another provider may not (s23 h4: after a market
          // restart a node that trusts no market key was ticketed, and every such request was 502).
          (status === 'refused' && e.code.startsWith('ticket_')));
      // A hedged pair under half the cap each, neither started, one refused for its cost: half the
      // cap is what stopped it, so the request runs once, with the whole cap.
      const unhedge = attempts.length === 2 && !gone.signal.aborted && (e.status === 403 || e.status === 503) && runsUnhedged({ halved, otherNotStarted, codes: [e.code, otherCode] });
      if (!failOver && !unhedge) throw e;
      raw.off('close', onClose);
      throw new Failover(p.provider, e, unhedge);
    };

    const idle = outcome.a.idle;
    if (!outcome.ok) {
      idle.stop();
      if (gone.signal.aborted) return relay.abandon(p, reply, sentNothing(outcome));
      if (outcome.stage === 'connect') {
        settlements.releaseTicket(p);
        return fail('failed', new GatewayError(503, 'provider_unreachable', `could not reach provider ${p.provider}: ${outcome.e.message}`));
      }
      // The stream opened but no head came: the provider may have started; its log knows. The
      // buyer got nothing of it (stream or body), so a receipt found is recorded, never settled
      // (s23 h5: a completed receipt was billed for a 502).
      void settlements.settleFromNode(p, 'failed', { undelivered: true });
      // (A provider that never answered may fail over: whatever it did is never settled, as above.)
      if (idle.timedOut) return fail('failed', new GatewayError(504, 'provider_timeout', idle.onlyKeepalives ? `the provider sent no answer, only keepalives, for ${idle.quietMaxMs} ms` : `the provider sent no answer within ${idle.ms} ms`));
      throw new GatewayError(502, 'bad_provider_response', `the provider did not answer: ${outcome.e.message}`);
    }
    const { res, head, status } = outcome;
    if (status === 200 && idem !== undefined) ticketing.remember(endpoint, idem, p.provider, p.requestId);
    const headers = isObj(head.headers) ? head.headers : {};
    if (status !== 200) {
      // A refusal before any work: HEAD {status}, TRAILER {error}. Relay both; nothing was charged.
      const { error, refused } = await refusalOf(outcome);
      idle.stop();
      return fail(refused ? 'refused' : 'bad_provider_response', error);
    }
    const contentType = typeof headers['content-type'] === 'string' ? headers['content-type'] : '';
    if (contentType.startsWith('text/event-stream')) return relay.relayStream(p, res, reply, gone.signal, idle, () => {
        finishedStream = true;
        ask.answered();
      });
    return relay.relayBody(p, res, reply, gone.signal, idle);
  }

  for (const endpoint of PAID_ENDPOINTS) app.post(`/v1/${endpoint}`, (req, reply) => paid(endpoint, req, reply));
}

/** The context length a provider lists for a model, when it lists one. */
function listedContext(listing: readonly ProviderEntry[], provider: string, model: string): number | undefined {
  const c = listing.find((p) => p.provider === provider)?.models.find((m) => m.id === model)?.context;
  return typeof c === 'number' && Number.isSafeInteger(c) && c > 0 ? c : undefined;
}

/** One ticketed attempt at a paid request (two for a hedge), with what is known of it so far. */
interface Attempt {
  g: Granted;
  p: Paid;
  ac: AbortController;
  idle: IdleWatch;
  /** Its dispatch, up to its HEAD. */
  running?: Promise<Outcome>;
  /** Set once known; a hedge loser's is its own only if known before it was cancelled. */
  outcome?: Outcome;
  /** Its refusal, read once (the trailer can be read only once), whoever asks first. */
  refusal?: ReturnType<typeof readRefusal>;
}

/** How an attempt got to its HEAD. `aborted`: it had been cancelled (the buyer left, or it lost) when it failed. */
type Outcome = { ok: true; a: Attempt; res: P2pResponse; head: JsonObject; status: number } | { ok: false; a: Attempt; stage: 'connect' | 'head'; e: Error; res?: P2pResponse; aborted: boolean };

/**
 * Whether an attempt ended before its request left the gateway: the dial or the stream's opening
 * failed (cancelled while it still dialled, say), so its node never saw the ticket and no receipt
 * can exist. (p2pRequest writes nothing before it returns.)
 */
function sentNothing(o: Outcome): boolean {
  return !o.ok && o.stage === 'connect';
}

/** The refusal of an attempt answered with a status other than 200, read once. */
function refusalOf(o: Extract<Outcome, { ok: true }>): ReturnType<typeof readRefusal> {
  return (o.a.refusal ??= readRefusal(o.res, o.status));
}

/** A provider's answer other than 200 (HEAD, then a TRAILER with the error) as the buyer's error; see providerRefusal. */
async function readRefusal(res: P2pResponse, status: number): Promise<ReturnType<typeof providerRefusal>> {
  let trailer: JsonObject = {};
  try {
    trailer = (await readResponse(res)).trailer;
  } catch {
    // no error envelope: a bad provider response
  }
  return providerRefusal(status, trailer);
}

/**
 * Whether a hedged pair that failed is run again, once, unhedged and with the whole cap: only when
 * each half held half the buyer's cap, neither half started (each was refused before any work, or
 * not reached), and a half was refused for its cost (request_cost_limit_exceeded), the one refusal
 * that halving the cap can cause. Any other refusal (a price ceiling, no capacity, a bad request)
 * would meet the whole cap just the same, and is the buyer's answer.
 */
export function runsUnhedged(pair: { halved: boolean; otherNotStarted: boolean; codes: readonly (string | undefined)[] }): boolean {
  return pair.halved && pair.otherNotStarted && pair.codes.includes('request_cost_limit_exceeded');
}
