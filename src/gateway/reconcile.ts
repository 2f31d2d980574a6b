// Settling what a request's own path could not: a receipt the node made durable but never sent
// (it crashed between the fsync and the trailer, and came back after the gateway stopped asking),
// a request the gateway itself was stopped in (`interrupted`), a receipt the marketplace could not
// take at the time (unreachable). Every paid attempt is watched from its start (records'
// unsettled jobs, kept in the records file when there is one); once it has ended, the reconciler
// looks at it, and keeps looking, further apart each time, until its receipt is settled, it is
// known to have none (refused before any work), or it is given up (about a day).
import { multiaddr, type Multiaddr } from '@multiformats/multiaddr';
import { serializeEnvelope } from '../../attestation/dsse.ts';
import { dialTarget } from './dial-target.ts';
import type { GatewayLogger } from './gateway-logger.ts';
import type { MarketClient } from './market-client.ts';
import { checkReceipt } from './receipt-check.ts';
import type { RequestRecord, RequestRecords, UnsettledJob } from './records.ts';
import type { Settlements } from './settlement.ts';

/** Looks after the first, in units: 1, 2, 4, 10, 20, 60, 120, 240, 480, 960, 1440 (3,337 units: about 28 h of 30 s units). */
const BACKOFF = [1, 2, 4, 10, 20, 60, 120, 240, 480, 960, 1440];

/** Settlement errors that another try cannot change: the marketplace refused the receipt itself. */
const FINAL_SETTLEMENT = new Set(['settlement_refused', 'settlement_mismatch']);

/** Jobs that ask a node or the market at once. */
const CONCURRENCY = 8;

export interface ReconcilerOptions {
  records: RequestRecords;
  settlements: Settlements;
  market: MarketClient;
  log: GatewayLogger;
  /** The unit of the back-off, and the first look after a request starts. Default 30 s. */
  unitMs?: number;
  /** How many jobs that need a node or the market are looked at in one turn. Default 64. */
  batch?: number;
}

export class Reconciler {
  private readonly o: ReconcilerOptions;
  private readonly unit: number;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;

  constructor(o: ReconcilerOptions) {
    this.o = o;
    this.unit = o.unitMs ?? 30_000;
  }

  /** The first look at a request, this long after it starts. */
  get firstLookMs(): number {
    return this.unit;
  }

  start(): void {
    const every = Math.max(10, Math.min(5_000, Math.floor(this.unit / 3)));
    const turn = () => {
      if (!this.running && !this.stopped) this.running = this.turn().finally(() => (this.running = undefined));
    };
    this.timer = setInterval(turn, every);
    this.timer.unref();
    // The first turn at once: requests the last run left unsettled (a gateway killed after its
    // buyer had the answer) read `interrupted` until it, for up to `every` (s23 h1).
    setImmediate(turn).unref();
  }

  /** Ends the looks: no new turn, no new job in the running one. Its looks under way end with the settlements' stop (see the gateway's close). */
  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
  }

  /** The turn under way, if any, once it has ended. */
  async idle(): Promise<void> {
    await this.running;
  }

  /**
   * One turn: every due job looked at. Most need no I/O (settled, refused, still running) and are
   * done at once; those that ask a node or the market run `concurrency` at a time, at most
   * `batch` a turn (the rest are due at the next turn).
   */
  async turn(): Promise<void> {
    const { records, log } = this.o;
    const now = Date.now();
    const io: { job: UnsettledJob; rec: RequestRecord }[] = [];
    for (const job of records.dueJobs(now)) {
      const rec = records.get(job.request_id);
      if (!rec) {
        log.warn({ request_id: job.request_id }, 'a request to settle has no record any more (evicted from memory, or past the records file\'s retention): given up');
        records.dropJob(job.request_id);
      } else if (rec.settled || rec.status === 'refused' || rec.status === 'bad_provider_response') records.dropJob(job.request_id);
      else if (rec.status === 'in_progress') records.watch({ ...job, next_at: now + this.unit });
      else if (rec.receipt && rec.settlement_error && FINAL_SETTLEMENT.has(rec.settlement_error.code)) records.dropJob(job.request_id);
      else if (io.length < (this.o.batch ?? 64)) io.push({ job, rec });
    }
    const workers = Array.from({ length: Math.min(CONCURRENCY, io.length) }, async () => {
      for (let next = io.shift(); next && !this.stopped; next = io.shift()) {
        const { job, rec } = next;
        try {
          await this.look(job, rec);
        } catch (e) {
          log.warn({ request_id: job.request_id, err: (e as Error).message }, 'reconciling a request failed; it is looked at again later');
          this.later(job);
        }
      }
    });
    await Promise.all(workers);
  }

  /** A job that needs the node's log or the market (`rec`: its record, as the turn read it). */
  private async look(job: UnsettledJob, rec: RequestRecord): Promise<void> {
    const { records, settlements, log } = this.o;
    if (rec.receipt) {
      // Verified before; checked again against the ticket (the record is the gateway's own file).
      const c = checkReceipt(serializeEnvelope(rec.receipt), job.exp);
      if (!c.ok) return records.dropJob(job.request_id);
      await settlements.track(job.request_id, settlements.settle(job.request_id, c));
    } else {
      const found = await this.fetch(job);
      if (found === 'stopped') return;
      if (found === 'unreached') return this.later(job);
      if (found === undefined) {
        // The node answers and has no receipt: after a few looks, it never will.
        return job.tries >= 2 ? records.dropJob(job.request_id) : this.later(job);
      }
      if (!found.ok) {
        await settlements.failBadReceipt(job.request_id, { provider: job.provider, target: job.target.map((a) => multiaddr(a)) }, found); // (ends its job)
        return;
      }
      log.info({ request_id: job.request_id, status: found.payload.status, cost_micro_usd: found.payload.cost_micro_usd }, "a receipt found in the provider's log after the request ended");
      await settlements.track(job.request_id, settlements.settle(job.request_id, found));
    }
    // settle() drops the job when the market took the receipt (or refused it for good).
    if (!this.stopped && records.hasJob(job.request_id)) this.later(job);
  }

  /** The receipt from the node's log: at the addresses the ticket gave, else at the ones the market lists now. */
  private async fetch(job: UnsettledJob) {
    const { settlements, market } = this.o;
    const ask = (target: Multiaddr[]) => settlements.fetchReceipt({ requestId: job.request_id, target, exp: job.exp }, 0);
    const first = await ask(job.target.map((a) => multiaddr(a)));
    if (first !== 'unreached') return first;
    // A node restarted elsewhere (another port, another host) lists its new addresses.
    try {
      const listed = (await market.providers()).find((p) => p.provider === job.provider);
      if (!listed) return first;
      const fresh = dialTarget(listed.provider, listed.peer_id, listed.addresses);
      if (fresh.map(String).join() === job.target.join()) return first;
      return await ask(fresh);
    } catch {
      return first;
    }
  }

  /** Looks again later, or gives up after the last back-off step. */
  private later(job: UnsettledJob): void {
    const { records, log } = this.o;
    const step = BACKOFF[job.tries];
    if (step === undefined) {
      log.warn({ request_id: job.request_id, provider: job.provider }, 'request given up: no receipt could be settled for it');
      return records.dropJob(job.request_id);
    }
    records.watch({ ...job, tries: job.tries + 1, next_at: Date.now() + step * this.unit });
  }
}
