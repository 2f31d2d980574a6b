// The node's side of the marketplace (docs/market-api.md §Providers): register on start, then send
// the signed capacity snapshot as a heartbeat at once and every interval. While the market is unreachable the
// node keeps serving (tickets it already holds stay good) and keeps trying: registration with
// backoff, heartbeats at their interval (a 5xx, 408 or 429 counts as unreachable). A heartbeat the
// market answers with any other refusal (404 unknown_provider: it restarted or forgot us; 409
// heartbeat_stale: our clock stepped back; 400, 401, …) means it no longer counts the node as live:
// the node is not registered until it registers again, which it does at once (a refused
// registration then backs off). Nothing here ever throws into the node.
import { BodyTooLargeError, readBoundedText } from './bounded-body.ts';
import { fetchFailure } from './fetch-failure.ts';
import { normalizeMarketUrl } from './market-url.ts';
import type { DsseEnvelope } from '../attestation/dsse.ts';
import type { AttestationTier } from '../attestation/receipt.ts';
import { signRegistration, type RegisteredModel, type RegistrationPayload } from './market/registration-payload.ts';
import type { Logger } from './ops/logger.ts';
import { STATE_FAILURE_HOLD_MS, StoreStopped } from './store/store-health.ts';


export const DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000;
/** The longest heartbeat interval a market may ask for (a timer beyond 2^31 - 1 ms fires at once). */
const MAX_HEARTBEAT_INTERVAL_MS = 600_000;
/** The shortest heartbeat interval a market may ask for: a signed snapshot per interval costs CPU inference needs. */
const MIN_HEARTBEAT_INTERVAL_MS = 1000;
/** The most the node reads of a market's answer (the API's are a few hundred bytes). */
const MAX_ANSWER_BYTES = 64 * 1024;

export interface RegistrationOptions {
  /** The marketplace's base URL, e.g. http://127.0.0.1:11436 (the /v1/… paths are added). */
  marketUrl: string;
  /** The node's Ed25519 seed: it signs the registration. */
  seed: Uint8Array;
  providerId: string;
  peerId: string;
  /** The multiaddrs buyers dial (read at every registration when a function). */
  addresses: string[] | (() => string[]);
  /** The node's signed price list and its version. */
  priceList: { envelope: DsseEnvelope; version: string };
  models: RegisteredModel[];
  /** The node's signed request contracts (attestation/request-contract.ts), covering its models. */
  requestContracts?: DsseEnvelope[];
  tier: AttestationTier;
  /** The node's capacity snapshot signed with time `at` (signCapacity), sent as the heartbeat body. */
  capacity: (at: number) => DsseEnvelope;
  /** Heartbeat interval; default: what the market answers at registration (else 5000 ms). */
  intervalMs?: number;
  /** The shortest interval the market may ask for (default 1000 ms; tests of the protocol go faster). */
  minIntervalMs?: number;
  logger?: Logger;
  /** Registration retry backoff: starts at initialMs (default 500), doubles up to maxMs (default 10000). */
  backoff?: { initialMs?: number; maxMs?: number };
  /**
   * The marketplace keys the node trusts for tickets (hex). After each registration the node reads
   * the market's own key (GET /v1/market): one not among these is reported (status, /readyz, an
   * error log line), since every ticket that market issues would be refused.
   */
  trustedKeys?: readonly string[];
  /** Per-request timeout (default 5000 ms). */
  requestTimeoutMs?: number;
  /** The clock for issued_at and the status times (default Date.now; tests step it back). */
  now?: () => number;
}

/** What /status shows of the node's standing with the marketplace (times in ms since the epoch). */
export interface MarketplaceStatus {
  url: string;
  registered: boolean;
  /** When the market last accepted a registration. */
  registered_at: number | null;
  /** When the market last accepted a heartbeat. */
  last_heartbeat_at: number | null;
  /** The latest failure since the last success (registration or heartbeat), else null. */
  last_error: { at: number; during: 'registration' | 'heartbeat'; status?: number; code?: string; reason: string } | null;
  /** The key the market signs tickets with, as it said at the last registration, and whether this node trusts it; null until known. */
  ticket_key: { public_key: string; trusted: boolean } | null;
}

export interface Registration {
  /** Whether the market accepted the latest registration and has not refused a heartbeat since. */
  readonly registered: boolean;
  /** The node's standing with the market, for /status and /readyz. */
  status(): MarketplaceStatus;
  /**
   * Sends one heartbeat now (the snapshot as it is: `accepting: false` once the node is stopping),
   * when registered; best effort, never longer than `timeoutMs`. So the market stops sending
   * buyers at once rather than at the next interval.
   */
  announce(timeoutMs: number): Promise<void>;
  /** Stops heartbeating; resolves when no request is in flight any more. */
  stop(): Promise<void>;
}

type Outcome =
  | { kind: 'ok'; body: Record<string, unknown> }
  /** The market answered with an error. */
  | { kind: 'refused'; status: number; code: string; message: string }
  /** No answer: connection refused, timeout, a non-JSON reply. */
  | { kind: 'unreachable'; message: string };

/**
 * Whether a heartbeat refused with this status means the market no longer counts the node: any
 * 4xx but 408 and 429 (the market slow or shedding load, like a 5xx: keep serving, stay ready,
 * docs/decisions.md §Readiness). A persistent 400 heartbeat_invalid (clock drift) or 401 would
 * otherwise leave the node ready while the market stops listing it.
 */
function dropsRegistration(status: number): boolean {
  return status >= 400 && status < 500 && status !== 408 && status !== 429;
}

/** How the node says why it registers again after a heartbeat refusal (codes, never secrets). */
function refusalMessage(r: Extract<Outcome, { kind: 'refused' }>): string {
  if (r.status === 404 && r.code === 'unknown_provider') return 'the marketplace does not know this node; registering again';
  if (r.code === 'heartbeat_stale') return 'the marketplace took a heartbeat as stale (not newer than what it already took: has the clock stepped back?); registering again';
  return 'the marketplace refused a heartbeat; registering again';
}

export function startRegistration(o: RegistrationOptions): Registration {
  const base = normalizeMarketUrl(o.marketUrl);
  const log = o.logger;
  const initialBackoff = o.backoff?.initialMs ?? 500;
  const maxBackoff = Math.max(initialBackoff, o.backoff?.maxMs ?? 10_000);
  const timeoutMs = o.requestTimeoutMs ?? 5_000;
  const now = o.now ?? Date.now;
  const stopper = new AbortController();
  let registered = false;
  /** Set once the node has announced it stops (announce()): no more heartbeats or registrations. */
  let announced = false;
  let registeredAt: number | null = null;
  let lastHeartbeatAt: number | null = null;
  let lastError: MarketplaceStatus['last_error'] = null;
  /**
   * The time of everything the node signs for the market (a registration's issued_at, a
   * heartbeat's at): never earlier than the last, even if the clock stepped back. The market refuses
   * a registration older than the one in force (the same issued_at is a replay that changes nothing)
   * and answers a snapshot not newer than the last one, or older than the registration, 409
   * heartbeat_stale; a stepped-back clock would otherwise have the node re-register every interval
   * until the clock caught up, its heartbeats never counted (docs/market-api.md §Providers).
   */
  let lastStamp = -Infinity;
  const stamp = () => (lastStamp = Math.max(now(), lastStamp + 1));
  const failed = (during: 'registration' | 'heartbeat', r: Exclude<Outcome, { kind: 'ok' }>) => {
    lastError = { at: now(), during, ...(r.kind === 'refused' ? { status: r.status, code: r.code } : {}), reason: r.message.slice(0, 500) };
  };

  const sleep = (ms: number) =>
    new Promise<void>((resolve) => {
      if (stopper.signal.aborted) return resolve();
      const done = () => {
        clearTimeout(timer);
        stopper.signal.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      stopper.signal.addEventListener('abort', done);
    });

  let ticketKey: MarketplaceStatus['ticket_key'] = null;
  /** Reads the market's ticket key; best effort (an old or failing market leaves it unknown). */
  async function checkTicketKey(): Promise<void> {
    let key: unknown;
    try {
      const res = await fetch(base + '/v1/market', { redirect: 'manual', signal: AbortSignal.any([stopper.signal, AbortSignal.timeout(timeoutMs)]) });
      if (!res.ok) {
        await res.body?.cancel().catch(() => undefined);
        return;
      }
      key = (JSON.parse(await readBoundedText(res, MAX_ANSWER_BYTES)) as { public_key?: unknown } | null)?.public_key;
    } catch {
      return;
    }
    if (typeof key !== 'string' || !/^[0-9a-fA-F]{64}$/.test(key)) return;
    const k = key.toLowerCase();
    const trusted = (o.trustedKeys ?? []).some((t) => t.toLowerCase() === k);
    if (trusted && ticketKey !== null && !ticketKey.trusted) log?.info({ market: base, market_key: k }, 'the marketplace now signs tickets with a trusted key');
    if (!trusted && ticketKey?.public_key !== k) {
      log?.error({ market: base, market_key: k }, 'the marketplace signs tickets with a key that is not in marketplace.public_keys: every ticket it issues will be refused (add its key, or fix marketplace.url)');
    }
    ticketKey = { public_key: k, trusted };
  }

  /** `answered`: whether a 200's body is the API's answer (else the call failed: the market is not answering as itself). */
  async function post(path: string, body: unknown, answered: (body: Record<string, unknown>) => boolean): Promise<Outcome> {
    let res: Response;
    try {
      res = await fetch(base + path, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
        // Not followed: the signed registration goes to marketplace.url, not wherever it points (a 301 would even make it a GET).
        redirect: 'manual',
        signal: AbortSignal.any([stopper.signal, AbortSignal.timeout(timeoutMs)]),
      });
    } catch (e) {
      return { kind: 'unreachable', message: fetchFailure(e) };
    }
    if (res.status >= 300 && res.status < 400) {
      await res.body?.cancel().catch(() => undefined);
      return { kind: 'unreachable', message: `HTTP ${res.status}: a redirect (not followed: marketplace.url must be the market's own address)` };
    }
    let json: unknown;
    let readFailure: string | undefined;
    try {
      json = JSON.parse(await readBoundedText(res, MAX_ANSWER_BYTES));
    } catch (e) {
      readFailure = e instanceof BodyTooLargeError ? `an answer larger than ${e.maxBytes} bytes` : e instanceof SyntaxError ? 'a body that is not JSON' : `a body cut off (${fetchFailure(e)})`;
    }
    const obj = json !== null && typeof json === 'object' && !Array.isArray(json) ? (json as Record<string, unknown>) : {};
    if (res.ok) {
      if (readFailure !== undefined) return { kind: 'unreachable', message: `HTTP ${res.status} with ${readFailure}` };
      return answered(obj) ? { kind: 'ok', body: obj } : { kind: 'unreachable', message: `HTTP ${res.status} with an answer that is not the API's` };
    }
    // A 4xx without the API's error body (a proxy's HTML page) is still a refusal; a 5xx the market failing.
    const err = (obj.error ?? {}) as { code?: unknown; message?: unknown };
    const outcome = { kind: 'refused' as const, status: res.status, code: typeof err.code === 'string' ? err.code : `http_${res.status}`, message: typeof err.message === 'string' ? err.message : '' };
    // A 5xx is the market failing, not refusing us: treat it like no answer.
    if (res.status >= 500) return { kind: 'unreachable', message: readFailure !== undefined ? `HTTP ${res.status} with ${readFailure}` : `HTTP ${res.status} ${outcome.code}` };
    return outcome;
  }

  function registration(): DsseEnvelope {
    const payload: RegistrationPayload = {
      v: 1,
      provider: o.providerId,
      peer_id: o.peerId,
      // The market takes at most 32 (a host with many interfaces may list more).
      addresses: (typeof o.addresses === 'function' ? o.addresses() : o.addresses).slice(0, 32),
      price_version: o.priceList.version,
      price_list: o.priceList.envelope,
      models: o.models,
      ...(o.requestContracts?.length ? { request_contracts: o.requestContracts } : {}),
      attestation_tier: o.tier,
      issued_at: stamp(),
    };
    return signRegistration(o.seed, payload);
  }

  const loop = async () => {
    let backoff = initialBackoff;
    let interval = o.intervalMs ?? DEFAULT_HEARTBEAT_INTERVAL_MS;
    let attempts = 0;
    let heartbeatFailing = false;
    // Heartbeats refused since the last one accepted: the first refusal (and the registration
    // after it) is logged at its level, the same refusal again at debug.
    let refusals = 0;
    let refusedCode = '';
    while (!stopper.signal.aborted && !announced) {
      try {
        if (!registered) {
          attempts++;
          const r = await post('/v1/providers/register', registration(), (b) => b.registered === true);
          if (stopper.signal.aborted || announced) break;
          if (r.kind === 'ok') {
            registered = true;
            registeredAt = now();
            lastError = null;
            const told = r.body.heartbeat_interval_ms;
            interval = o.intervalMs ?? (typeof told === 'number' && Number.isSafeInteger(told) && told > 0 ? Math.max(o.minIntervalMs ?? MIN_HEARTBEAT_INTERVAL_MS, Math.min(told, MAX_HEARTBEAT_INTERVAL_MS)) : DEFAULT_HEARTBEAT_INTERVAL_MS);
            log?.[refusals > 1 ? 'debug' : 'info']({ market: base, attempts, heartbeat_interval_ms: interval }, 'registered with the marketplace');
            if (o.trustedKeys) await checkTicketKey();
            attempts = 0;
            backoff = initialBackoff;
            heartbeatFailing = false;
            // The first heartbeat at once, so the market learns the live snapshot (free slots,
            // accepting) now: until then it takes the node for accepting, every slot free (a node
            // that takes no tickets was ticketed for an interval after each market restart: s23
            // h4). Also after one refused heartbeat (the market restarted); after a second in a
            // row, an interval first: a market that takes registrations and refuses every
            // heartbeat must not get them in a tight loop.
            if (refusals > 1) await sleep(interval);
            continue;
          }
          failed('registration', r);
          // The first failure is a warning (a refusal, an error: the operator must act); retries are quiet.
          const fields = { market: base, attempts, retry_in_ms: backoff, ...(r.kind === 'refused' ? { status: r.status, code: r.code, reason: r.message } : { reason: r.message }) };
          // (408 and 429 are not refusals: the market is busy, as when it does not answer.)
          if (r.kind === 'refused' && r.status !== 408 && r.status !== 429) log?.[attempts === 1 ? 'error' : 'debug'](fields, 'the marketplace refused the registration; retrying');
          else log?.[attempts === 1 ? 'warn' : 'debug'](fields, 'marketplace unreachable; registration will be retried');
          await sleep(backoff * (0.8 + 0.4 * Math.random()));
          backoff = Math.min(backoff * 2, maxBackoff);
          continue;
        }
        const r = await post('/v1/providers/heartbeat', o.capacity(stamp()), (b) => b.ok === true);
        if (stopper.signal.aborted || announced) break;
        if (r.kind === 'refused' && dropsRegistration(r.status)) {
          // Not live at the market any more (or soon): not ready until it takes a registration
          // again. Registering at once is paced by the heartbeat interval when the market accepts
          // it, and by the backoff when it refuses it too.
          registered = false;
          failed('heartbeat', r);
          refusals++;
          const again = refusals > 1 && r.code === refusedCode;
          refusedCode = r.code;
          const level = again ? 'debug' : r.status === 404 && r.code === 'unknown_provider' ? 'info' : 'warn';
          log?.[level]({ market: base, status: r.status, code: r.code, reason: r.message }, refusalMessage(r));
          continue;
        }
        if (r.kind === 'ok') {
          lastHeartbeatAt = now();
          lastError = null;
          refusals = 0;
          // A key read wrong once (a replica mid-rotation, a proxy's answer) must not keep the node
          // out of work while the market stays healthy: read again each heartbeat until trusted.
          if (o.trustedKeys && !ticketKey?.trusted) await checkTicketKey();
          if (heartbeatFailing) log?.info({ market: base }, 'marketplace reachable again');
          heartbeatFailing = false;
        } else {
          failed('heartbeat', r);
          if (!heartbeatFailing) log?.warn({ market: base, ...(r.kind === 'refused' ? { status: r.status, code: r.code } : {}), reason: r.message }, 'heartbeat failed; still serving, will keep trying');
          heartbeatFailing = true;
        }
        await sleep(interval);
      } catch (e) {
        // A bug or a failing snapshot/signing callback: never take the node down for it.
        log?.error({ market: base, reason: (e as Error)?.message }, 'marketplace registration loop error');
        lastError = { at: now(), during: registered ? 'heartbeat' : 'registration', reason: `internal error: ${String((e as Error)?.message ?? e).slice(0, 300)}` };
        await sleep(maxBackoff);
      }
    }
  };
  const done = loop().catch(() => undefined);

  return {
    get registered() {
      return registered;
    },
    status() {
      return { url: base, registered, registered_at: registeredAt, last_heartbeat_at: lastHeartbeatAt, last_error: lastError, ticket_key: ticketKey };
    },
    async announce(timeoutMs: number) {
      // From now on the loop neither heartbeats nor registers again: a heartbeat still in flight
      // (accepting) that the market refuses as older than this one must not lead to a new
      // registration, which the market would list as accepting.
      announced = true;
      if (!registered || stopper.signal.aborted) return;
      // Best effort (a snapshot that fails to sign included): the market learns it at the latest
      // when heartbeats stop.
      const sent = (async () => post('/v1/providers/heartbeat', o.capacity(stamp()), (b) => b.ok === true))().catch(() => undefined);
      await Promise.race([sent, new Promise((r) => setTimeout(r, timeoutMs).unref())]);
    },
    async stop() {
      stopper.abort();
      await done;
    },
  };
}

/**
 * /readyz for a node: not ready while stopping, with its receipt log stopped (no paid work can
 * end in a receipt), without a marketplace key (every ticket would be
 * refused), or, when a marketplace URL is configured, while the market has not accepted the node
 * (it routes no new buyers to it). Tickets already issued are still served in that state.
 */
export function readiness(stopping: boolean, hasMarketKey: boolean, market: MarketplaceStatus | undefined, receiptLogFailure?: Error, stateFailure?: Error, problems: readonly string[] = []): { ready: boolean; reasons: string[] } {
  const reasons = workRefused(stopping, hasMarketKey, market, receiptLogFailure, stateFailure, problems);
  if (stopping) return { ready: false, reasons };
  if (market && !market.registered) {
    const e = market.last_error;
    const why = e === null ? 'registration in progress' : `last ${e.during} failed: ${e.code ?? e.reason}${e.code && e.reason ? ` (${e.reason})` : ''}`;
    reasons.push(`not registered with the marketplace at ${market.url}: ${why}`);
  }
  return { ready: reasons.length === 0, reasons };
}

/**
 * Why the node would refuse any new paid request now (empty: it takes work). The capacity
 * snapshot's `accepting` is this list being empty; /readyz adds the node's standing with the market.
 */
export function workRefused(stopping: boolean, hasMarketKey: boolean, market: MarketplaceStatus | undefined, receiptLogFailure?: Error, stateFailure?: Error, problems: readonly string[] = []): string[] {
  if (stopping) return ['stopping'];
  const reasons: string[] = [];
  if (receiptLogFailure) reasons.push(`the receipt log has stopped (${receiptLogFailure.message.slice(0, 600)}): paid requests are refused until a restart`);
  if (stateFailure instanceof StoreStopped) reasons.push(stateFailure.message.slice(0, 1000));
  else if (stateFailure) reasons.push(`state.db refused a write (${stateFailure.message.slice(0, 200)}): paid requests are refused with 503 until a write succeeds (tried again ${STATE_FAILURE_HOLD_MS / 1000} s after the last failure)`);
  if (!hasMarketKey) reasons.push('no marketplace public key configured: every ticket would be refused');
  else if (market?.ticket_key && !market.ticket_key.trusted) {
    reasons.push(`the marketplace at ${market.url} signs tickets with key ${market.ticket_key.public_key}, which is not in marketplace.public_keys: every ticket it issues would be refused`);
  }
  reasons.push(...problems); // (the data dir's free space, a model file changed under it)
  return reasons;
}
