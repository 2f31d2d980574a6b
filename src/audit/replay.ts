// `seller-node audit --replay`: re-runs the requests a log's receipts describe on the embedded
// runtime and checks that the node sent exactly what its receipts claim (response_sha256).
//
// Prompts are private, so the node keeps no request bodies: whoever holds them (the buyer, or an
// operator who kept them) supplies a requests file, one JSON object a line:
//   {"request_id": "...", "body": "<base64 of the exact request body bytes>"}
// Each body must hash to the receipt's request_sha256. Replay runs the node's own serving code
// (InferService) with a clock fixed at the receipt's started_at and a ticket with the receipt's
// hold, so the cap on output tokens, the ids and the timestamps in the response are the same as
// when it was served; generation is seeded and single-threaded, so the bytes must be too.
// Completed chat/completions, completions, responses and embeddings receipts are replayed, and
// cancelled streams: the buyer left, and the receipt bills the tokens whose bytes were written.
// Replay writes each event on its own and looks for the point where the bytes written so far hash
// to response_sha256; the tokens those bytes carry must be the tokens billed. (A whole body
// cancelled bills the work done when the buyer left, which bytes cannot show: not replayed.)
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { fileSha256 } from '../../adapters/file-sha256.ts';
import { fromBase64, toHex } from '../../attestation/bytes.ts';
import { ed25519PublicKey } from '../../attestation/ed25519.ts';
import { sha256Hex } from '../../attestation/hash.ts';
import { ratesFromWire, type ReceiptPayload } from '../../attestation/receipt.ts';
import { signTicket } from '../../attestation/ticket.ts';
import { Admission } from '../dispatch/admission.ts';
import { TicketGate } from '../dispatch/ticket-gate.ts';
import { InferService } from '../serve/infer-service.ts';
import { readTextFile } from '../read-text-file.ts';
import { ReceiptLog } from '../store/receipt-log.ts';

export interface ReplayOptions {
  /** Receipt payloads, from a verified export. */
  receipts: ReceiptPayload[];
  /** request_id → exact body bytes. */
  requests: ReadonlyMap<string, Uint8Array>;
  modelPath: string;
  /** The context length the node served with (default: the model's, capped at 4096). */
  contextLength?: number;
  /** How long the model's load and run in a child process may take (default 10 minutes, as at the node). */
  probeTimeoutMs?: number;
}

export interface ReplayReport {
  /** The SHA-256 of the given model file. */
  model_sha256: string;
  /**
   * Completed receipts of a replayable endpoint, and cancelled ones whose given body streamed,
   * whatever their model: what a replay could check.
   */
  replayable: number;
  /** The distinct model_sha256 those receipts name, in log order. */
  receipt_models: string[];
  replayed: number;
  matched: number;
  /** error_code: the error a replay answered with, when it did not answer 200. output_tokens.replay: of a cancelled stream, the tokens its receipt's bytes carry. */
  mismatches: { seq: string; request_id: string; reason: string; error_code?: string; output_tokens?: { receipt: number; replay: number } }[];
  skipped: Record<string, number>;
  /** Request bodies whose request_id no receipt in the log has (never used), and the first of those ids. */
  unused_requests: number;
  unused_request_ids: string[];
}

export type ReplayFaultCode = 'replay_mismatch' | 'replay_nothing_replayed';

const REPLAYABLE = new Set(['chat/completions', 'completions', 'responses', 'embeddings']);
const STREAMED = new Set(['chat/completions', 'completions', 'responses']);
const UNUSED_IDS_KEPT = 20;
const BODY_MISMATCH = 'the given body does not hash to request_sha256';

/**
 * Why a replay fails, or undefined when it passes: a response (or a given body) that does not
 * match its receipt; or nothing replayed although the log holds completed receipts of replayable
 * endpoints (the wrong model file, or no body for any of its receipts). A log with nothing
 * replayable passes: there is nothing to check.
 */
export function replayFault(r: ReplayReport): { code: ReplayFaultCode; message: string } | undefined {
  if (r.mismatches.length) {
    const bodies = r.mismatches.filter((m) => m.reason === BODY_MISMATCH).length;
    const responses = r.mismatches.length - bodies;
    const parts = [
      responses ? `${responses} of ${r.replayed} replayed response${r.replayed === 1 ? '' : 's'} ${responses === 1 ? 'differs from its receipt' : 'differ from their receipts'}` : '',
      bodies ? `${bodies} given request bod${bodies === 1 ? 'y does' : 'ies do'} not hash to request_sha256` : '',
    ];
    return { code: 'replay_mismatch', message: parts.filter(Boolean).join('; ') };
  }
  if (r.replayed > 0 || r.replayable === 0) return undefined;
  const ofThisModel = r.replayable - (r.skipped['another model file'] ?? 0);
  if (ofThisModel === 0) {
    const named = r.receipt_models.slice(0, 3).join(', ') + (r.receipt_models.length > 3 ? `, … (${r.receipt_models.length} models)` : '');
    return { code: 'replay_nothing_replayed', message: `nothing replayed: the model file's sha256 ${r.model_sha256} matches no receipt (receipts name ${named})` };
  }
  const n = r.unused_requests;
  const unused = n ? `; ${n} given bod${n === 1 ? 'y matches' : 'ies match'} no receipt` : '';
  return {
    code: 'replay_nothing_replayed',
    message: `nothing replayed: no request body was given for any of the ${ofThisModel} completed receipt${ofThisModel === 1 ? '' : 's'} of this model file${unused}`,
  };
}

export async function replay(opts: ReplayOptions): Promise<ReplayReport> {
  const modelSha = await fileSha256(opts.modelPath);
  const inLog = new Set(opts.receipts.map((r) => r.request_id));
  const unused = [...opts.requests.keys()].filter((id) => !inLog.has(id));
  const report: ReplayReport = { model_sha256: modelSha, replayable: 0, receipt_models: [], replayed: 0, matched: 0, mismatches: [], skipped: {}, unused_requests: unused.length, unused_request_ids: unused.slice(0, UNUSED_IDS_KEPT) };
  const skip = (why: string) => (report.skipped[why] = (report.skipped[why] ?? 0) + 1);
  const models = new Set<string>();
  const todo = opts.receipts.filter((r) => {
    if (r.status === 'cancelled' && STREAMED.has(r.endpoint)) {
      // (a stream or a whole body: only its body says)
      const body = opts.requests.get(r.request_id);
      if (!body) return skip('no request body given'), false;
      if (!streamed(body)) return skip('status cancelled'), false;
    } else if (r.status !== 'completed') return skip(`status ${r.status}`), false;
    if (!REPLAYABLE.has(r.endpoint)) return skip(`endpoint ${r.endpoint}`), false;
    report.replayable++;
    models.add(r.model_sha256);
    if (r.model_sha256 !== modelSha) return skip('another model file'), false;
    if (!opts.requests.has(r.request_id)) return skip('no request body given'), false;
    return true;
  });
  report.receipt_models = [...models];
  if (todo.length === 0) return report;
  // (node-llama-cpp loaded only when there is something to replay: `audit` alone starts fast)
  const { LlamaEmbeddedAdapter } = await import('../../adapters/llama-embedded.ts');
  // On the device the receipts name: answers computed on a CPU are replayed on the CPU, even on a
  // host with a GPU (floating point differs between them); others on the GPU when there is one.
  const onCpu = todo.every((r) => r.runtime.version.endsWith('/cpu'));
  // probe: what llama.cpp aborts on is refused, as at the node's start, instead of killing the audit.
  const adapter = new LlamaEmbeddedAdapter({ modelPath: opts.modelPath, modelSha256: modelSha, gpu: onCpu ? false : 'auto', probe: opts.probeTimeoutMs !== undefined ? { timeoutMs: opts.probeTimeoutMs } : {}, ...(opts.contextLength ? { contextLength: opts.contextLength } : {}) });
  await adapter.start();
  // Throwaway keys: replay reproduces response bytes; it signs nothing that counts.
  const node = crypto.randomBytes(32);
  const market = crypto.randomBytes(32);
  const nodeId = toHex(ed25519PublicKey(node));
  const marketId = toHex(ed25519PublicKey(market));
  let dir: string | undefined;
  let log: ReceiptLog | undefined;
  let db: Database.Database | undefined;
  try {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'seller-node-replay-'));
    log = ReceiptLog.open({ path: path.join(dir, 'r.db'), seed: node, threads: 0, checkpointIntervalMs: 0 });
    db = new Database(':memory:');
    for (const r of todo) {
      const body = opts.requests.get(r.request_id)!;
      const bodySha = sha256Hex(body);
      if (bodySha !== r.request_sha256) {
        report.mismatches.push({ seq: r.seq, request_id: r.request_id, reason: BODY_MISMATCH });
        continue;
      }
      const served = { id: r.model, adapter, admission: new Admission({ slots: 1, queue: 0 }), quantization: r.quantization, tokensPerSecond: Number.MAX_SAFE_INTEGER, rates: ratesFromWire(r.price.rates) };
      const service = new InferService({
        log,
        gate: new TicketGate({ db, marketplaceKeys: [{ publicKey: marketId }], providerId: nodeId, now: () => r.started_at }),
        models: new Map([[r.model, served]]),
        priceVersion: r.price.version,
        tier: r.attestation.tier,
        now: () => r.started_at,
        streamWindowMs: 0,
      });
      const ticket = signTicket(
        { v: 1, ticket_id: `replay-${r.seq}-${report.replayed}`, request_id: r.request_id, provider: nodeId, account: 'replay', endpoint: r.endpoint, model: r.model, price_version: r.price.version, max_cost_micro_usd: r.hold_micro_usd, body_sha256: bodySha, routing: {}, issued_at: r.started_at - 1, expires_at: r.started_at + 60_000 },
        { keyid: marketId, seed: market },
      );
      const hash = crypto.createHash('sha256');
      /** Where a cancelled stream could have been cut: before any write, then after each, the hash so far and the tokens written. */
      const cuts = r.status === 'cancelled' ? [{ sha: hash.copy().digest('hex'), tokens: 0 }] : undefined;
      let status = 0;
      let trailer: Record<string, unknown> = {};
      await service.handle(
        { head: { endpoint: r.endpoint, ticket }, body, signal: new AbortController().signal },
        {
          head: async (h) => void (status = h.status),
          data: async (b, o) => {
            hash.update(b);
            cuts?.push({ sha: hash.copy().digest('hex'), tokens: cuts.at(-1)!.tokens + (o?.tokens ?? 0) });
          },
          trailer: async (t) => void (trailer = t),
        },
      );
      report.replayed++;
      const got = hash.digest('hex');
      const code = (trailer.error as { code?: unknown } | undefined)?.code;
      if (status !== 200) report.mismatches.push({ seq: r.seq, request_id: r.request_id, reason: `replay answered ${status} ${JSON.stringify(trailer.error ?? {})}`, ...(typeof code === 'string' ? { error_code: code } : {}) });
      else if (cuts) {
        const cut = cuts.find((c) => c.sha === r.response_sha256);
        if (!cut) report.mismatches.push({ seq: r.seq, request_id: r.request_id, reason: `cancelled: no point of the replayed stream hashes to response_sha256 ${r.response_sha256}` });
        else if (cut.tokens !== r.usage.output_tokens) {
          const reason = `cancelled: the bytes response_sha256 names carry ${cut.tokens} output tokens, the receipt bills ${r.usage.output_tokens}`;
          report.mismatches.push({ seq: r.seq, request_id: r.request_id, reason, output_tokens: { receipt: r.usage.output_tokens, replay: cut.tokens } });
        } else report.matched++;
      } else if (got !== r.response_sha256) {
        const replayOut = (trailer.usage as { output_tokens?: unknown } | undefined)?.output_tokens;
        const tokens = typeof replayOut === 'number' && replayOut !== r.usage.output_tokens ? { receipt: r.usage.output_tokens, replay: replayOut } : undefined;
        const reason = `response_sha256 is ${r.response_sha256}, replay gives ${got}` + (tokens ? ` (${tokens.replay} output tokens, the receipt ${tokens.receipt})` : '');
        report.mismatches.push({ seq: r.seq, request_id: r.request_id, reason, ...(tokens ? { output_tokens: tokens } : {}) });
      }
      else report.matched++;
    }
  } finally {
    // Whatever was opened before a failure is released, the model last; a step that fails does
    // not keep the ones after it from running.
    try {
      await log?.close();
    } finally {
      try {
        db?.close();
      } finally {
        try {
          await adapter.stop();
        } finally {
          if (dir) fs.rmSync(dir, { recursive: true, force: true });
        }
      }
    }
  }
  return report;
}

/** Whether a request body asks for a stream (a body that is not a JSON object does not). */
function streamed(body: Uint8Array): boolean {
  try {
    const v = JSON.parse(Buffer.from(body).toString('utf8')) as unknown;
    return typeof v === 'object' && v !== null && (v as { stream?: unknown }).stream === true;
  } catch {
    return false;
  }
}

/** Reads a requests file: {"request_id", "body": base64} per line. Throws naming the line. */
export function readRequestsFile(file: string): Map<string, Uint8Array> {
  const out = new Map<string, Uint8Array>();
  // (a V8 string holds at most 2^29 characters)
  const lines = readTextFile(file, { maxBytes: (1 << 29) - 24, pipes: true }).split('\n');
  lines.forEach((line, i) => {
    if (!line.trim()) return;
    let v: { request_id?: unknown; body?: unknown };
    try {
      v = JSON.parse(line) as typeof v;
    } catch {
      throw new Error(`${file} line ${i + 1}: not JSON`);
    }
    const body = typeof v.body === 'string' ? fromBase64(v.body) : undefined;
    if (typeof v.request_id !== 'string' || !body) throw new Error(`${file} line ${i + 1}: expected {"request_id": string, "body": base64}`);
    out.set(v.request_id, body);
  });
  return out;
}
