// /service/log/1.0.0: the node's receipt log, read-only, for the marketplace, buyers and auditors.
// Requests are a HEAD with `op`; answers are JSON in one DATA frame (or a C2SP tlog-proof bundle
// as text) and an empty trailer, or an error trailer with a code.
//   { op: "receipt", request_id }            → { receipts: [envelope line, …] }
//   { op: "checkpoint" }                     → { checkpoint: signed note | null, size }
//   { op: "inclusion", request_id, seq?, size? } → text/plain tlog-proof bundle (extra = the receipt)
//   { op: "consistency", size1, size2? }     → { size1, size2, proof: [base64 …], checkpoint }
//   { op: "price_list", version }            → { price_list: the node's signed price list of that version }
import { toBase64, utf8 } from '../../attestation/bytes.ts';
import { isPriceVersion } from '../../attestation/price-list.ts';
import { receiptProofBundle } from '../store/proof-bundle.ts';
import type { ReceiptLog } from '../store/receipt-log.ts';
import type { Host } from './host.ts';
import { handleRequests, type RequestServer } from './request-stream.ts';
import { OPEN_REQUEST_BYTES_BUDGET } from './request-server.ts';
import { errorBody } from '../service-error.ts';

export const LOG_PROTOCOL = '/service/log/1.0.0';

type Answer = { status: number; type: string; body: string } | { status: number; error: { code: string; message: string } };

const isSize = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/**
 * A seq or tree size as a JSON number or as a decimal string (how receipts carry `seq`, design.md:
 * integers that may pass 2^53 are strings); anything else is left as it was, to be refused.
 */
function sizeOf(v: unknown): unknown {
  if (typeof v !== 'string' || !/^(0|[1-9][0-9]{0,15})$/.test(v)) return v;
  const n = Number(v);
  return Number.isSafeInteger(n) ? n : v;
}

/** The node's signed price list of a version, as it keeps it (envelope JSON text), or undefined. */
export type PriceListLookup = (version: string) => string | undefined;

function answerLog(log: ReceiptLog, raw: Record<string, unknown>, priceList: PriceListLookup): Answer {
  const head: Record<string, unknown> = { ...raw, seq: sizeOf(raw.seq), size: sizeOf(raw.size), size1: sizeOf(raw.size1), size2: sizeOf(raw.size2) };
  const json = (v: unknown): Answer => ({ status: 200, type: 'application/json', body: JSON.stringify(v) });
  const bad = (code: string, message: string, status = 400): Answer => ({ status, ...errorBody(code, message) });
  switch (head.op) {
    case 'receipt': {
      if (typeof head.request_id !== 'string' || head.request_id.length === 0 || head.request_id.length > 128) return bad('invalid_request', 'request_id: expected 1 to 128 characters');
      const found = log.byRequestId(head.request_id);
      if (found.length === 0) return bad('not_found', 'no receipt for this request id', 404);
      return json({ receipts: found.map((r) => r.line) });
    }
    case 'checkpoint': {
      const cp = log.latestCheckpoint();
      return json({ checkpoint: cp?.note ?? null, size: cp?.size ?? 0 });
    }
    case 'inclusion': {
      // By request id, as receipts are read: a receipt is for whoever knows its request, not for
      // anyone who counts seqs (s29 review: walking seq 0, 1, 2, … read every receipt, and a short
      // answer could be guessed against its response_sha256).
      if (typeof head.request_id !== 'string' || head.request_id.length === 0 || head.request_id.length > 128) return bad('invalid_request', 'request_id: expected the request id of the receipt to prove (1 to 128 characters)');
      if (head.seq !== undefined && !isSize(head.seq)) return bad('invalid_request', 'seq: expected a whole number');
      if (head.size !== undefined && (!isSize(head.size) || head.size < 1)) return bad('invalid_request', 'size: expected a whole number of at least 1');
      // Under the latest checkpoint, or under the stored one of `size` (a buyer who holds that note).
      const cp = head.size === undefined ? log.latestCheckpoint() : log.checkpointAt(head.size);
      if (!cp) return bad('not_found', head.size === undefined ? 'no signed checkpoint yet' : `no signed checkpoint of size ${head.size}`, 404);
      // The request's receipt under the checkpoint: the one at `seq` when given, else its last.
      const seqs = log.byRequestId(head.request_id).map((r) => r.seq);
      if (seqs.length === 0 || (head.seq !== undefined && !seqs.includes(head.seq))) return bad('not_found', 'no receipt for this request id', 404);
      const seq = head.seq ?? seqs.filter((s) => s < cp.size).at(-1) ?? seqs.at(-1)!;
      if (seq >= cp.size) return bad('not_found', head.size === undefined ? 'that receipt is not under a signed checkpoint yet' : `seq ${seq} is not under the checkpoint of size ${cp.size}`, 404);
      return { status: 200, type: 'text/plain', body: receiptProofBundle(log, seq, cp) };
    }
    case 'consistency': {
      const cp = log.latestCheckpoint();
      const size2 = head.size2 === undefined ? cp?.size : head.size2;
      if (!isSize(head.size1) || !isSize(size2) || head.size1 < 1 || head.size1 > size2) return bad('invalid_request', 'size1, size2: expected 1 ≤ size1 ≤ size2');
      if (!cp || size2 > cp.size) return bad('not_found', 'no signed checkpoint covers size2', 404);
      return json({ size1: head.size1, size2, proof: log.consistencyProof(head.size1, size2).map(toBase64), checkpoint: log.checkpointAt(size2)?.note ?? null });
    }
    case 'price_list': {
      // (Who holds a receipt can check its rates against the list its provider signed.)
      if (!isPriceVersion(head.version)) return bad('invalid_request', 'version: expected a price version (p- and 32 hex digits)');
      const text = priceList(head.version);
      if (text === undefined) return bad('not_found', `no price list of version ${head.version}`, 404);
      return { status: 200, type: 'application/json', body: `{"price_list":${text.trim()}}` };
    }
    default:
      return bad('invalid_request', 'op: expected receipt, checkpoint, inclusion, consistency or price_list');
  }
}

export function serveLog(host: Host, log: ReceiptLog, priceList: PriceListLookup): Promise<RequestServer> {
  return handleRequests(host, LOG_PROTOCOL, async (req, res) => {
    const a = answerLog(log, req.head, priceList);
    if ('error' in a) {
      await res.head({ status: a.status, headers: { 'content-type': 'application/json' } });
      await res.trailer({ error: a.error });
      return;
    }
    await res.head({ status: a.status, headers: { 'content-type': a.type } });
    await res.data(utf8(a.body));
    await res.trailer({});
  }, { maxBodyBytes: 64 << 10, budget: OPEN_REQUEST_BYTES_BUDGET }); // (the query is the HEAD: a body is never read, so none of size is taken; none paid for)
}
