// The node's serving core, independent of transport: one request in (the head with its ticket,
// the exact body bytes), a response out (head, data, trailer). Every refusal happens before any
// work and charges nothing; every request that did work ends in a durable signed receipt for
// exactly the tokens delivered, whose envelope line is the trailer's `receipt`.
import { hasLoneSurrogate } from '../../attestation/canonical-json.ts';
import crypto from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { RuntimeBusyError, UnsupportedInputError, type GeneratedChunk, type GenerationResult, type RuntimeAdapter, type SamplingOptions } from '../../adapters/runtime-adapter.ts';
import { concatBytes, utf8 } from '../../attestation/bytes.ts';
import { sha256Hex } from '../../attestation/hash.ts';
import { computeCost, formatUsd, maxOutputTokensWithin, type Rates } from '../../attestation/money.ts';
import { ratesToWire, type AttestationTier, type ReceiptPayload, type ReceiptStatus } from '../../attestation/receipt.ts';
import type { TicketPayload } from '../../attestation/ticket.ts';
import type { DsseEnvelope } from '../../attestation/dsse.ts';
import { peekPayload } from '../../attestation/signed-payload.ts';
import { Admission, AdmissionError } from '../dispatch/admission.ts';
import { FreeWorkPace } from '../dispatch/free-work-pace.ts';
import { checkRouting, textNeed, type Offer } from '../dispatch/routing.ts';
import type { TicketGate, TicketRefusal } from '../dispatch/ticket-gate.ts';
import type { IdempotencyStore, Lookup, RecordedResponse } from '../dispatch/idempotency.ts';
import type { ReceiptLog } from '../store/receipt-log.ts';
import { ContractError, endpointsServed, FREE_ENDPOINTS, parseRequest, TEXT_ENDPOINTS, type GenerationParams, type ParsedRequest, type TextEndpoint } from './contract.ts';
import { Coalescer } from './coalescer.ts';
import { readAhead } from './read-ahead.ts';
import { isStoreError, type StoreHealth } from '../store/store-health.ts';
import { errorBody, ServiceError } from '../service-error.ts';
import { chatCompletion, CompletionStream, ResponsesStream, responsesBody, textCompletion, usageOut } from './openai-format.ts';

export interface ServedModel {
  id: string;
  adapter: RuntimeAdapter;
  admission: Admission;
  quantization: string;
  /** Measured sustained tokens/s (for min-throughput routing). */
  tokensPerSecond: number;
  rates: Rates;
}

export interface InferRequest {
  head: Record<string, unknown>;
  body: Uint8Array;
  signal: AbortSignal;
  /** What InferService.screen() said of this request's HEAD (set by the libp2p server). */
  screened?: unknown;
  /** The buyer's (or gateway's) libp2p peer id, authenticated by Noise, when it came over libp2p. */
  remotePeer?: string;
}

/** A paid request's ticket as screen() found it at the HEAD, before the body: its req.screened. */
class ScreenedTicket {
  readonly result: { ok: true; ticket: TicketPayload } | TicketRefusal;
  constructor(result: ScreenedTicket['result']) {
    this.result = result;
  }
}

/** screen()'s verdict (the shape the libp2p request server takes: p2p/request-server.ts, HeadScreen). */
export type HeadVerdict =
  | { vouched: true; note: ScreenedTicket; release: () => void }
  | { vouched: false; note?: ScreenedTicket; maxBody: number; refusal: { status: number; code: string; message: string } };

/** Options of InferResponse.data (the libp2p response writer implements them). */
export interface DataOptions {
  /** Resolve only once the bytes were handed to the transport, not when they are queued. */
  sent?: boolean;
  /** A stream's bytes: the output tokens they carry (billed once written). */
  tokens?: number;
}

const SENT: DataOptions = { sent: true };

export interface InferResponse {
  head(h: { status: number; headers: Record<string, string> }): Promise<void>;
  /** With `sent`, resolves only once the bytes were handed to the transport (billed bytes: see response-writer.ts). */
  data(bytes: Uint8Array, opts?: DataOptions): Promise<void>;
  trailer(t: Record<string, unknown>): Promise<void>;
  /** Told when a whole (non-streamed) body has been sent and its receipt comes next (what records it, for a retry, does so now). */
  whole?(): void;
}

/** What the service reports of each request, for metrics and logs: ids, counts and codes only. */
export interface InferEvent {
  endpoint: string;
  model: string;
  status: number;
  /** The error code of a refusal (or of a request that ended otherwise: a buyer gone before the answer). */
  code?: string;
  /** The ticket's request id, once a ticket was accepted. */
  requestId?: string;
  /** InferRequest.remotePeer: who sent it (a peer sending forged tickets is named in the log). */
  remotePeer?: string;
  receipt?: { status: ReceiptStatus; inputTokens: number; outputTokens: number; costMicroUsd: bigint; firstTokenMs: number | null; durationMs: number };
}

export interface InferServiceOptions {
  /** Called once per request when it ends. Must not throw. */
  observe?: (e: InferEvent) => void;
  log: ReceiptLog;
  gate: TicketGate;
  /** Answers retries that carry an idempotency key from the record. */
  idempotency?: IdempotencyStore;
  models: ReadonlyMap<string, ServedModel>;
  priceVersion: string;
  tier?: AttestationTier;
  now?: () => number;
  /** Told of state-store writes (used tickets, idempotency records) that fail and succeed. */
  state?: StoreHealth;
  /** Told of anything else that failed before any work (answered 500 internal_error). Must not throw. */
  onInternalError?: (e: unknown) => void;
  /** Paces free requests (default: at most a quarter of the time; see FreeWorkPace). */
  freePace?: FreeWorkPace;
  /** Why the node takes no paid work now (its disk nearly full, its state store gone), if so: refused 503 no_capacity before the ticket is used. */
  paidWorkRefused?: () => string | undefined;
  /**
   * How long a stream's events may wait to go out together, in ms (default 8; see Coalescer).
   * Audit replay sets 0: each event its own write, so that any point a stream was cut at is a
   * write's end.
   */
  streamWindowMs?: number;
}


const EMPTY = new Uint8Array(0);

/** Chunks a runtime may produce ahead of the relay (tokens, for the embedded runtime). */
const READ_AHEAD_CHUNKS = 32;

/** Where a receipt trailer carries its summary for observe(). */
const SUMMARY = Symbol('receipt summary');

/** A refusal before any work: status, code, nothing charged. */
class Refusal extends ServiceError {
  override name = 'Refusal';
}

/**
 * Why the node itself cancelled a request (its request signal's reason): it is stopping and the
 * grace for running requests ran out. Unlike a buyer who leaves, this buyer is still there: a
 * stream ends with what was sent and its `cancelled` receipt; a whole body, never sent, is a
 * `failed` run billing nothing, not one the buyer walked away from.
 */
export class NodeStopping extends Error {
  override name = 'NodeStopping';
  constructor() {
    super('the node is stopping: its grace period for running requests ran out');
  }
}

const stoppedByNode = (signal: AbortSignal): boolean => signal.aborted && signal.reason instanceof NodeStopping;
const NODE_STOPPED = 'the node stopped before the answer was complete';
const nodeStoppedRefusal = (): Refusal => new Refusal(503, 'no_capacity', `${NODE_STOPPED}; nothing was billed, another provider can take it`);

/** The largest body of a free request (tokenize, count_tokens): about 130,000 tokens of text. */
export const MAX_FREE_BODY = 512 << 10;
/** A paid body larger than this is parsed only once its ticket vouches for it (TicketGate.vouch). */
export const PARSED_BEFORE_TICKET = 64 << 10;
/** How long a free request waits for its turn before 503 no_capacity. */
const FREE_MAX_WAIT_MS = 2000;
/** Free requests that may wait for their turn. */
export const FREE_QUEUE = 64;

/** What handle() learns of a request as it goes, for its metrics and log line. */
interface RequestContext {
  model?: string;
  requestId?: string;
}

export class InferService {
  private readonly o: InferServiceOptions;
  private readonly now: () => number;
  /**
   * Free requests: one at a time, up to FREE_QUEUE waiting (see tokenize). Not shared out by peer:
   * a gateway is one peer for all its buyers, and counts an estimate's inputs eight at a time.
   */
  private readonly freeAdmission = new Admission({ slots: 1, queue: FREE_QUEUE });
  private readonly freePace: FreeWorkPace;

  constructor(opts: InferServiceOptions) {
    this.o = opts;
    this.now = opts.now ?? Date.now;
    this.freePace = opts.freePace ?? new FreeWorkPace();
  }

  /** The tickets of requests whose bodies are being received under them (screen() to its release). */
  private readonly receiving = new Set<string>();

  /**
   * Looks at a request's HEAD before its body arrives: a paid request whose ticket verifies (a
   * marketplace signed it, for this node, valid now; the body is matched once whole) may send a
   * body of up to the server's maximum; any other sends at most what is read without a ticket
   * (PARSED_BEFORE_TICKET, or MAX_FREE_BODY for a free one) and is refused as soon as it sends
   * more, with what a ticket check would say. One ticket vouches for one body at a time.
   */
  screen(head: Record<string, unknown>): HeadVerdict {
    const endpoint = head.endpoint;
    if (typeof endpoint === 'string' && (FREE_ENDPOINTS as readonly string[]).includes(endpoint)) {
      return { vouched: false, maxBody: MAX_FREE_BODY, refusal: { status: 413, code: 'body_too_large', message: `a ${endpoint} body is at most ${MAX_FREE_BODY} bytes` } };
    }
    if (typeof endpoint !== 'string') return { vouched: false, maxBody: PARSED_BEFORE_TICKET, refusal: { status: 400, code: 'invalid_request', message: 'head.endpoint: expected a string' } };
    const t = head.ticket;
    const v = t === undefined ? ({ ok: false, status: 401, code: 'ticket_invalid', message: 'head.ticket is missing' } as const) : this.o.gate.vouch(t as DsseEnvelope, undefined);
    if (!v.ok) return { vouched: false, note: new ScreenedTicket(v), maxBody: PARSED_BEFORE_TICKET, refusal: { status: v.status, code: v.code, message: v.message } };
    const id = v.ticket.ticket_id;
    if (this.receiving.has(id)) {
      // (no note: a body small enough to arrive is checked whole, as without a screen)
      return { vouched: false, maxBody: PARSED_BEFORE_TICKET, refusal: { status: 409, code: 'ticket_replayed', message: `a request under ticket ${id} is being received already` } };
    }
    this.receiving.add(id);
    return { vouched: true, note: new ScreenedTicket(v), release: () => this.receiving.delete(id) };
  }

  async handle(req: InferRequest, res: InferResponse): Promise<void> {
    const ctx: RequestContext = {};
    let status = 0;
    let code: string | undefined;
    let receipt: InferEvent['receipt'];
    const started = this.now();
    try {
      await this.handleRequest(req, {
        head: (h) => ((status = h.status), res.head(h)),
        data: (b, o) => res.data(b, o),
        trailer: (t) => {
          const e = t.error as { code?: string } | undefined;
          code = e?.code;
          // (the receipt is durable before its trailer is written: one whose buyer has gone still counts)
          const r = (t as { [SUMMARY]?: Omit<NonNullable<InferEvent['receipt']>, 'durationMs'> })[SUMMARY];
          if (r) receipt = { ...r, durationMs: this.now() - started };
          return res.trailer(t); // the summary's symbol key never reaches JSON
        },
      }, ctx);
    } catch (e) {
      // Still counted and logged: a buyer gone before its answer (a refusal that could not be
      // written: one that left while queued), or a handler that failed (the server answers 500).
      if (status === 0) {
        status = 500;
        code = 'internal_error';
      } else if (code === undefined) {
        const c = (e as { code?: unknown } | null)?.code;
        code = typeof c === 'string' && /^[a-z_]{1,40}$/.test(c) ? c : 'stream_closed';
      }
      throw e;
    } finally {
      this.observe(req, ctx, status, code, receipt);
    }
  }

  private observe(req: InferRequest, ctx: RequestContext, status: number, code: string | undefined, receipt: InferEvent['receipt']): void {
    if (!this.o.observe) return;
    // Metrics label values: only endpoints this node serves (a peer without a ticket picks the
    // head's string, and each distinct label value would be a series kept for good).
    const endpoint = TEXT_ENDPOINTS.includes(req.head.endpoint as TextEndpoint) ? (req.head.endpoint as string) : 'invalid';
    try {
      this.o.observe({ endpoint, model: ctx.model ?? '', status, ...(code ? { code } : {}), ...(ctx.requestId ? { requestId: ctx.requestId } : {}), ...(typeof req.remotePeer === 'string' ? { remotePeer: req.remotePeer } : {}), ...(receipt ? { receipt } : {}) });
    } catch {
      // observers must not break serving
    }
  }

  private async handleRequest(req: InferRequest, res: InferResponse, ctx: RequestContext): Promise<void> {
    let parsed: ParsedRequest;
    let model: ServedModel;
    let vouched: TicketPayload | undefined; // a large body's ticket, verified before its parse
    let refused: TicketRefusal | undefined; // a small body's ticket, refused at its HEAD (said where its check would be)
    try {
      const endpoint = req.head.endpoint;
      if (typeof endpoint !== 'string') throw new Refusal(400, 'invalid_request', 'head.endpoint: expected a string');
      // Work a peer can ask for without paying stays small: a free request's body is bounded, and a
      // large paid body is parsed (JSON.parse of 8 MiB of nesting takes seconds) only under a
      // ticket a marketplace signed for exactly these bytes.
      const free = (FREE_ENDPOINTS as readonly string[]).includes(endpoint);
      if (free && req.body.length > MAX_FREE_BODY) throw new Refusal(413, 'body_too_large', `a ${endpoint} body is at most ${MAX_FREE_BODY} bytes`);
      const screened = req.screened instanceof ScreenedTicket ? req.screened.result : undefined;
      if (!free && (screened || req.body.length > PARSED_BEFORE_TICKET)) {
        // (a ticket screened at the HEAD is not verified again: only matched to the body now whole)
        const v = !screened ? this.o.gate.vouch(req.head.ticket as DsseEnvelope, req.body) : screened.ok ? this.o.gate.matchBody(screened.ticket, req.body) : screened;
        if (v.ok) vouched = v.ticket;
        else if (req.body.length > PARSED_BEFORE_TICKET) throw new Refusal(v.status, v.code, v.message);
        else refused = v;
      }
      try {
        parsed = parseRequest(endpoint, req.body);
      } catch (e) {
        if (e instanceof ContractError) {
          ctx.model = this.servedModelNamed(req.body); // (the request log and metrics say which model was asked for)
          throw new Refusal(400, 'invalid_request', e.message);
        }
        throw e;
      }
      const m = this.o.models.get(parsed.model);
      ctx.model = m?.id;
      if (!m) throw new Refusal(404, 'model_not_found', `this node does not serve model "${parsed.model.slice(0, 256)}"`);
      model = m;
    } catch (e) {
      return this.refuse(res, e);
    }
    const p = parsed;
    if (isTokenize(p)) return this.tokenize(p, model, req, res);
    const key = req.head.idempotency_key;
    if (key === undefined || !this.o.idempotency) {
      if (this.o.log.failure) return this.refuse(res, logStopped());
      return this.serve(p, model, req, res, ctx, undefined, vouched, refused);
    }
    // An idempotent request: a retry is answered from the record, never run or billed twice.
    let account: string;
    let lookup: Lookup;
    let checkedTicket: TicketPayload;
    try {
      if (typeof key !== 'string' || key.length === 0 || key.length > 256) throw new Refusal(400, 'invalid_request', 'head.idempotency_key: expected 1 to 256 characters');
      // (a lone surrogate has no UTF-8 form: two keys differing only there would be one record)
      if (hasLoneSurrogate(key)) throw new Refusal(400, 'invalid_request', 'head.idempotency_key: not well-formed Unicode (a lone surrogate)');
      const checked = refused ?? this.o.gate.check(req.head.ticket as DsseEnvelope, { endpoint: p.endpoint, model: model.id, priceVersion: this.o.priceVersion, body: req.body }, vouched);
      if (!checked.ok) throw new Refusal(checked.status, checked.code, checked.message);
      checkedTicket = checked.ticket;
      ctx.requestId = checked.ticket.request_id;
      account = checked.ticket.account;
      // The endpoint is part of the request: the same body sent to another endpoint under the key is
      // another request. The ticket check has just matched the body to the ticket's body_sha256.
      const requestSha256 = sha256Hex(`${p.endpoint}\n${checked.ticket.body_sha256}`);
      lookup = this.o.idempotency.begin(account, key, requestSha256, checked.ticket.request_id);
      if (lookup.kind === 'pending') {
        // The node died after the first try's whole body was recorded: with its completed receipt
        // in the log, the retry gets both (the buyer has the answer, billed once); without it the
        // run never finished, and the retry runs.
        const done = this.completedReceipt(lookup.requestId);
        if (done) {
          const response = { ...lookup.response, trailer: trailerOf(done.line, done.payload) };
          this.o.idempotency.complete(account, key, requestSha256, response);
          lookup = { kind: 'replay', response };
        } else lookup = this.o.idempotency.abandonInterrupted(account, key, requestSha256, checked.ticket.request_id);
      }
      if (lookup.kind === 'interrupted') {
        // The first try's run ended without its response recorded: the node died while it ran (a
        // stream, or a body before it was whole), or (rarely) the record's write failed. Completed
        // (its receipt durable), its response is gone: never run and billed again. Otherwise (no
        // receipt, or cancelled: billed only for what it delivered, as any cancelled run) the retry runs.
        const done = this.completedReceipt(lookup.requestId);
        if (done) {
          throw new Refusal(409, 'idempotency_response_lost', `the first request under this Idempotency-Key (${lookup.requestId}) completed (receipt seq ${done.seq} in this node's log), but its response was not recorded (the node stopped, or could not write it); it is not run again`);
        }
        lookup = this.o.idempotency.abandonInterrupted(account, key, requestSha256, checked.ticket.request_id);
      }
      if (lookup.kind === 'conflict') throw new Refusal(409, lookup.code, lookup.message);
    } catch (e) {
      return this.refuse(res, e);
    }
    if (lookup.kind === 'replay') {
      // (answered from the record even with the receipt log stopped: it was billed once, its
      // receipt is already durable, and another provider must not run and bill it again)
      const r = lookup.response;
      await res.head({ status: r.status, headers: r.headers });
      if (r.body.length) await res.data(r.body);
      return res.trailer(r.trailer);
    }
    if (this.o.log.failure) {
      this.o.idempotency.finish(account, key, undefined);
      return this.refuse(res, logStopped());
    }
    // A run whose buyer leaves is cancelled (billed for its work) and not recorded: its retry runs
    // again. Finishing it for the retry instead would also finish every cancelled hedge loser.
    // The record is written before the trailer leaves (the receipt is durable by then): a node that
    // dies while sending it, or a trailer that never reaches the buyer, still answers the retry.
    const storing = (write: () => void) => {
      try {
        write();
      } catch (e) {
        if (isStoreError(e)) this.o.state?.failed(e); // (state.db refusing writes: the node says so)
        throw e;
      }
    };
    const recording = record(
      res,
      (r) => storing(() => this.o.idempotency!.finish(account, key, r)),
      (r) => storing(() => this.o.idempotency!.pending(account, key, r)),
    );
    try {
      await this.serve(p, model, req, recording, ctx, checkedTicket);
    } finally {
      this.o.idempotency.finish(account, key, undefined); // (the running mark, if no record took it)
    }
  }

  /** The durable `completed` receipt of request `requestId` in this node's log, if there is one. */
  private completedReceipt(requestId: string): { seq: number; line: string; payload: ReceiptPayload } | undefined {
    if (requestId === '') return undefined;
    for (const r of this.o.log.byRequestId(requestId)) {
      const payload = peekPayload(JSON.parse(r.line) as DsseEnvelope) as ReceiptPayload | undefined;
      if (payload?.status === 'completed') return { seq: r.seq, line: r.line, payload };
    }
    return undefined;
  }

  /** The `model` a body the contract refused names, when this node serves it (else undefined: never a buyer's string as a label). */
  private servedModelNamed(body: Uint8Array): string | undefined {
    if (body.length > PARSED_BEFORE_TICKET) return undefined; // (not parsed twice)
    try {
      const m = (JSON.parse(Buffer.from(body).toString('utf8')) as { model?: unknown } | null)?.model;
      return typeof m === 'string' && this.o.models.has(m) ? this.o.models.get(m)!.id : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * `checked`: the ticket, when the caller has already checked it (then only its use is recorded);
   * `vouched`: the ticket vouch() verified for a large body (its signature and body hash not checked again);
   * `refused`: what the ticket's check said, made before (at the HEAD).
   */
  private async serve(p: Exclude<ParsedRequest, TokenizeRequest>, model: ServedModel, req: InferRequest, res: InferResponse, ctx: RequestContext, checked?: TicketPayload, vouched?: TicketPayload, refused?: TicketRefusal): Promise<void> {
    let ticket: TicketPayload;
    try {
      // (before the ticket is used: another provider can take the request)
      const served = endpointsServed(model.adapter.info);
      if (!served.includes(p.endpoint)) throw new Refusal(404, 'model_not_found', `model "${model.id}" is not sold for ${p.endpoint} here: it has no chat template (it takes ${served.join(' and ')})`);
      if (model.adapter.modelFileState?.() === 'modified') throw modelFileModified(model);
      const busy = this.o.paidWorkRefused?.();
      if (busy) throw new Refusal(503, 'no_capacity', `${busy}; another provider can take it`);
      const full = model.admission.refusedNow();
      if (full) throw admissionRefusal(full);
      const t = req.head.ticket;
      if (t === undefined) throw new Refusal(401, 'ticket_invalid', 'head.ticket is missing');
      if (refused) throw new Refusal(refused.status, refused.code, refused.message);
      const admitted = checked ? this.o.gate.use(checked) : this.o.gate.admit(t as DsseEnvelope, { endpoint: p.endpoint, model: model.id, priceVersion: this.o.priceVersion, body: req.body }, vouched);
      if (!admitted.ok) throw new Refusal(admitted.status, admitted.code, admitted.message);
      this.o.state?.ok(); // (the used-ticket write went through)
      ticket = admitted.ticket;
      ctx.requestId = ticket.request_id;
    } catch (e) {
      return this.refuse(res, e);
    }
    if (p.endpoint === 'embeddings') return this.embeddings(p, model, ticket, req, res);
    return this.generate(p, model, ticket, req, res);
  }

  private async refuse(res: InferResponse, e: unknown): Promise<void> {
    const r = e instanceof Refusal ? e : e instanceof UnsupportedInputError ? new Refusal(400, e.code, e.message) : e instanceof RuntimeBusyError ? new Refusal(503, 'no_capacity', e.message) : this.failedBeforeWork(e);
    try {
      await res.head({ status: r.status, headers: { 'content-type': 'application/json' } });
      await res.trailer({ ...r.body() });
    } catch (err) {
      // The buyer has gone (one that left while queued: request_abandoned): the refusal still counts.
      throw Object.assign(new Error('the refusal could not be written: the buyer has gone', { cause: err }), { code: r.code });
    }
  }

  /**
   * A request that failed before any work for a reason of the node's own. The state store refusing
   * a write (disk full) is 503 no_capacity: another provider can take the request, and the node
   * stops saying it takes work for a while (StoreHealth). Anything else is 500; both are reported.
   */
  private failedBeforeWork(e: unknown): Refusal {
    if (isStoreError(e)) {
      this.o.state?.failed(e);
      return new Refusal(503, 'no_capacity', `the node cannot record this request now (its state store failed: ${e.message.slice(0, 120)}); another provider can take it`);
    }
    try {
      this.o.onInternalError?.(e);
    } catch {
      // observers must not break serving
    }
    return new Refusal(500, 'internal_error', 'the node failed before doing any work');
  }

  private async tokenize(p: TokenizeRequest, model: ServedModel, req: InferRequest, res: InferResponse): Promise<void> {
    // Free work, unpaid and unticketed: one at a time (tokenizing holds the event loop), a bounded
    // number waiting (at most FREE_MAX_WAIT_MS), the rest 503 at once: free requests cannot crowd out paid ones.
    // Its turn comes within FREE_MAX_WAIT_MS, the pace's wait included (FreeWorkPace: free work
    // takes at most a share of the node's time, so paid streams are not starved).
    const pace = this.freePace;
    const deadline = pace.now() + FREE_MAX_WAIT_MS;
    let release: () => void;
    try {
      release = await this.freeAdmission.acquire({ maxWaitMs: FREE_MAX_WAIT_MS, signal: req.signal });
    } catch (e) {
      return this.refuse(res, admissionRefusal(e));
    }
    // Exactly what a generation would be billed for: the chat template and BOS included.
    let tokens: number[];
    try {
      const wait = pace.wait();
      if (wait > 0) {
        if (pace.now() + wait > deadline) throw new Refusal(503, 'no_capacity', `free requests (tokenize, count_tokens) take at most ${Math.round(pace.share * 100)} % of this node's time: try again in ${Math.ceil(wait)} ms`);
        await sleep(wait, undefined, { signal: req.signal }).catch(() => {
          throw new Refusal(503, 'request_abandoned', 'the request was abandoned while it waited for its turn');
        });
      }
      tokens = await pace.run(() => model.adapter.inputTokens(p.messages ? { kind: 'chat', messages: p.messages } : { kind: 'prompt', prompt: p.prompt! }));
    } catch (e) {
      return this.refuse(res, e);
    } finally {
      release();
    }
    const body = { model: model.id, count: tokens.length, ...(p.returnTokens ? { tokens } : {}) };
    await res.head({ status: 200, headers: { 'content-type': 'application/json' } });
    await res.data(utf8(JSON.stringify(body)));
    await res.trailer({});
  }

  private async embeddings(p: Extract<ParsedRequest, { endpoint: 'embeddings' }>, model: ServedModel, ticket: TicketPayload, req: InferRequest, res: InferResponse): Promise<void> {
    const started = this.now();
    // The input's cost is known before any work: a hold that does not cover it is refused first.
    const tokens: number[][] = [];
    try {
      // (An input longer than the context by its length alone is refused before it is tokenised.)
      for (const text of p.input) tokens.push(await model.adapter.inputTokens({ kind: 'prompt', prompt: text }, { atMost: model.adapter.info.contextLength }));
    } catch (e) {
      return this.refuse(res, e);
    }
    const counted = tokens.reduce((sum, t) => sum + t.length, 0);
    const longest = tokens.reduce((most, t) => Math.max(most, t.length), 0);
    // The routing controls hold for embeddings too; each input is embedded on its own, so the
    // context must take the longest one.
    const refusal = checkRouting(this.offer(model), ticket.routing, { inputTokens: counted, maxOutputTokens: 0, contextNeed: longest });
    if (refusal) return this.refuse(res, new Refusal(refusal.status, refusal.code, refusal.message));
    const worst = computeCost({ input_tokens: counted, output_tokens: 0 }, model.rates);
    if (worst > BigInt(ticket.max_cost_micro_usd)) return this.refuse(res, new Refusal(403, 'request_cost_limit_exceeded', `the input costs ${worst} micro-USD, above the hold`));
    let release: (() => void) | undefined;
    try {
      release = await model.admission.acquire({ maxWaitMs: ticket.routing.max_wait_ms, signal: req.signal });
    } catch (e) {
      return this.refuse(res, admissionRefusal(e));
    }
    try {
      let e: Awaited<ReturnType<typeof model.adapter.embed>>;
      try {
        e = await model.adapter.embed(p.input, tokens, req.signal);
      } catch (err) {
        // Nothing reached the buyer and nothing is billed: a refusal that says why.
        if (stoppedByNode(req.signal)) return await this.refuse(res, nodeStoppedRefusal());
        const why = err instanceof Error ? err.message.slice(0, 200) : 'the runtime failed';
        return await this.refuse(res, new Refusal(500, 'runtime_failed', `the run failed: ${why}`));
      }
      // The node's own stop cut the inputs short: the buyer is still there and gets no vectors, so
      // nothing is billed, as for a runtime that failed.
      if (stoppedByNode(req.signal)) return await this.refuse(res, nodeStoppedRefusal());
      // The work is done and billed whatever happens next. A buyer who left (or a hedge's other
      // half that won) gets a `cancelled` receipt for the inputs embedded by then (the runtime
      // stopped at the next one; none when they left before it began), covering the bytes that
      // reached them: none, or the whole body.
      let status: ReceiptStatus = req.signal.aborted ? 'cancelled' : 'completed';
      let delivered: Uint8Array = EMPTY;
      if (status === 'completed') {
        const cost = computeCost({ input_tokens: e.inputTokens, output_tokens: 0 }, model.rates);
        const body = utf8(
          JSON.stringify({
            object: 'list',
            data: e.vectors.map((vector, index) => ({ object: 'embedding', index, embedding: p.encoding === 'base64' ? float32Base64(vector) : vector })),
            model: model.id,
            usage: { prompt_tokens: e.inputTokens, total_tokens: e.inputTokens, cost: formatUsd(cost) },
            service: { request_id: ticket.request_id },
          }),
        );
        try {
          await res.head({ status: 200, headers: { 'content-type': 'application/json', 'x-request-id': ticket.request_id } });
          await res.data(body);
          delivered = body;
          res.whole?.();
        } catch {
          status = 'cancelled';
        }
      }
      const receipt = await this.receipt(model, ticket, req, { status, started, firstToken: null, input: e.inputTokens, output: 0, usageRuntime: { prompt_tokens: e.inputTokens }, responseSha256: sha256Hex(delivered) });
      await res.trailer(receipt).catch(() => undefined); // a buyer who left still has a receipt in the log
    } finally {
      release();
    }
  }

  private async generate(p: Extract<ParsedRequest, { endpoint: 'chat/completions' | 'completions' | 'responses' }>, model: ServedModel, ticket: TicketPayload, req: InferRequest, res: InferResponse): Promise<void> {
    const started = this.now();
    const input = p.endpoint === 'completions' ? ({ kind: 'prompt', prompt: p.prompt } as const) : ({ kind: 'chat', messages: p.messages } as const);
    let maxTokens: number;
    let tokens: number[];
    try {
      tokens = await model.adapter.inputTokens(input, { atMost: model.adapter.info.contextLength });
      const inputTokens = tokens.length;
      // max_tokens as asked: more than the context leaves is refused (context_length_exceeded), never
      // quietly cut; without it, whatever room the context leaves (textNeed).
      const need = textNeed(inputTokens, p.maxTokens, model.adapter.info.contextLength);
      // Context fit, ceilings and the buyer's cost cap judge the worst case of what was asked (spec:
      // refused before spend if its worst case is higher): an input the context cannot hold is 400
      // context_length_exceeded, whatever the hold.
      const refusal = checkRouting(this.offer(model), ticket.routing, need);
      if (refusal) throw new Refusal(refusal.status, refusal.code, refusal.message);
      // The worst case must stay within the ticket's hold: generation is capped to what it pays for.
      const affordable = maxOutputTokensWithin(BigInt(ticket.max_cost_micro_usd), inputTokens, model.rates);
      if (affordable < 1) throw new Refusal(403, 'request_cost_limit_exceeded', affordable < 0 ? 'the hold does not cover the input tokens' : 'the hold covers the input tokens but not one output token');
      maxTokens = Math.min(need.maxOutputTokens, affordable);
    } catch (e) {
      return this.refuse(res, e);
    }
    let release: () => void;
    try {
      release = await model.admission.acquire({ maxWaitMs: ticket.routing.max_wait_ms, signal: req.signal });
    } catch (e) {
      return this.refuse(res, admissionRefusal(e));
    }
    const hash = crypto.createHash('sha256');
    const delivery = watchDelivery(res);
    const send = async (bytes: Uint8Array | undefined, opts?: DataOptions) => {
      if (!bytes) return;
      await delivery.res.data(bytes, opts);
      hash.update(bytes);
    };
    const created = Math.floor(started / 1000);
    const chat = p.endpoint === 'chat/completions';
    const responses = p.endpoint === 'responses';
    const stream = p.stream && !responses ? new CompletionStream(chat, ticket.request_id, model.id, created) : undefined;
    const rstream = p.stream && responses ? new ResponsesStream(ticket.request_id, model.id, created) : undefined;
    let firstToken: number | null = null;
    let generated = 0;
    // Streamed tokens count as delivered (billed, hashed) once their bytes were handed to the stream,
    // not when they were queued behind its cork: a buyer who resets meanwhile never got them.
    const events = new Coalescer((bytes, n) => send(bytes, { ...SENT, tokens: n }), { windowMs: this.o.streamWindowMs });
    let text = '';
    let status: ReceiptStatus = 'completed';
    let result: GenerationResult | undefined;
    let failure: string | undefined;
    let gen: AsyncGenerator<GeneratedChunk, GenerationResult, void> | undefined;
    /** What ended the run early by throwing (the runtime, or a write to a buyer who left). */
    let broke: { error: unknown; buyerGone: boolean } | undefined;
    /** The buyer went away, or their stream refused a write (not the node's own stop: that buyer is still there). */
    const buyerGone = () => (req.signal.aborted && !stoppedByNode(req.signal)) || delivery.failed;
    try {
      const streaming = Boolean(stream ?? rstream);
      await delivery.res.head({ status: 200, headers: { 'content-type': streaming ? 'text/event-stream' : 'application/json', 'x-request-id': ticket.request_id, ...(streaming ? { 'x-service-stream-mode': 'live' } : {}) } });
      await send(stream?.start() ?? rstream?.start());
      // Read ahead: the runtime computes the next tokens while this one is relayed.
      gen = readAhead(model.adapter.generate({ input, inputTokens: tokens, maxTokens, sampling: samplingOf(p), stop: p.stop, signal: req.signal }), READ_AHEAD_CHUNKS);
      for (;;) {
        const n = await gen.next();
        if (n.done) {
          result = n.value;
          break;
        }
        firstToken ??= this.now();
        const t = n.value.text;
        if (stream) await events.push(t ? stream.delta(t) : EMPTY, n.value.tokens.length);
        else if (rstream) await events.push(t ? rstream.delta(t) : EMPTY, n.value.tokens.length);
        else {
          text += t;
          generated += n.value.tokens.length;
        }
      }
      await events.flush();
    } catch (e) {
      // The runtime failed, or the buyer's stream refused a write. A buyer still there first gets
      // the text the runtime produced before it failed.
      broke = { error: e, buyerGone: buyerGone() };
      if (!broke.buyerGone) await events.flush().catch(() => undefined);
      events.discard();
      await gen?.return(undefined as never).catch(() => undefined); // stops the runtime, frees its slot
    }
    // How the run ended. The node's own stop (its grace ran out): a run already finished is whole;
    // a stream ends `cancelled` with what was sent; a whole body, none of it sent, `failed`, billing
    // nothing (neither a buyer who walked away nor a runtime's failure: the node chose to stop).
    // Otherwise a buyer who left is `cancelled` (billed what was delivered), a runtime's failure `failed`.
    if (stoppedByNode(req.signal)) {
      const finished = !broke && result !== undefined && result.finishReason !== 'abort';
      status = finished ? 'completed' : stream || rstream ? 'cancelled' : 'failed';
      if (status === 'failed') failure = NODE_STOPPED;
    } else if (broke) {
      status = broke.buyerGone ? 'cancelled' : 'failed';
      if (status === 'failed') failure = broke.error instanceof Error ? broke.error.message.slice(0, 200) : 'the runtime failed';
    } else if (req.signal.aborted || result?.finishReason === 'abort') status = 'cancelled';
    // The prompt is billed once the runtime evaluated it: its own count when it finished; after a
    // failure or a buyer who left, only when a token came back (proof the prompt was evaluated).
    const inputTokens = failure === NODE_STOPPED ? 0 : result ? result.inputTokens : firstToken !== null ? tokens.length : 0;
    try {
      if (status === 'completed') {
        const cost = computeCost({ input_tokens: inputTokens, output_tokens: result!.outputTokens }, model.rates);
        const usage = usageOut(inputTokens, result!.outputTokens, formatUsd(cost));
        const finish = result?.finishReason === 'length' ? 'length' : 'stop';
        if (stream) {
          await send(stream.close(finish, p.includeUsage ? usage : undefined));
        } else if (rstream) {
          await send(rstream.finish(finish, usage));
        } else {
          const body = responses
            ? responsesBody(ticket.request_id, model.id, created, text, finish, usage)
            : chat
              ? chatCompletion(ticket.request_id, model.id, created, text, finish, usage)
              : textCompletion(ticket.request_id, model.id, created, text, finish, usage);
          await send(utf8(JSON.stringify(body)));
          res.whole?.();
        }
      }
    } catch (e) {
      status = req.signal.aborted || delivery.failed ? 'cancelled' : 'failed';
      if (status === 'failed') failure = e instanceof Error ? e.message.slice(0, 200) : 'the response could not be written';
    } finally {
      release();
    }
    // A run that did not complete bills for output: streamed, the tokens whose bytes reached the
    // stream; whole body, the work performed when the buyer left (they walked away from it), and
    // nothing when the run failed, as no body is sent then and the buyer gets none of it.
    const output = status === 'completed' ? result!.outputTokens : stream || rstream ? events.delivered : status === 'cancelled' ? generated : 0;
    const usageRuntime = result?.usageRuntime ?? { prompt_tokens: inputTokens, completion_tokens: output };
    const receipt = await this.receipt(model, ticket, req, { status, started, firstToken, input: inputTokens, output, usageRuntime, responseSha256: hash.digest('hex') });
    // A failed run's trailer says why, beside the receipt for what it delivered (design.md: the
    // trailer carries an error envelope and, where work was done, a receipt).
    const trailer = failure === undefined ? receipt : { ...receipt, ...(failure === NODE_STOPPED ? errorBody('node_stopping', `the run did not finish: ${failure}`) : errorBody('runtime_failed', `the run failed: ${failure}`)) };
    await res.trailer(trailer).catch(() => undefined); // a buyer who left still has a receipt in the log
  }

  /** What this node offers for a model, as routing controls judge it. */
  private offer(model: ServedModel): Offer {
    return { contextLength: model.adapter.info.contextLength, quantization: model.quantization, tokensPerSecond: model.tokensPerSecond, tier: this.o.tier ?? 'T1', rates: model.rates };
  }

  private async receipt(
    model: ServedModel,
    ticket: TicketPayload,
    req: InferRequest,
    r: { status: ReceiptStatus; started: number; firstToken: number | null; input: number; output: number; usageRuntime: Record<string, unknown>; responseSha256: string },
  ): Promise<Record<string, unknown>> {
    const cost = computeCost({ input_tokens: r.input, output_tokens: r.output }, model.rates);
    const info = model.adapter.info;
    const appended = await this.o.log.append({
      request_id: ticket.request_id,
      ticket_id: ticket.ticket_id,
      endpoint: ticket.endpoint,
      model: model.id,
      model_sha256: info.modelSha256,
      runtime: { adapter: info.adapter, version: info.version },
      quantization: model.quantization,
      status: r.status,
      started_at: r.started,
      first_token_at: r.firstToken,
      finished_at: Math.max(this.now(), r.firstToken ?? r.started),
      usage: { input_tokens: r.input, output_tokens: r.output },
      usage_runtime: r.usageRuntime,
      price: { version: this.o.priceVersion, rates: ratesToWire(model.rates) },
      cost_micro_usd: cost.toString(),
      hold_micro_usd: ticket.max_cost_micro_usd,
      request_sha256: ticket.body_sha256, // the ticket was admitted for exactly these bytes (checked)
      response_sha256: r.responseSha256,
      attestation: { tier: this.o.tier ?? 'T1', evidence_sha256: null },
    });
    return {
      ...trailerOf(appended.line, appended.payload),
      // For observe() only: JSON ignores symbol keys, so this never goes on the wire.
      [SUMMARY]: { status: r.status, inputTokens: r.input, outputTokens: r.output, costMicroUsd: cost, firstTokenMs: r.firstToken === null ? null : r.firstToken - r.started },
    };
  }
}

/** The trailer that carries a receipt (InferService.receipt), from the receipt alone: a pending record completed after a crash gets the very same. */
function trailerOf(line: string, p: ReceiptPayload): Record<string, unknown> {
  return { request_id: p.request_id, receipt: line, cost: formatUsd(BigInt(p.cost_micro_usd)), usage: { input_tokens: p.usage.input_tokens, output_tokens: p.usage.output_tokens }, status: p.status };
}

/**
 * Paid work needs a receipt at its end: with the receipt log stopped, new work is refused before
 * its ticket is used or anything runs, as a full node's is (the gateway tries another provider).
 */
function logStopped(): Refusal {
  return new Refusal(503, 'no_capacity', 'this node cannot sign receipts: its receipt log has stopped; it takes no paid work until its operator restarts it');
}

/** An embedding as encoding_format "base64" gives it: the little-endian float32 array's bytes, base64. */
function float32Base64(vector: readonly number[]): string {
  const view = new DataView(new ArrayBuffer(vector.length * 4));
  vector.forEach((x, i) => view.setFloat32(i * 4, x, true));
  return Buffer.from(view.buffer).toString('base64');
}

/**
 * Passes a response through and keeps a copy: a completed answer (status 200, a `completed`
 * receipt) is handed to `beforeTrailer` as the trailer leaves. A refusal or a cancelled stream is
 * not: its retry runs again.
 */
function record(res: InferResponse, beforeTrailer: (r: RecordedResponse) => void, whole: (r: Omit<RecordedResponse, 'trailer'>) => void): InferResponse {
  let head: { status: number; headers: Record<string, string> } | undefined;
  const body: Uint8Array[] = [];
  return {
    whole: () => {
      try {
        if (head?.status === 200) whole({ status: head.status, headers: head.headers, body: concatBytes(...body) });
      } catch {
        // (not recorded: a node that dies before the trailer answers the retry 409, as before)
      }
    },
    head: async (h) => {
      head = h;
      await res.head(h);
    },
    data: async (b, o) => {
      await res.data(b, o);
      body.push(b);
    },
    trailer: async (t) => {
      try {
        if (head?.status === 200 && t.receipt !== undefined && t.status === 'completed') beforeTrailer({ status: head.status, headers: head.headers, body: concatBytes(...body), trailer: t });
      } catch {
        // The record could not be written (state.db full or failing): the buyer still gets the
        // receipt, which is durable. The run's mark stays on disk, so a retry is answered 409
        // idempotency_response_lost (billed once, never run again), as after a crash here.
      }
      await res.trailer(t);
    },
  };
}

type TokenizeRequest = Extract<ParsedRequest, { endpoint: 'tokenize' | 'count_tokens' }>;

function isTokenize(p: ParsedRequest): p is TokenizeRequest {
  return (FREE_ENDPOINTS as readonly string[]).includes(p.endpoint);
}

/** A model whose file was written over in place while served: its receipts would name weights it may no longer run. */
export function modelFileModified(model: Pick<ServedModel, 'id' | 'adapter'>): Refusal {
  return new Refusal(503, 'no_capacity', `model ${model.id}: its file was modified in place while the node served it, so the weights it runs may no longer be those of model_sha256 ${model.adapter.info.modelSha256}; the node serves it again once restarted`);
}

function admissionRefusal(e: unknown): Refusal {
  if (e instanceof AdmissionError) {
    return new Refusal(503, e.code === 'aborted' ? 'request_abandoned' : 'no_capacity', e.message);
  }
  return new Refusal(500, 'internal_error', 'admission failed');
}

/**
 * The response, noting when the buyer's stream refuses a write (reset or closed): delivery ended
 * there, not the run, so the receipt says `cancelled` (billed for what was delivered), not `failed`.
 */
function watchDelivery(res: InferResponse): { res: InferResponse; readonly failed: boolean } {
  let failed = false;
  const refused = (e: unknown): never => {
    failed = true;
    throw e;
  };
  return {
    res: { head: (h) => res.head(h).catch(refused), data: (b, o) => res.data(b, o).catch(refused), trailer: (t) => res.trailer(t) },
    get failed() {
      return failed;
    },
  };
}

/**
 * The runtime's sampling for a request: what the buyer set, the runtime's defaults for the rest
 * (llama.cpp: top_p 0.95, top_k 40, min_p 0), and seed 0 when none is given, so every request
 * can be replayed.
 */
function samplingOf(p: GenerationParams): SamplingOptions {
  return {
    temperature: p.temperature,
    seed: p.seed ?? 0,
    ...(p.topP !== undefined ? { topP: p.topP } : {}),
    ...(p.topK !== undefined ? { topK: p.topK } : {}),
    ...(p.minP !== undefined ? { minP: p.minP } : {}),
    ...(p.repetitionPenalty !== undefined ? { repeatPenalty: p.repetitionPenalty } : {}),
  };
}
