// The gateway's settled request records (GET /v1/requests/{id}): one per request it took a ticket
// for, kept in memory (the oldest dropped first when full). A record is `in_progress` until the
// request ends; then it holds the verified receipt, its usage and cost, and whether the
// marketplace accepted the receipt.
import { formatUsd } from '../../attestation/money.ts';
import type { ReceiptPayload } from '../../attestation/receipt.ts';
import type { DsseEnvelope } from '../../attestation/dsse.ts';

export type RecordStatus =
  /** The request is running. */
  | 'in_progress'
  /** Receipt statuses. */
  | 'completed'
  | 'cancelled'
  | 'failed'
  /** Refused (by the marketplace or the node) before any work: no receipt, nothing charged. */
  | 'refused'
  /** The buyer left before any work was done (and the node wrote no receipt). */
  | 'abandoned'
  /** The provider's answer or receipt did not verify; its receipt was not settled. */
  | 'bad_provider_response';

export interface RequestRecord {
  request_id: string;
  status: RecordStatus;
  endpoint: string;
  model: string;
  provider: string | null;
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
  /** USD, six decimals, exact. */
  cost: string | null;
  cost_micro_usd: string | null;
  /** The verified receipt envelope. */
  receipt: DsseEnvelope | null;
  /** Whether the marketplace accepted the receipt (POST /v1/receipts). */
  settled: boolean;
  settlement_error?: { code: string; message: string };
  error?: { code: string; message: string };
  created_at: number;
  finished_at: number | null;
}

export class RequestRecords {
  private readonly map = new Map<string, RequestRecord>();
  private readonly limit: number;

  constructor(limit = 10_000) {
    this.limit = limit;
  }

  get(id: string): RequestRecord | undefined {
    return this.map.get(id);
  }

  get size(): number {
    return this.map.size;
  }

  begin(r: { request_id: string; endpoint: string; model: string; provider: string | null }): RequestRecord {
    const rec: RequestRecord = { ...r, status: 'in_progress', usage: null, cost: null, cost_micro_usd: null, receipt: null, settled: false, created_at: Date.now(), finished_at: null };
    this.map.delete(r.request_id);
    this.map.set(r.request_id, rec);
    while (this.map.size > this.limit) this.map.delete(this.map.keys().next().value!);
    return rec;
  }

  /** The request ended with a verified receipt. */
  settle(id: string, receipt: { payload: ReceiptPayload; envelope: DsseEnvelope }, settlement: { ok: true } | { ok: false; code: string; message: string }): RequestRecord | undefined {
    const rec = this.map.get(id);
    if (!rec) return undefined;
    const p = receipt.payload;
    rec.status = p.status;
    rec.provider = p.provider;
    rec.usage = { prompt_tokens: p.usage.input_tokens, completion_tokens: p.usage.output_tokens, total_tokens: p.usage.input_tokens + p.usage.output_tokens };
    rec.cost_micro_usd = p.cost_micro_usd;
    rec.cost = formatUsd(BigInt(p.cost_micro_usd));
    rec.receipt = receipt.envelope;
    rec.settled = settlement.ok;
    if (!settlement.ok) rec.settlement_error = { code: settlement.code, message: settlement.message };
    rec.finished_at = Date.now();
    return rec;
  }

  /** `id` was answered by an earlier request (an idempotent retry): it shows that request's record. */
  alias(id: string, target: string): void {
    const rec = this.map.get(target);
    if (!rec || id === target) return;
    this.map.delete(id);
    this.map.set(id, rec);
  }

  /** The request ended without a receipt the gateway accepts. */
  fail(id: string, status: Exclude<RecordStatus, 'in_progress' | 'completed' | 'cancelled' | 'failed'> | 'failed', error: { code: string; message: string }): RequestRecord | undefined {
    const rec = this.map.get(id);
    if (!rec) return undefined;
    rec.status = status;
    rec.error = error;
    rec.finished_at = Date.now();
    return rec;
  }
}
