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
import type { RequestRecords, UnsettledJob } from './records.ts';
import type { Settlements } from './settlement.ts';

/** Looks after the first, in units: 1, 2, 4, 10, 20, 60, 120, 240, 480, 960, 1440 (~18 h of 30 s units). */
const BACKOFF = [1, 2, 4, 10, 20, 60, 120, 240, 480, 960, 1440];

/** Settlement errors that another try cannot change: the marketplace refused the receipt itself. */
const FINAL_SETTLEMENT = new Set(['settlement_refused']);

export interface ReconcilerOptions {
  records: RequestRecords;
  settlements: Settlements;
  market: MarketClient;
  log: GatewayLogger;
  /** The unit of the back-off, and the first look after a request starts. Default 30 s. */
  unitMs?: number;
  /** How many jobs are looked at in one turn. Default 16. */
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
    this.timer = setInterval(() => {
      if (!this.running) this.running = this.turn().finally(() => (this.running = undefined));
    }, every);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.running;
  }

  /** One turn: every due job (up to a batch) looked at. */
  async turn(): Promise<void> {
    const due = this.o.records.dueJobs(Date.now(), this.o.batch ?? 16);
    for (const job of due) {
      if (this.stopped) return;
      try {
        await this.look(job);
      } catch (e) {
        this.o.log.warn({ request_id: job.request_id, err: (e as Error).message }, 'reconciling a request failed; it is looked at again later');
        this.later(job);
      }
    }
  }

  private async look(job: UnsettledJob): Promise<void> {
    const { records, settlements, log } = this.o;
    const rec = records.get(job.request_id);
    if (!rec || rec.settled || rec.status === 'refused' || rec.status === 'bad_provider_response') return records.dropJob(job.request_id);
    if (rec.status === 'in_progress') return records.watch({ ...job, next_at: Date.now() + this.unit });
    if (rec.receipt) {
      if (rec.settlement_error && FINAL_SETTLEMENT.has(rec.settlement_error.code)) return records.dropJob(job.request_id);
      // Verified before; checked again against the ticket (the record is the gateway's own file).
      const c = checkReceipt(serializeEnvelope(rec.receipt), job.exp);
      if (!c.ok) return records.dropJob(job.request_id);
      await settlements.track(job.request_id, settlements.settle(job.request_id, c));
    } else {
      const found = await this.fetch(job);
      if (found === 'stopped') return;
      if (found === undefined) return this.later(job);
      if (!found.ok) {
        records.fail(job.request_id, 'bad_provider_response', { code: 'bad_provider_response', message: found.message });
        return records.dropJob(job.request_id);
      }
      log.info({ request_id: job.request_id, status: found.payload.status, cost_micro_usd: found.payload.cost_micro_usd }, "a receipt found in the provider's log after the request ended; settling it");
      await settlements.track(job.request_id, settlements.settle(job.request_id, found));
    }
    if (records.get(job.request_id)?.settled) records.dropJob(job.request_id);
    else this.later(job);
  }

  /** The receipt from the node's log: at the addresses the ticket gave, else at the ones the market lists now. */
  private async fetch(job: UnsettledJob) {
    const { settlements, market } = this.o;
    const ask = (target: Multiaddr[]) => settlements.fetchReceipt({ requestId: job.request_id, target, exp: job.exp }, 0);
    const first = await ask(job.target.map((a) => multiaddr(a)));
    if (first !== undefined) return first;
    // A node restarted elsewhere (another port, another host) lists its new addresses.
    try {
      const listed = (await market.providers()).find((p) => p.provider === job.provider);
      if (!listed) return undefined;
      const fresh = dialTarget(listed.provider, listed.peer_id, listed.addresses);
      if (fresh.map(String).join() === job.target.join()) return undefined;
      return await ask(fresh);
    } catch {
      return undefined;
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
