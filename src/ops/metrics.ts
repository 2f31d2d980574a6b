// Prometheus metrics for the seller node, on a registry of its own (never prom-client's global one),
// so tests and embedders can create several without name clashes.
//
// Names and labels (keep label values low-cardinality: ids of models and endpoints, codes; never
// request ids, buyer ids or text):
//   seller_requests_total{endpoint,status}          counter  one per finished request; endpoint like
//                                                    "chat/completions" ("invalid": none of this node's, or a
//                                                    request refused before it could be read), status an
//                                                    HTTP-style code ("200")
//   seller_tokens_total{direction,model}            counter  direction "in" (prompt) or "out" (generated)
//   seller_receipts_signed_total{status}            counter
//   seller_earnings_micro_usd_total{model}          counter  exact, see EarningsCounter
//   seller_queue_depth{model}                       gauge    requests waiting for a slot
//   seller_slots_in_use{model}                      gauge    slots generating right now
//   seller_request_duration_seconds{endpoint,model} histogram  admission to last byte
//   seller_time_to_first_token_seconds{model}       histogram  admission to first token (includes queueing)
//   seller_ticket_refusals_total{reason}            counter  reason a short code, e.g. "expired"
//   seller_receipt_log_stopped                      gauge    1 once the receipt log has stopped (a failed
//                                                    write, its files deleted or changed under it: paid
//                                                    work is refused until a restart), else 0
//   seller_p2p_connections_refused_total{reason}    counter  inbound libp2p sockets the node's own limits refused
//                                                    before any handshake; reason "address_cap" (over
//                                                    p2p.max_connections_per_ip). libp2p's own limits
//                                                    (pending handshakes, per-address rate, maxConnections,
//                                                    handshake timeout) are not seen (src/p2p/host.ts)
//   seller_p2p_connections_closed_idle_total        counter  libp2p connections closed for having had no stream
//                                                    for p2p.idle_connection_ms
// plus prom-client's default process_* and nodejs_* metrics.
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { ConnectionRefusal } from '../p2p/host.ts';

/** Request latency buckets (seconds): short embeddings up to ten-minute generations. */
export const REQUEST_DURATION_BUCKETS: readonly number[] = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600];
/** Time-to-first-token buckets (seconds): prefill of a short prompt up to a long queue wait. */
export const TTFT_BUCKETS: readonly number[] = [0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60];

/**
 * Largest earnings total the counter holds exactly: 2^53 − 1 micro-USD (about 9 billion USD).
 * Prometheus and prom-client keep counter values as float64, which represents every integer up to
 * 2^53 exactly and sums of such integers exactly as long as the sum stays within that bound.
 */
export const MAX_EXACT_MICRO_USD: bigint = BigInt(Number.MAX_SAFE_INTEGER);

/**
 * seller_earnings_micro_usd_total{model}. Takes bigint micro-USD (the unit of receipts'
 * `cost_micro_usd`) and keeps an exact bigint total per model beside the float counter; every value
 * the counter shows is that exact total, because it is refused before it could exceed
 * MAX_EXACT_MICRO_USD. The receipt log, not this counter, is the record of what was earned.
 */
export interface EarningsCounter {
  /**
   * Add `microUsd` to `model`'s total. Throws TypeError unless `microUsd` is a bigint, RangeError if
   * it is negative or if the total would exceed MAX_EXACT_MICRO_USD; a refused call changes nothing.
   * 0n is allowed (it makes the series appear).
   */
  add(model: string, microUsd: bigint): void;
  /** The exact total added for `model` (0n if none). */
  total(model: string): bigint;
}

export interface Metrics {
  /** The registry to expose (text via `registry.metrics()`, content type `registry.contentType`). */
  readonly registry: Registry;
  /** seller_requests_total{endpoint,status} */
  readonly requests: Counter<'endpoint' | 'status'>;
  /** seller_tokens_total{direction,model}; direction is "in" or "out". */
  readonly tokens: Counter<'direction' | 'model'>;
  /** seller_receipts_signed_total */
  readonly receiptsSigned: Counter<'status'>;
  /** seller_earnings_micro_usd_total{model} */
  readonly earnings: EarningsCounter;
  /** seller_queue_depth{model} */
  readonly queueDepth: Gauge<'model'>;
  /** seller_slots_in_use{model} */
  readonly slotsInUse: Gauge<'model'>;
  /** seller_request_duration_seconds{endpoint,model} */
  readonly requestDuration: Histogram<'endpoint' | 'model'>;
  /** seller_time_to_first_token_seconds{model} */
  readonly timeToFirstToken: Histogram<'model'>;
  /** seller_ticket_refusals_total{reason} */
  readonly ticketRefusals: Counter<'reason'>;
  /** seller_receipt_log_stopped (read at each scrape from MetricsOptions.receiptLogStopped) */
  readonly receiptLogStopped: Gauge;
  /** seller_p2p_connections_refused_total{reason}; every reason in P2P_REFUSAL_REASONS is shown from 0. */
  readonly p2pConnectionsRefused: Counter<'reason'>;
  /** seller_p2p_connections_closed_idle_total */
  readonly p2pConnectionsClosedIdle: Counter;
}

/** The reasons seller_p2p_connections_refused_total has a series for from the start (at 0, so that an alert on its increase sees the first): every one the host tells. */
const P2P_REFUSALS: Record<ConnectionRefusal, true> = { address_cap: true };
export const P2P_REFUSAL_REASONS = Object.keys(P2P_REFUSALS) as ConnectionRefusal[];

export interface MetricsOptions {
  /** Collect prom-client's default process and Node.js metrics on this registry (default true). */
  defaultMetrics?: boolean;
  /** Live slots and queue per model, read at every scrape into seller_slots_in_use and seller_queue_depth. */
  admission?: () => Iterable<{ model: string; inUse: number; queued: number }>;
  /** Whether the receipt log has stopped, read at every scrape into seller_receipt_log_stopped. */
  receiptLogStopped?: () => boolean;
}

export function createMetrics(options: MetricsOptions = {}): Metrics {
  const registry = new Registry();
  const registers = [registry];

  const requests = new Counter({
    name: 'seller_requests_total',
    help: 'Inference requests finished, by endpoint and status code.',
    labelNames: ['endpoint', 'status'] as const,
    registers,
  });
  const tokens = new Counter({
    name: 'seller_tokens_total',
    help: 'Tokens processed, by direction (in = prompt, out = generated) and model.',
    labelNames: ['direction', 'model'] as const,
    registers,
  });
  const receiptsSigned = new Counter({
    name: 'seller_receipts_signed_total',
    help: 'Receipts signed, by receipt status (completed, cancelled, failed).',
    labelNames: ['status'] as const,
    registers,
  });
  // The exact bigint totals are the source of truth; at every scrape the float counter is rebuilt
  // from them. Number(total) is exact because a total never exceeds 2^53 − 1.
  const totals = new Map<string, bigint>();
  new Counter({
    name: 'seller_earnings_micro_usd_total',
    help: 'Earnings in micro-USD by model (exact up to 2^53 - 1).',
    labelNames: ['model'] as const,
    registers,
    collect() {
      this.reset();
      for (const [model, total] of totals) this.inc({ model }, Number(total));
    },
  });
  const live = options.admission;
  const queueDepth = new Gauge({
    name: 'seller_queue_depth',
    help: 'Requests waiting for a slot, by model.',
    labelNames: ['model'] as const,
    registers,
    ...(live && {
      collect() {
        for (const a of live()) this.set({ model: a.model }, a.queued);
      },
    }),
  });
  const slotsInUse = new Gauge({
    name: 'seller_slots_in_use',
    help: 'Slots busy generating, by model.',
    labelNames: ['model'] as const,
    registers,
    ...(live && {
      collect() {
        for (const a of live()) this.set({ model: a.model }, a.inUse);
      },
    }),
  });
  const requestDuration = new Histogram({
    name: 'seller_request_duration_seconds',
    help: 'Request latency from admission to the last byte, in seconds.',
    labelNames: ['endpoint', 'model'] as const,
    buckets: [...REQUEST_DURATION_BUCKETS],
    registers,
  });
  const timeToFirstToken = new Histogram({
    name: 'seller_time_to_first_token_seconds',
    help: 'Time from admission to the first generated token (queueing included), in seconds.',
    labelNames: ['model'] as const,
    buckets: [...TTFT_BUCKETS],
    registers,
  });
  const ticketRefusals = new Counter({
    name: 'seller_ticket_refusals_total',
    help: 'Payment tickets refused, by reason.',
    labelNames: ['reason'] as const,
    registers,
  });

  const logStopped = options.receiptLogStopped;
  const receiptLogStopped = new Gauge({
    name: 'seller_receipt_log_stopped',
    help: 'Whether the receipt log has stopped (1: paid work is refused until the node is restarted; the error log says why), else 0.',
    registers,
    ...(logStopped && {
      collect() {
        this.set(logStopped() ? 1 : 0);
      },
    }),
  });

  const p2pConnectionsRefused = new Counter({
    name: 'seller_p2p_connections_refused_total',
    help: 'Inbound libp2p connections refused by the node before any handshake, by reason (address_cap: over p2p.max_connections_per_ip).',
    labelNames: ['reason'] as const,
    registers,
  });
  for (const reason of P2P_REFUSAL_REASONS) p2pConnectionsRefused.inc({ reason }, 0);
  const p2pConnectionsClosedIdle = new Counter({
    name: 'seller_p2p_connections_closed_idle_total',
    help: 'libp2p connections closed for having had no stream for p2p.idle_connection_ms.',
    registers,
  });

  if (options.defaultMetrics !== false) collectDefaultMetrics({ register: registry });

  const earnings: EarningsCounter = {
    add(model: string, microUsd: bigint): void {
      if (typeof microUsd !== 'bigint') throw new TypeError(`earnings: expected a bigint amount of micro-USD, got ${typeof microUsd}`);
      if (typeof model !== 'string') throw new TypeError('earnings: expected a model id string');
      if (microUsd < 0n) throw new RangeError(`earnings: refusing a negative amount (${microUsd} micro-USD)`);
      const next = (totals.get(model) ?? 0n) + microUsd;
      if (next > MAX_EXACT_MICRO_USD) {
        throw new RangeError(`earnings: total for model "${model}" would be ${next} micro-USD, above 2^53 - 1 where the counter stops being exact`);
      }
      totals.set(model, next);
    },
    total(model: string): bigint {
      return totals.get(model) ?? 0n;
    },
  };

  return { registry, requests, tokens, receiptsSigned, earnings, queueDepth, slotsInUse, requestDuration, timeToFirstToken, ticketRefusals, receiptLogStopped, p2pConnectionsRefused, p2pConnectionsClosedIdle };
}
