// Settling paid requests: every verified receipt is posted to the marketplace (retried briefly
// while it is unreachable) and recorded; a request that ended without a trailer has its receipt
// fetched from the node's log (/service/log/1.0.0) first. Settlements run in the background and are
// tracked by request id, so that GET /v1/requests/{id} and close() can wait for them.
import { setTimeout as delay } from 'node:timers/promises';
import type { Host } from '../p2p/host.ts';
import { LOG_PROTOCOL } from '../p2p/log-protocol.ts';
import { readResponse, request as p2pRequest } from '../p2p/request-stream.ts';
import { settledWithin } from '../settled-within.ts';
import { GatewayError } from './errors.ts';
import type { GatewayLogger } from './gateway-logger.ts';
import type { MarketClient } from './market-client.ts';
import { checkReceipt, type CheckedReceipt } from './receipt-check.ts';
import { providerListBacksReceipt, type DisputedRates } from './price-dispute.ts';
import type { RequestRecords } from './records.ts';
import type { Paid } from './tickets.ts';

export type VerifiedReceipt = Extract<CheckedReceipt, { ok: true }>;

/** Why a request that ended without a trailer ended, when its node has no receipt for it. */
export type EarlyEnd = 'abandoned' | 'failed' | 'lost_hedge';

/** How a request that ended early is recorded when its node has no receipt. */
const NO_RECEIPT = {
  lost_hedge: { code: 'hedge_cancelled', message: "the hedge's other attempt was used; this one was cancelled, and its provider's log has no receipt for it (yet: looked at again later); nothing was charged" },
  abandoned: { code: 'request_abandoned', message: "the buyer left; the provider's log has no receipt for it (yet: looked at again later); nothing was charged" },
  failed: { code: 'provider_failed', message: "the provider stopped answering, and its log has no receipt for this request (or could not be asked; looked at again later)" },
} as const;

/** Tries at POST /v1/receipts while the market is unreachable. */
const SETTLE_ATTEMPTS = 3;


export interface SettlementDeps {
  log: GatewayLogger;
  /** A request under an Idempotency-Key ended without completing: a retry is no longer its provider's alone (Ticketing.forget). */
  forgetIdempotent?: (key: string, requestId: string) => void;
  market: MarketClient;
  records: RequestRecords;
  host: Host;
  /** How long to keep asking a node for the receipt of a request that ended early. */
  receiptFetchMs: number;
}

export class Settlements {
  private readonly d: SettlementDeps;
  /** Settlements under way, by request id. */
  private readonly settling = new Map<string, Promise<void>>();
  /** Aborted by stop(): waits, retries and receipt fetches end at once. */
  private readonly stopper = new AbortController();

  constructor(deps: SettlementDeps) {
    this.d = deps;
  }

  /** How many settlements are under way. */
  get pending(): number {
    return this.settling.size;
  }

  /** Runs `work` as the settlement of request `id`: failures are logged, and waiters see it. */
  track(id: string, work: Promise<void>): Promise<void> {
    const p = work.catch((e: unknown) => this.d.log.error({ request_id: id, err: (e as Error)?.message }, 'settlement failed'));
    this.settling.set(id, p);
    void p.finally(() => {
      if (this.settling.get(id) === p) this.settling.delete(id);
    });
    return p;
  }

  /** Waits (until `deadline`, epoch ms) for the settlement of request `id`, including one that starts while waiting. */
  async waitFor(id: string, deadline: number): Promise<void> {
    for (let pending = this.settling.get(id); pending && Date.now() < deadline; pending = this.settling.get(id)) {
      await settledWithin(pending, Math.max(0, deadline - Date.now()));
    }
  }

  /** Resolves when every settlement under way (and any they start) is done. */
  async idle(): Promise<void> {
    while (this.settling.size > 0) await Promise.allSettled([...this.settling.values()]);
  }

  /**
   * Ends the settlements under way at their next step and resolves when they are done: no more
   * POSTs, retries or waits. A receipt not yet acknowledged is recorded as not settled
   * (settlement_interrupted, or the market's error when a POST already sent failed); a request
   * whose receipt was still being fetched keeps its record as it is (in_progress; `interrupted`
   * after a restart with a records file). The receipt stays in the node's log either way.
   */
  async stop(): Promise<void> {
    this.stopper.abort();
    await this.idle();
  }

  /** Whether stop() was called (the gateway is closing). */
  get stopping(): boolean {
    return this.stopper.signal.aborted;
  }

  /** Waits `ms`; false (at once) when the settlements are stopping. */
  private async pause(ms: number): Promise<boolean> {
    if (this.stopper.signal.aborted) return false;
    try {
      await delay(ms, undefined, { signal: this.stopper.signal });
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Request `id` has its own verified receipt. One under an Idempotency-Key (its settlement job
   * keeps the key) that did not complete left no answer at its node (it records completed answers
   * only), so the key no longer sends a retry back to that provider alone (s30 review: after a
   * buyer left, every retry was refused once the provider had gone).
   */
  private keyFreed(id: string, r: VerifiedReceipt): void {
    const key = this.d.records.job(id)?.idem_key;
    if (key !== undefined && r.payload.request_id === id && r.payload.status !== 'completed') this.d.forgetIdempotent?.(key, id);
  }

  /** POST /v1/receipts, retried briefly while the market is unreachable; then the record. */
  async settle(id: string, r: VerifiedReceipt, askedAs?: string): Promise<void> {
    const { market, records, log } = this.d;
    // (Every verified receipt comes here, whichever path found it: the relay's trailer, the node's
    // log after an early end, the reconciler. A retry answered with the first request's receipt is
    // not that request's own attempt.)
    if (askedAs === undefined || askedAs === id) this.keyFreed(id, r);
    // An idempotent retry relayed the first request's answer whole, with its receipt: whatever the
    // first attempt's break-off left (the mark, or a receipt withheld), the buyer has the answer
    // now and the provider is paid for it, once (s23 h5: it was withheld for good).
    if (askedAs !== undefined && askedAs !== id) records.markDelivered(id);
    else {
      const why = records.notDelivered(id, r.payload);
      if (why !== undefined) {
        records.withhold(id, r, why);
        log.warn({ request_id: id, status: r.payload.status, cost_micro_usd: r.payload.cost_micro_usd, why }, 'a receipt for an answer the buyer did not receive as it bills: recorded, not settled');
        return;
      }
    }
    if (askedAs !== undefined && askedAs !== id) {
      // An idempotent retry answered with the first request's receipt. If the first settlement is
      // still under way (a slow market), wait for it rather than post the same receipt twice;
      // once the first is settled, the retry only points at it (the first record left as it was).
      const first = this.settling.get(id);
      if (first) await first;
      if (records.get(id)?.settled) {
        records.alias(askedAs, id);
        records.dropJob(askedAs); // (nothing of its own to settle: its hold goes now, as on the path below)
        return;
      }
    }
    let outcome: { ok: true } | { ok: false; code: string; message: string } = { ok: false, code: 'market_unreachable', message: 'not tried' };
    let final = false; // the market answered: taken, or refused for good (another try changes nothing)
    for (let attempt = 0; attempt < SETTLE_ATTEMPTS; attempt++) {
      if (this.stopper.signal.aborted) {
        outcome = { ok: false, code: 'settlement_interrupted', message: `the gateway stopped before the marketplace acknowledged the receipt${attempt > 0 ? ` (${outcome.message})` : ''}` };
        break;
      }
      try {
        const ack = await market.postReceipt(r.line, this.stopper.signal); // stop() ends a POST under way
        // Settled means the market booked this receipt as signed: an acknowledgement for another
        // request or another cost is not that (and is said, not recorded as settled).
        const other = ack.request_id !== undefined && ack.request_id !== r.payload.request_id ? `request ${ack.request_id.slice(0, 100)}` : ack.cost_micro_usd !== undefined && ack.cost_micro_usd !== r.payload.cost_micro_usd ? `a cost of ${ack.cost_micro_usd.slice(0, 40)} micro-USD` : undefined;
        outcome = !ack.ok
          ? { ok: false, code: 'settlement_refused', message: 'the marketplace did not accept the receipt' }
          : other !== undefined
            ? { ok: false, code: 'settlement_mismatch', message: `the marketplace acknowledged ${other}, not this receipt's (${r.payload.request_id}, ${r.payload.cost_micro_usd} micro-USD)` }
            : { ok: true };
        final = true;
        break;
      } catch (e) {
        const g = e instanceof GatewayError ? e : new GatewayError(502, 'market_unreachable', String(e));
        outcome = { ok: false, code: g.code, message: g.message };
        // The market refused it: retrying will not change that. Not a 408 or 429 (a timeout, a rate
        // limit: wait and try again), which the reconciler posts again later.
        if (g.status < 500 && g.status !== 408 && g.status !== 429) {
          final = true;
          break;
        }
        if (attempt < SETTLE_ATTEMPTS - 1) await this.pause(200 * (attempt + 1)); // cut short by stop(): see the top of the loop
      }
    }
    if (!outcome.ok) log.warn({ request_id: id, code: outcome.code, message: outcome.message }, 'receipt not settled with the marketplace');
    if (!records.get(id)) records.begin({ request_id: id, endpoint: r.payload.endpoint, model: r.payload.model, provider: r.payload.provider });
    records.settle(id, r, outcome);
    // Settled (or refused for good): nothing left for the reconciler. Otherwise it posts it again later.
    if (final) records.dropJob(id);
    if (askedAs !== undefined && askedAs !== id) {
      records.alias(askedAs, id);
      records.dropJob(askedAs);
    }
  }

  /** Settles a verified receipt in the background: the buyer's answer never waits for the market. */
  settleLater(id: string, r: VerifiedReceipt, askedAs?: string): void {
    void this.track(id, this.settle(id, r, askedAs));
  }

  /**
   * Records a receipt that did not check out, wherever it was found (a TRAILER, the node's log):
   * the provider's fault (bad_provider_response), unless only its rates differ from what the market
   * stated and the provider's signed price list has the receipt's rates: then the market misstated
   * them (bad_market_response, the record `failed`). Nothing is settled either way.
   */
  async failBadReceipt(requestId: string, at: Pick<Paid, 'provider' | 'target'>, checked: { message: string; disputedRates?: DisputedRates }): Promise<{ code: string; message: string }> {
    let failure = { code: 'bad_provider_response', message: checked.message };
    const d = checked.disputedRates;
    if (d && (await providerListBacksReceipt(this.d.host, at, d))) {
      failure = { code: 'bad_market_response', message: `the marketplace stated price version ${d.version}'s rates for ${d.model.slice(0, 256)} as ${JSON.stringify(d.market).slice(0, 200)}, but the provider's signed price list has ${JSON.stringify(d.receipt).slice(0, 200)}, as its receipt bills` };
    }
    this.d.records.fail(requestId, failure.code === 'bad_market_response' ? 'failed' : 'bad_provider_response', failure);
    return failure;
  }

  /** The request ended without a trailer: find its receipt at the node, settle it, record it. */
  settleFromNode(p: Paid, why: EarlyEnd, opts: { undelivered?: boolean; receivedSha256?: string } = {}): Promise<void> {
    const { records, log } = this.d;
    // A whole body that broke off: the buyer got none of it, so its receipt is never settled,
    // whichever look finds it (this one, or the reconciler's after a restart). A stream that broke
    // off: settled only for exactly the bytes received. Neither when the break is the gateway's
    // own stop: the node did the work it was asked, and is paid for it.
    if (!this.stopping) {
      if (opts.undelivered) records.markUndelivered(p.requestId);
      if (opts.receivedSha256 !== undefined) records.markReceived(p.requestId, opts.receivedSha256);
    }
    return this.track(
      p.requestId,
      (async () => {
        const c = await this.fetchReceipt(p);
        if (c === 'stopped') return; // the record stays in_progress: see stop()
        if (c === undefined || c === 'unreached') {
          // The job stays: the reconciler asks again (three looks for a node that answers "no
          // receipt"). A node writes one as soon as a run stops, but its write may take longer
          // than the window on a busy node or a slow disk, and a receipt never asked for again
          // would never be settled.
          // (Not over a record that holds a receipt already: an idempotent retry's, settled or
          // withheld meanwhile.)
          if (!records.get(p.requestId)?.receipt) records.fail(p.requestId, why === 'failed' ? 'failed' : 'abandoned', NO_RECEIPT[why]);
        } else if (!c.ok) {
          await this.failBadReceipt(p.requestId, p, c);
        } else {
          await this.settle(p.requestId, c);
        }
        log.info({ request_id: p.requestId, status: records.get(p.requestId)?.status }, 'request ended early');
      })(),
    );
  }

  /**
   * An attempt that ended before its request left the gateway (the buyer gone, or the hedge's other
   * half answered, while it was still dialling): its node never saw the ticket, so no receipt can
   * exist, and its hold (the API key's spend limit) goes at once instead of after the reconciler's
   * looks at the node.
   */
  nothingSent(p: Paid, why: EarlyEnd): void {
    this.d.records.fail(p.requestId, why === 'failed' ? 'failed' : 'abandoned', NO_RECEIPT[why]);
    this.d.records.dropJob(p.requestId);
    this.releaseTicket(p);
  }

  /**
   * Tells the market that `p`'s ticket never reached its provider (never sent, or the provider
   * could not be reached), so its hold stops counting as outstanding now, not at its expiry: after
   * a node's crash, tickets for it would otherwise fill the market's budget for a minute (s23 h1).
   * In the background; a market that does not take it changes nothing (the ticket expires).
   */
  releaseTicket(p: Paid): void {
    if (this.stopper.signal.aborted) return;
    // (Not logged when refused: a marketplace without the route answers 404 each time, and the ticket expires anyway.)
    this.d.market.releaseTicket(p.exp.ticketId).catch(() => undefined);
  }

  /**
   * Keeps what it takes to settle `p` later (records' unsettled jobs): the reconciler looks at it
   * once the request has ended and settles a receipt that the request's own path could not.
   */
  watch(p: Paid, firstLookMs: number): void {
    const now = Date.now();
    this.d.records.watch({ request_id: p.requestId, provider: p.provider, target: p.target.map(String), exp: p.exp, created_at: now, next_at: now + firstLookMs, tries: 0, ...(p.idemKey !== undefined ? { idem_key: p.idemKey } : {}) });
  }

  /**
   * The receipt of a request whose stream ended early (the buyer left, or the connection broke),
   * from the node's log, retried until it is there or `fetchMs` has passed (one try when 0).
   */
  async fetchReceipt(p: Pick<Paid, 'requestId' | 'target' | 'exp'>, fetchMs = this.d.receiptFetchMs): Promise<CheckedReceipt | undefined | 'unreached' | 'stopped'> {
    const deadline = Date.now() + fetchMs;
    let last: CheckedReceipt | undefined;
    let unreached: string | undefined; // why the last try could not ask the node, if it could not
    for (let wait = 50; ; wait = Math.min(wait * 2, 400)) {
      if (this.stopper.signal.aborted) return 'stopped';
      try {
        const signal = AbortSignal.any([this.stopper.signal, AbortSignal.timeout(Math.max(1000, Math.min(3000, deadline - Date.now())))]);
        const r = await readResponse(await p2pRequest(this.d.host, p.target, LOG_PROTOCOL, { op: 'receipt', request_id: p.requestId }, undefined, { signal }));
        // 404: the node answers and has no receipt for it (yet); anything else but 200: it could
        // not answer (restarting, overloaded), as good as not reached.
        if (r.head.status !== 200 && r.head.status !== 404) throw new Error(`the node's log answered ${String(r.head.status)}`);
        if (r.head.status === 200) {
          const v = JSON.parse(Buffer.from(r.body).toString('utf8')) as { receipts?: unknown };
          for (const line of Array.isArray(v.receipts) ? v.receipts : []) {
            const c = checkReceipt(line, p.exp);
            if (c.ok) return c;
            last = c;
          }
          if (last) return last;
        }
        unreached = undefined;
      } catch (e) {
        if (this.stopper.signal.aborted) return 'stopped';
        unreached = (e as Error).message;
      }
      if (Date.now() + wait > deadline) {
        // One line a request, and only when the node could not be asked (a node that answers
        // "no receipt" is the usual case of a buyer who left before any work).
        if (unreached === undefined) return undefined;
        if (fetchMs > 0) this.d.log.warn({ request_id: p.requestId, err: unreached }, "the provider's log could not be asked for the receipt; the gateway looks again later");
        return 'unreached';
      }
      if (!(await this.pause(wait))) return 'stopped';
    }
  }
}
