// Misbehaving parties for the gateway's tests, on real transports:
//
// - ScriptedNode: a provider on a real libp2p host (TCP + Noise + Yamux, loopback) that registers
//   itself with a market (signed registration and price list, as a real node does), keeps a real
//   receipt log served over /service/log/1.0.0, and answers every /service/infer/1.0.0 stream with
//   whatever the current `behaviour` writes: frames, a close without a TRAILER, a reset, receipts
//   that are honest, logged, forged or for something else.
// - MarketProxy: an HTTP server in front of a real development market that forwards every call, but
//   can rewrite the ticket the market grants and answer (or drop) POST /v1/receipts itself.
import crypto from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import type { Stream } from '@libp2p/interface';
import { toHex, utf8 } from '../../attestation/bytes.ts';
import { serializeEnvelope, type DsseEnvelope } from '../../attestation/dsse.ts';
import { ed25519PublicKey } from '../../attestation/ed25519.ts';
import { sha256Hex } from '../../attestation/hash.ts';
import { computeCost, type Rates } from '../../attestation/money.ts';
import { signPriceList } from '../../attestation/price-list.ts';
import { buildReceiptPayload, GENESIS_PREV, ratesToWire, type ReceiptBody } from '../../attestation/receipt.ts';
import { peekPayload } from '../../attestation/signed-payload.ts';
import type { TicketPayload } from '../../attestation/ticket.ts';
import { signRegistration } from '../../src/market/registration-payload.ts';
import type { IssuedTicketResponse } from '../../src/market/tickets.ts';
import { FrameReader, writeBytes } from '../../src/p2p/frame-io.ts';
import { encodeData, encodeHead, encodeTrailer, type JsonObject } from '../../src/p2p/frames.ts';
import { signCapacity } from '../../src/p2p/capacity-protocol.ts';
import { createHost, type Host } from '../../src/p2p/host.ts';
import { INFER_PROTOCOL } from '../../src/p2p/infer-protocol.ts';
import { LOG_PROTOCOL, serveLog } from '../../src/p2p/log-protocol.ts';
import { handleRequests, type RequestServer } from '../../src/p2p/request-stream.ts';
import { ReceiptLog } from '../../src/store/receipt-log.ts';
import { signReceipt, testKey } from './receipts.ts';

export const SCRIPTED_RATES: Rates = { input_per_mtok: 150_000n, output_per_mtok: 600_000n };
/** The usage an honest scripted answer bills unless told otherwise. */
export const SCRIPTED_USAGE = { input_tokens: 7, output_tokens: 3 };


/** One request as the scripted node received it, and the means to answer it (or not). */
export class Exchange {
  /** The request HEAD ({endpoint, ticket, idempotency_key?}). */
  readonly requestHead: JsonObject;
  /** The ticket's payload as sent (not verified: this node trusts anything). */
  readonly ticket: TicketPayload;
  readonly body: Uint8Array;
  readonly bodySha256: string;
  private readonly node: ScriptedNode;
  private readonly stream: Stream;
  private readonly sent: Uint8Array[] = [];

  constructor(node: ScriptedNode, stream: Stream, head: JsonObject, body: Uint8Array) {
    this.node = node;
    this.stream = stream;
    this.requestHead = head;
    this.body = body;
    this.bodySha256 = sha256Hex(body);
    this.ticket = (peekPayload(head.ticket as DsseEnvelope) ?? {}) as unknown as TicketPayload;
  }

  head(value: JsonObject): Promise<void> {
    return writeBytes(this.stream, encodeHead(value));
  }

  data(bytes: Uint8Array | string): Promise<void> {
    const b = typeof bytes === 'string' ? utf8(bytes) : bytes;
    this.sent.push(b);
    return writeBytes(this.stream, encodeData(b));
  }

  /** The TRAILER, then the write side closes (what a node does). */
  async trailer(value: JsonObject): Promise<void> {
    await writeBytes(this.stream, encodeTrailer(value));
    await this.stream.close();
  }

  /** Closes the write side cleanly, without a TRAILER. */
  close(): Promise<void> {
    return this.stream.close();
  }

  /** Resets the stream. */
  reset(): void {
    this.stream.abort(new Error('scripted reset'));
  }

  /** SHA-256 of every DATA byte sent so far: the honest response_sha256. */
  get responseSha256(): string {
    return sha256Hex(Buffer.concat(this.sent));
  }

  /** The honest receipt body of this request for what was sent so far, with `over` applied. */
  receiptBody(over: Partial<ReceiptBody> = {}): ReceiptBody {
    const usage = over.usage ?? SCRIPTED_USAGE;
    const now = Date.now();
    return {
      request_id: this.ticket.request_id,
      ticket_id: this.ticket.ticket_id,
      endpoint: this.ticket.endpoint,
      model: this.ticket.model,
      model_sha256: sha256Hex('scripted model'),
      runtime: { adapter: 'scripted', version: '1' },
      quantization: 'f32',
      status: 'completed',
      started_at: now,
      first_token_at: now,
      finished_at: now,
      usage,
      usage_runtime: {},
      price: { version: this.node.priceVersion, rates: ratesToWire(SCRIPTED_RATES) },
      cost_micro_usd: computeCost(usage, SCRIPTED_RATES).toString(),
      hold_micro_usd: this.ticket.max_cost_micro_usd,
      request_sha256: this.bodySha256,
      response_sha256: this.responseSha256,
      attestation: { tier: 'T1', evidence_sha256: null },
      ...over,
    };
  }

  /** Signs the receipt and makes it durable in the node's log (served over /service/log); its line. */
  async logReceipt(over: Partial<ReceiptBody> = {}): Promise<string> {
    return (await this.node.log.append(this.receiptBody(over))).line;
  }

  /**
   * A receipt line signed outside the log (never served by /service/log): by the node's key, or
   * by `seed` while still claiming the node's key id (a forged signature).
   */
  signedReceipt(over: Partial<ReceiptBody> = {}, seed: Uint8Array = this.node.seed): string {
    const payload = buildReceiptPayload(this.node.providerId, '0', GENESIS_PREV, this.receiptBody(over));
    return serializeEnvelope(signReceipt({ ...testKey(seed), id: this.node.providerId }, payload));
  }

  /** A node's success trailer around a receipt line. */
  static receiptTrailer(line: string, status = 'completed'): JsonObject {
    return { receipt: line, status };
  }
}

export type Behaviour = (ex: Exchange) => Promise<void>;

export class ScriptedNode {
  readonly seed: Uint8Array;
  readonly providerId: string;
  readonly host: Host;
  readonly log: ReceiptLog;
  readonly priceVersion: string;
  /** What the next infer streams get. */
  behaviour: Behaviour = async () => {
    throw new Error('no behaviour set');
  };
  /** Infer streams whose request was read whole. */
  requests = 0;
  /** Failures of the scripts themselves (a test asserts there are none). */
  readonly errors: Error[] = [];
  private logServer: RequestServer | undefined;
  private readonly priceEnvelope: DsseEnvelope;

  private constructor(seed: Uint8Array, host: Host, log: ReceiptLog) {
    this.seed = seed;
    this.providerId = toHex(ed25519PublicKey(seed));
    this.host = host;
    this.log = log;
    const prices = signPriceList(seed, this.providerId, [{ model: 'tiny/llama', ...ratesToWire(SCRIPTED_RATES) }]);
    this.priceVersion = prices.payload.version;
    this.priceEnvelope = prices.envelope;
  }

  static async start(dir: string): Promise<ScriptedNode> {
    const seed = new Uint8Array(crypto.randomBytes(32));
    const host = await createHost({ seed, listen: ['/ip4/127.0.0.1/tcp/0'] });
    const log = ReceiptLog.open({ path: path.join(dir, 'scripted-receipts.db'), seed, threads: 0, checkpointIntervalMs: 0 });
    const node = new ScriptedNode(seed, host, log);
    node.logServer = await serveLog(host, log, (v) => node.priceListOf(v));
    await node.speakInfer(true);
    return node;
  }

  /** Its signed price list, by version, as a node's log serves it. */
  priceListOf(version: string): string | undefined {
    return version === this.priceVersion ? serializeEnvelope(this.priceEnvelope) : undefined;
  }

  /** Serves the infer protocol, or stops serving it (a node that then answers "na" to it). */
  async speakInfer(on: boolean): Promise<void> {
    if (on) await this.host.handle(INFER_PROTOCOL, (stream: Stream) => void this.serve(stream), { maxInboundStreams: 64 });
    else await this.host.unhandle(INFER_PROTOCOL);
  }

  /** Registers with the market as a node does: signed registration, signed price list, tiny/llama (at `addresses`: by default its own). */
  async register(marketUrl: string, addresses: string[] = this.host.getMultiaddrs().map((a) => a.toString())): Promise<void> {
    const envelope = signRegistration(this.seed, {
      v: 1,
      provider: this.providerId,
      peer_id: this.host.peerId.toString(),
      addresses,
      price_version: this.priceVersion,
      price_list: this.priceEnvelope,
      models: [{ id: 'tiny/llama', quantization: 'f32', context: 512, slots: 4, tokens_per_second: 1000 }],
      attestation_tier: 'T1',
      issued_at: Date.now(),
    });
    const r = await fetch(`${marketUrl}/v1/providers/register`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(envelope) });
    if (!r.ok) throw new Error(`the scripted node's registration was refused: ${r.status} ${await r.text()}`);
  }

  /**
   * Serves /service/log/1.0.0 with one fixed answer for every request (`status`, then `body` as
   * one DATA frame), or, with no answer, the real log again.
   */
  async answerLogWith(answer?: { status: number; body: string }): Promise<void> {
    await this.logServer?.stop();
    this.logServer = answer
      ? await handleRequests(this.host, LOG_PROTOCOL, async (_req, res) => {
          await res.head({ status: answer.status, headers: { 'content-type': 'application/json' } });
          await res.data(utf8(answer.body));
          await res.trailer({});
        })
      : await serveLog(this.host, this.log, (v) => this.priceListOf(v));
  }

  /** Sends the market a signed heartbeat: whether it takes requests, with every slot free. */
  async heartbeat(marketUrl: string, accepting: boolean): Promise<void> {
    const envelope = signCapacity(
      { seed: this.seed, providerId: this.providerId },
      { price_version: this.priceVersion, attestation_tier: 'T1', accepting, models: [{ id: 'tiny/llama', context: 512, quantization: 'f32', tokens_per_second: 1000, slots: 4, free_slots: 4, queued: 0, queue_limit: 16 }] },
    );
    const r = await fetch(`${marketUrl}/v1/providers/heartbeat`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(envelope) });
    if (!r.ok) throw new Error(`the scripted node's heartbeat was refused: ${r.status} ${await r.text()}`);
  }

  private async serve(stream: Stream): Promise<void> {
    let ex: Exchange;
    const reader = new FrameReader(stream);
    try {
      const head = await reader.next();
      if (!head || head.kind !== 'head') throw new Error('expected a HEAD frame');
      // The body ends at the client's close, or after the bytes its HEAD announces (as a node reads it).
      const announced = typeof head.value.body_length === 'number' ? head.value.body_length : undefined;
      const parts: Uint8Array[] = [];
      let size = 0;
      while (size !== announced) {
        const f = await reader.next();
        if (!f) break;
        if (f.kind !== 'data') throw new Error(`unexpected ${f.kind} frame in the request`);
        parts.push(f.bytes);
        size += f.bytes.length;
      }
      ex = new Exchange(this, stream, head.value, Buffer.concat(parts));
    } catch (e) {
      this.errors.push(e as Error);
      stream.abort(e as Error);
      return;
    } finally {
      reader.detach();
    }
    this.requests++;
    try {
      await this.behaviour(ex);
      if (stream.writeStatus === 'writable') throw new Error('the behaviour left the stream open');
    } catch (e) {
      this.errors.push(e as Error);
      stream.abort(e as Error);
    }
  }

  async stop(): Promise<void> {
    await this.logServer?.stop();
    await this.host.stop();
    await this.log.close();
  }
}

// ---- the market proxy ----------------------------------------------------------------------------

/** What the market grants for POST /v1/tickets. */
export type TicketGrant = IssuedTicketResponse;

/** forward it; drop the connection; answer this; or forward it once `hold` resolves. */
export type ReceiptAnswer = 'forward' | 'drop' | { status: number; body?: unknown } | { hold: Promise<void> };

export class MarketProxy {
  readonly url: string;
  /** Rewrites the real market's grant for POST /v1/tickets (or delays it, resolving later); undefined: relayed as it is. */
  ticket: ((grant: TicketGrant) => unknown) | undefined;
  /** How to answer POST /v1/receipts attempt n (1-based, counted since reset()); undefined: forward. */
  receipt: ((attempt: number) => ReceiptAnswer) | undefined;
  /** POST /v1/receipts calls since reset(). */
  receiptPosts = 0;
  /** Every call relayed or answered, of any route, since reset(). */
  calls = 0;
  private readonly server: http.Server;

  private constructor(server: http.Server, url: string) {
    this.server = server;
    this.url = url;
  }

  static async start(target: string): Promise<MarketProxy> {
    let proxy!: MarketProxy;
    const server = http.createServer((req, res) => {
      proxy.calls++;
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        void proxy.answer(target, req, res, Buffer.concat(chunks)).catch((e: unknown) => {
          res.writeHead(500, { 'content-type': 'text/plain' }).end(`proxy failed: ${(e as Error).message}`);
        });
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const a = server.address() as AddressInfo;
    proxy = new MarketProxy(server, `http://127.0.0.1:${a.port}`);
    return proxy;
  }

  reset(): void {
    this.ticket = undefined;
    this.receipt = undefined;
    this.receiptPosts = 0;
    this.calls = 0;
  }

  private async answer(target: string, req: http.IncomingMessage, res: http.ServerResponse, body: Buffer): Promise<void> {
    const send = (status: number, value: unknown): void => {
      res.writeHead(status, { 'content-type': 'application/json; charset=utf-8' }).end(value === undefined ? '' : typeof value === 'string' ? value : JSON.stringify(value));
    };
    const isReceipt = req.method === 'POST' && req.url === '/v1/receipts';
    if (isReceipt) {
      const attempt = ++this.receiptPosts;
      const how = this.receipt ? this.receipt(attempt) : 'forward';
      if (how === 'drop') {
        req.socket.destroy();
        return;
      }
      if (typeof how === 'object' && 'hold' in how) await how.hold;
      else if (how !== 'forward') return send(how.status, how.body);
    }
    const r = await fetch(`${target}${req.url}`, {
      method: req.method,
      headers: { accept: 'application/json', ...(body.length > 0 ? { 'content-type': req.headers['content-type'] ?? 'application/json' } : {}) },
      ...(body.length > 0 ? { body: new Uint8Array(body) } : {}),
    });
    const text = await r.text();
    if (req.method === 'POST' && req.url === '/v1/tickets' && r.ok && this.ticket) return send(200, await this.ticket(JSON.parse(text) as TicketGrant));
    send(r.status, text);
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
