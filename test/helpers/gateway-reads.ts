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

/** Whether the market collected a receipt for the request id. */
export async function marketHas(marketUrl: string, id: string): Promise<boolean> {
  const r = await fetch(`${marketUrl}/v1/receipts/${encodeURIComponent(id)}`);
  await r.arrayBuffer();
  return r.status === 200;
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
