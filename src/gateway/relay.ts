// Relaying a provider's answer to the buyer. A JSON body is collected, checked against its
// receipt and sent with `service.receipt`. A stream is relayed event by event as it arrives, its
// closing events (finish and usage chunks, [DONE]; the responses protocol's last event) held
// until the trailer's receipt verifies, then sent with the receipt in their `service`. The buyer
// leaving cancels the request at the node; a provider that breaks off ends the stream with an
// error event. Every receipt is settled in the background (Settlements).
import crypto from 'node:crypto';
import type { ServerResponse } from 'node:http';
import type { FastifyReply } from 'fastify';
import { concatBytes } from '../../attestation/bytes.ts';
import { formatUsd } from '../../attestation/money.ts';
import type { JsonObject } from '../p2p/frames.ts';
import type { Response as P2pResponse } from '../p2p/request-stream.ts';
import { JSON_TYPE } from '../service-error.ts';
import { errorBody, GatewayError } from './errors.ts';
import type { IdleWatch } from './idle-watch.ts';
import { checkReceipt, type CheckedReceipt } from './receipt-check.ts';
import type { RequestRecords } from './records.ts';
import { isObj } from './request-body.ts';
import type { Settlements, VerifiedReceipt } from './settlement.ts';
import { closingStart, ClosingScan, endsWithBlankLine, eventsEndAcross, HeldEvents, isTerminalEvent, lastEventAt, MAX_HELD_EVENT, usageOfEvents, withService } from './sse-events.ts';
import type { Paid } from './tickets.ts';


export interface RelayDeps {
  settlements: Settlements;
  records: RequestRecords;
  /** How long a buyer may leave a stream unread before it counts as gone (default: never). */
  buyerIdleMs?: number;
}

export class Relay {
  private readonly d: RelayDeps;

  constructor(deps: RelayDeps) {
    this.d = deps;
  }

  /**
   * The buyer left: the node's receipt (if it did any work) is settled in the background; an attempt
   * whose request never left the gateway (`nothingSent`) has none to look for.
   */
  abandon(p: Paid, reply: FastifyReply, nothingSent = false): FastifyReply {
    if (nothingSent) this.d.settlements.nothingSent(p, 'abandoned');
    else void this.d.settlements.settleFromNode(p, 'abandoned');
    reply.hijack();
    return reply;
  }

  /** The provider's answer broke off (the buyer still there): its receipt, if any, is settled from the node's log. */
  private brokeOff(p: Paid, e: unknown, idle: IdleWatch, ended: 'answer' | { stream: { receivedSha256: string } }): GatewayError {
    // A whole body is withheld (502), so its receipt is not settled at all (s23 h1: a node that
    // died after its `completed` receipt was durable had the buyer billed in full for a 502); a
    // stream's receipt must bill exactly the bytes that arrived (a connection that died with data
    // in flight loses bytes the node counted as sent: s24 hD).
    void this.d.settlements.settleFromNode(p, 'failed', ended === 'answer' ? { undelivered: true } : ended.stream);
    const what = ended === 'answer' ? 'answer' : 'stream';
    if (idle.timedOut) return new GatewayError(502, 'provider_timeout', `the provider ${idle.reason} and was cut off`);
    return new GatewayError(502, 'bad_provider_response', `the provider's ${what} broke off: ${(e as Error).message}`);
  }

  /**
   * The TRAILER's receipt checked against the answer relayed; a bad one fails the record, and is
   * the provider's fault (bad_provider_response) unless only its rates differ from what the market
   * stated and the provider's signed price list has the receipt's rates: then the market misstated
   * them (bad_market_response). Either way the answer is withheld and nothing is settled.
   */
  private async checkTrailer(p: Paid, trailer: JsonObject | undefined, hash: crypto.Hash): Promise<Extract<CheckedReceipt, { ok: true }> | { ok: false; code: string; message: string }> {
    const checked = checkReceipt(trailer?.receipt, { ...p.exp, responseSha256: hash.digest('hex') }, p.idempotent);
    if (checked.ok) return checked;
    return { ok: false, ...(await this.d.settlements.failBadReceipt(p.requestId, p, checked)) };
  }

  /**
   * The other half of the hedge that answered as request `id`: this attempt's, or, for an
   * Idempotency-Key retry answered with the first request's receipt, the first request's (its
   * record names it): the same answer names the same loser, whose cost is the buyer's too (s30 review).
   */
  private hedgedWith(p: Paid, id: string): { hedged_with?: string } {
    // (a retry that ran hedged itself names its own loser, billed now)
    const other = p.hedgedWith ?? (id === p.requestId ? undefined : this.d.records.get(id)?.hedged_with);
    return other === undefined ? {} : { hedged_with: other };
  }

  /**
   * The request a stream's header names: this request, or on an Idempotency-Key retry answered
   * from the node's record, the first request, which the node's HEAD names (the body's chunks,
   * `service` and receipt name it too). Its headers leave before the receipt: the node's word is
   * taken only for a request this gateway sent that same provider.
   */
  private async streamRequestId(p: Paid, res: P2pResponse): Promise<string> {
    if (!p.idempotent) return p.requestId;
    const head = await res.head;
    const said = isObj(head.headers) ? head.headers['x-request-id'] : undefined;
    if (typeof said !== 'string' || said === p.requestId || said.length > 256) return p.requestId;
    return this.d.records.get(said)?.provider === p.provider ? said : p.requestId;
  }

  async relayBody(p: Paid, res: P2pResponse, reply: FastifyReply, gone: AbortSignal, idle: IdleWatch): Promise<unknown> {
    const hash = crypto.createHash('sha256');
    const parts: Uint8Array[] = [];
    let trailer: JsonObject | undefined;
    try {
      for await (const f of res.frames) {
        idle.kick();
        if (f.kind === 'data') {
          hash.update(f.bytes);
          parts.push(f.bytes);
        } else trailer = f.value;
      }
    } catch (e) {
      if (gone.aborted) return this.abandon(p, reply);
      throw this.brokeOff(p, e, idle, 'answer');
    } finally {
      idle.stop();
    }
    const checked = await this.checkTrailer(p, trailer, hash);
    if (!checked.ok) throw new GatewayError(502, checked.code, checked.message);
    const id = checked.payload.request_id; // an idempotent retry is answered with the first request's receipt
    if (id !== p.requestId) reply.header('x-request-id', id);
    // Settled in the background: the buyer's answer waits for the receipt to verify, never for the
    // market (GET /v1/requests/{id} and close() wait for the settlement).
    if (checked.payload.status !== 'completed') {
      this.d.settlements.settleLater(id, checked, p.requestId);
      return reply.code(502).type(JSON_TYPE).send({ ...errorBody('provider_failed', `the provider's run ended ${checked.payload.status}; its receipt bills only what it delivered`), service: { request_id: id, receipt: checked.envelope, ...this.hedgedWith(p, id) } });
    }
    let body: unknown;
    try {
      body = JSON.parse(Buffer.concat(parts).toString('utf8'));
    } catch {
      body = undefined;
    }
    const problem = !isObj(body) ? 'the body is not a JSON object' : usageMismatch(body.usage, checked);
    if (problem) {
      this.d.records.fail(p.requestId, 'bad_provider_response', { code: 'bad_provider_response', message: problem });
      throw new GatewayError(502, 'bad_provider_response', problem);
    }
    const out = body as Record<string, unknown>;
    out.service = { ...(isObj(out.service) ? out.service : {}), request_id: id, receipt: checked.envelope, ...this.hedgedWith(p, id) };
    this.d.settlements.settleLater(id, checked, p.requestId);
    return reply.code(200).type(JSON_TYPE).send(JSON.stringify(out));
  }

  async relayStream(p: Paid, res: P2pResponse, reply: FastifyReply, gone: AbortSignal, idle: IdleWatch, markFinished: () => void): Promise<unknown> {
    // Once the buyer has the whole answer ([DONE]) they may ask for the record at once, while the
    // trailer is still on its way: GET /v1/requests/{id} then waits for this relay to settle.
    let relayed!: () => void;
    const whenRelayed = new Promise<void>((r) => (relayed = r));
    let tracking = false;
    const finished = (): void => {
      markFinished();
      if (!tracking) void this.d.settlements.track(p.requestId, whenRelayed);
      tracking = true;
    };
    try {
      return await this.relayStreamFrames(p, res, reply, gone, idle, finished);
    } finally {
      idle.stop();
      relayed();
    }
  }

  private async relayStreamFrames(p: Paid, res: P2pResponse, reply: FastifyReply, gone: AbortSignal, idle: IdleWatch, finished: () => void): Promise<unknown> {
    /** Relays what is pending (after anything held), unheld: an event too large to hold, or the stream's unterminated end. */
    const flushPending = async (): Promise<void> => {
      const h = held.take();
      if (h) await write(h);
      const chunks = pending;
      pending = [];
      pendingBytes = 0;
      for (const c of chunks) await write(c);
    };
    /** The gateway's own closing error event, on a line of its own even after an unterminated event. */
    const endWithError = (code: string, message: string): void => {
      if (openEvent && !raw.destroyed && !raw.writableEnded) raw.write('\n\n');
      // A responses stream speaks the responses event protocol to the end (s23 h2): an `error`
      // event numbered after the last one relayed (its `error` member is what OpenAI clients throw).
      if (responses && !raw.destroyed && !raw.writableEnded) raw.write(`event: error\ndata: ${JSON.stringify({ type: 'error', code, message, param: null, sequence_number: lastSequence + 1, ...errorBody(code, message) })}\n\n`);
      endStream(raw, responses ? undefined : code, message);
    };
    const responses = p.exp.endpoint === 'responses';
    /** The responses protocol's last sequence_number relayed (-1 before any). */
    let lastSequence = -1;
    reply.hijack();
    const raw = reply.raw;
    raw.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      'x-accel-buffering': 'no',
      'x-request-id': await this.streamRequestId(p, res),
      'x-service-stream-mode': 'live',
    });
    raw.flushHeaders();
    const hash = crypto.createHash('sha256');
    let trailer: JsonObject | undefined;
    // The stream's closing events (from the finish chunk to [DONE], or the responses protocol's
    // closing event) are held until the receipt verifies: a client stops reading there, so an
    // answer whose receipt fails must end with the error event instead, and one whose receipt
    // verifies carries it in the closing events' `service`.
    // Events are relayed whole: bytes after a frame's last blank line wait for the frame that ends
    // their event, so a closing event split across frames is still recognised and held. An event
    // larger than MAX_HELD_EVENT is relayed as it comes instead (never held, never buffered whole).
    const held = new HeldEvents();
    const scan = new ClosingScan();
    let pending: Uint8Array[] = [];
    let pendingBytes = 0;
    /** The last bytes written end inside an event (no blank line after them). */
    let openEvent = false;
    const write = async (bytes: Uint8Array): Promise<void> => {
      if (!bytes.length) return;
      openEvent = !endsWithBlankLine(bytes);
      if (responses) lastSequence = lastSequenceIn(bytes, lastSequence);
      if (gone.aborted || raw.destroyed || raw.write(bytes)) return;
      // The buyer is slow to read: that wait is theirs, not the provider's. A buyer whose
      // connection takes nothing for buyerIdleMs is taken for gone (the connection is closed, which
      // ends the relay as any leaving does): the provider then bills what it sent by then, not what
      // a stalled reader's buffers could take. (The kernel says a socket can take more only once a
      // good part of its send buffer, up to a few MiB, has gone: the limit must allow a slow reader
      // that long.)
      idle.pause();
      try {
        if (!(await drained(raw, this.d.buyerIdleMs))) raw.destroy();
      } finally {
        idle.resume();
      }
    };
    /**
     * Relays whole events (the stream's unterminated end too); from the first closing event on
     * (closingStart) they are held until the receipt verifies. What is held is relayed first if
     * more would take it past MAX_HELD_EVENT.
     */
    const take = async (events: Uint8Array): Promise<void> => {
      if (!held.empty && held.bytes + events.length > MAX_HELD_EVENT) await write(held.take()!);
      const from = held.empty ? closingStart(events, scan) : 0;
      if (from === events.length) return write(events);
      if (from > 0) await write(events.subarray(0, from));
      held.add(events.subarray(from));
      if (isTerminalEvent(events.subarray(lastEventAt(events)))) finished();
    };
    try {
      for await (const f of res.frames) {
        idle.kick();
        if (f.kind === 'data') {
          hash.update(f.bytes);
          const end = eventsEndAcross(pending, f.bytes);
          if (end === 0) {
            pending.push(f.bytes);
            pendingBytes += f.bytes.length;
            if (pendingBytes > MAX_HELD_EVENT) await flushPending();
            continue;
          }
          const events = pending.length ? concatBytes(...pending, f.bytes.subarray(0, end)) : f.bytes.subarray(0, end);
          pending = end < f.bytes.length ? [f.bytes.subarray(end)] : [];
          pendingBytes = f.bytes.length - end;
          await take(events);
        } else trailer = f.value;
      }
      if (pendingBytes) {
        // The stream's end closes whatever is pending (a last lone CR, or no blank line at all): a
        // closing event there is held like any other; anything else is relayed as it is.
        const rest = concatBytes(...pending);
        pending = [];
        pendingBytes = 0;
        await take(rest);
      }
    } catch (e) {
      if (gone.aborted) return this.abandon(p, reply);
      // The provider broke off mid-stream: its receipt (if any) bills what it delivered.
      finished();
      const err = this.brokeOff(p, e, idle, { stream: { receivedSha256: hash.digest('hex') } });
      endWithError(err.code, err.message);
      return reply;
    }
    finished();
    const work = (async () => {
      const checked = await this.checkTrailer(p, trailer, hash);
      if (!checked.ok) {
        endWithError(checked.code, checked.message);
        return;
      }
      if (checked.payload.status !== 'completed') {
        // The run failed or was cut short at the node: its receipt bills only what it delivered.
        const why = isObj(trailer?.error) && typeof trailer.error.message === 'string' ? `: ${trailer.error.message.slice(0, 200)}` : '';
        endWithError('provider_failed', `the provider's run ended ${checked.payload.status}${why}; its receipt bills only what it delivered`);
      } else {
        const h = held.take();
        // The usage the closing events tell the buyer must be the receipt's, as a whole body's
        // must (s28 review: a stream's usage chunk said 1 token and $0.000001 while the receipt
        // billed 3 and $0.000003). Otherwise the stream ends with the error, and, as for a whole
        // body, the receipt is recorded and never settled.
        const problem = h ? usageMismatch(usageOfEvents(h), checked) : undefined;
        if (problem) {
          this.d.records.fail(p.requestId, 'bad_provider_response', { code: 'bad_provider_response', message: problem });
          endWithError('bad_provider_response', problem);
          return;
        }
        if (h) await write(withService(h, { request_id: checked.payload.request_id, receipt: checked.envelope, ...this.hedgedWith(p, checked.payload.request_id) }));
        endStream(raw);
      }
      // The stream has ended: the market is told after, never in the buyer's way.
      await this.d.settlements.settle(checked.payload.request_id, checked, p.requestId);
    })();
    await this.d.settlements.track(p.requestId, work);
    return reply;
  }
}

/** The last `"sequence_number":N` in `bytes`, or `before` when there is none. */
function lastSequenceIn(bytes: Uint8Array, before: number): number {
  const text = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('latin1');
  const at = text.lastIndexOf('"sequence_number":');
  if (at < 0) return before;
  const m = /^"sequence_number":(\d{1,15})/.exec(text.slice(at, at + 40));
  return m ? Number(m[1]) : before;
}

function endStream(raw: ServerResponse, code?: string, message?: string): void {
  if (raw.destroyed || raw.writableEnded) return;
  if (code) raw.write(`data: ${JSON.stringify(errorBody(code, message ?? code))}\n\n`);
  raw.end();
}

/** Resolves true once the response can take more bytes or has closed; false after `ms` without either. */
function drained(raw: ServerResponse, ms?: number): Promise<boolean> {
  return new Promise((resolve) => {
    const done = (ok: boolean): void => {
      raw.off('drain', onEvent);
      raw.off('close', onEvent);
      if (timer) clearTimeout(timer);
      resolve(ok);
    };
    const onEvent = (): void => done(true);
    raw.on('drain', onEvent);
    raw.on('close', onEvent);
    const timer = ms === undefined ? undefined : setTimeout(() => done(false), ms);
  });
}

/** Why the usage told the buyer (a whole body's, a stream's closing events') disagrees with the receipt (tokens and cost), or undefined (none told). */
function usageMismatch(u: unknown, r: VerifiedReceipt): string | undefined {
  if (!isObj(u)) return undefined;
  const p = r.payload;
  if (u.prompt_tokens !== undefined && u.prompt_tokens !== p.usage.input_tokens) return `usage.prompt_tokens is ${String(u.prompt_tokens)}, the receipt says ${p.usage.input_tokens}`;
  if (u.completion_tokens !== undefined && u.completion_tokens !== p.usage.output_tokens) return `usage.completion_tokens is ${String(u.completion_tokens)}, the receipt says ${p.usage.output_tokens}`;
  if (u.input_tokens !== undefined && u.input_tokens !== p.usage.input_tokens) return `usage.input_tokens is ${String(u.input_tokens)}, the receipt says ${p.usage.input_tokens}`;
  if (u.output_tokens !== undefined && u.output_tokens !== p.usage.output_tokens) return `usage.output_tokens is ${String(u.output_tokens)}, the receipt says ${p.usage.output_tokens}`;
  if (u.cost !== undefined && u.cost !== formatUsd(BigInt(p.cost_micro_usd))) return `usage.cost is ${String(u.cost)}, the receipt says ${formatUsd(BigInt(p.cost_micro_usd))}`;
  return undefined;
}
