// What gateway tests read back: a request's record (GET /v1/requests/{id}), the market's copy of
// receipts and totals, and the data lines of a relayed SSE stream.
import { expect } from 'vitest';
import type { RequestRecord } from '../../src/gateway/records.ts';
import { waitFor } from './wait.ts';

/** The request's record as GET /v1/requests/{id} answers it (it waits for a settlement under way). */
export async function gatewayRecord(gatewayUrl: string, id: string): Promise<RequestRecord> {
  const r = await fetch(`${gatewayUrl}/requests/${encodeURIComponent(id)}`);
  expect(r.status, `GET /v1/requests/${id}`).toBe(200);
  return (await r.json()) as RequestRecord;
}

/** The request's record once it has ended (no longer in_progress). A record the gateway does not have fails. */
export function endedRecord(gatewayUrl: string, id: string): Promise<RequestRecord> {
  return waitFor(`request ${id} to end`, async () => {
    const r = await gatewayRecord(gatewayUrl, id);
    return r.status !== 'in_progress' ? r : undefined;
  });
}

/** The request's record once its receipt is settled with the market. */
export function settledRecord(gatewayUrl: string, id: string): Promise<RequestRecord> {
  return waitFor(`request ${id} to settle`, async () => {
    const r = await gatewayRecord(gatewayUrl, id);
    return r.settled ? r : undefined;
  });
}

/** What the market collected for a request id: GET /v1/receipts/{id}. */
export interface MarketReceipt {
  status: string;
  provider: string;
  cost_micro_usd: string;
  /** The envelope line as collected. */
  receipt: string;
}

/** The market's receipt for a request id, or undefined when it has none (404). */
export async function marketReceipt(marketUrl: string, id: string): Promise<MarketReceipt | undefined> {
  const r = await fetch(`${marketUrl}/v1/receipts/${encodeURIComponent(id)}`);
  if (r.status === 404) {
    await r.arrayBuffer();
    return undefined;
  }
  expect(r.status, `GET /v1/receipts/${id}`).toBe(200);
  return (await r.json()) as MarketReceipt;
}

/** Whether the market collected a receipt for the request id. */
export async function marketHas(marketUrl: string, id: string): Promise<boolean> {
  return (await marketReceipt(marketUrl, id)) !== undefined;
}

/** A response's status and its error envelope's {code, message}. */
export async function errorOf(r: Response): Promise<readonly [number, { code: string; message: string }]> {
  return [r.status, ((await r.json()) as { error: { code: string; message: string } }).error] as const;
}

export interface MarketTotals {
  receipts: number;
  cost_micro_usd: string;
  by_provider: Record<string, { receipts: number; cost_micro_usd: string }>;
}

export async function marketTotals(marketUrl: string): Promise<MarketTotals> {
  return (await (await fetch(`${marketUrl}/v1/totals`)).json()) as MarketTotals;
}

/** Each SSE event's data line (the gateway's own error event included), for LF- or CRLF-framed events. */
export function sseData(text: string): string[] {
  return text
    .split(/\r?\n\r?\n/)
    .filter((e) => e.length > 0)
    .map((e) => e.split(/\r?\n/).find((l) => l.startsWith('data: '))?.slice('data: '.length) ?? '');
}
