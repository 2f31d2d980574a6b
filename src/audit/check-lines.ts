// The per-receipt part of an audit, run in worker threads on raw chunks of receipts.jsonl: split
// the lines, verify each on its own and its price against the signed price lists, and reduce it
// to what the chain check needs, packed into a few arrays so a chunk of thousands of receipts
// crosses back to the main thread cheaply. A pure function of its input, so chunks run in any order.
import { fromUtf8 } from '../../attestation/bytes.ts';
import { fail, type VerifyError } from '../../attestation/result.ts';
import { PriceBook, type PricedVersion } from '../../attestation/price-list.ts';
import { peekSeq, verifyReceipt } from '../../attestation/receipt-verify.ts';

export interface CheckTask {
  provider: string;
  /** Whole lines, each ending in "\n" (the last may lack it at the end of the file). */
  bytes: Uint8Array;
  /** The provider's verified price lists: every receipt's price must be its list's. */
  prices: readonly PricedVersion[];
}

export interface CheckedChunk {
  count: number;
  /** Per line; for a failed line, the seq it claims (if readable) or "". */
  seqs: string[];
  prevs: string[];
  payloadHashes: string[];
  /** 32 bytes a line (zeros for a failed line). */
  leaves: Uint8Array;
  costs: string[];
  holds: string[];
  statuses: string[];
  ticketIds: string[];
  /** Failed lines by index in the chunk. */
  failures: Record<number, VerifyError>;
}


export function checkChunk(task: CheckTask): CheckedChunk {
  const { bytes, provider } = task;
  // A few entries a task (one per model and price version): rebuilt here, cheaper than any cache.
  const prices = new PriceBook(task.prices);
  const out: CheckedChunk = { count: 0, seqs: [], prevs: [], payloadHashes: [], leaves: new Uint8Array(0), costs: [], holds: [], statuses: [], ticketIds: [], failures: {} };
  const leaves: Uint8Array[] = [];
  let start = 0;
  while (start < bytes.length) {
    let end = bytes.indexOf(10, start);
    if (end === -1) end = bytes.length;
    // Strict (fromUtf8): a line's exact bytes are its Merkle leaf, so bytes that are not UTF-8 are not a
    // receipt (a lenient decoder would read two different files as one log).
    const text = fromUtf8(bytes.subarray(start, end));
    start = end + 1;
    const i = out.count++;
    const r = text === undefined ? fail('envelope_not_json', 'the line is not valid UTF-8') : verifyReceipt(text, { provider, chain: true });
    const error: VerifyError | undefined = r.ok ? prices.check(r.value.payload) : r.error;
    if (!r.ok || error) {
      // (a receipt that did not verify always has its error)
      out.failures[i] = error!;
      out.seqs.push(error!.seq ?? (r.ok ? r.value.payload.seq : text === undefined ? undefined : peekSeq(text)) ?? '');
      out.prevs.push('');
      out.payloadHashes.push('');
      out.costs.push('0');
      out.holds.push('0');
      out.statuses.push('');
      out.ticketIds.push('');
      leaves.push(new Uint8Array(32));
      continue;
    }
    const p = r.value.payload;
    out.seqs.push(p.seq);
    out.prevs.push(p.prev);
    out.payloadHashes.push(r.value.payloadSha256!);
    out.costs.push(p.cost_micro_usd);
    out.holds.push(p.hold_micro_usd);
    out.statuses.push(p.status);
    out.ticketIds.push(p.ticket_id);
    leaves.push(r.value.leafHash!);
  }
  out.leaves = new Uint8Array(out.count * 32);
  leaves.forEach((l, i) => out.leaves.set(l, i * 32));
  return out;
}
