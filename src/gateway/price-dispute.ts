// A receipt whose rates are not the ones the marketplace stated with the ticket: one of the two
// misstates the provider's prices. The provider's own signed price list of that version decides
// (asked of the node over /service/log/1.0.0): when it has the receipt's rates, the receipt bills
// what the provider signed and the marketplace is the one at fault.
import { verifyPriceList } from '../../attestation/price-list.ts';
import { ratesFromWire, ratesMatch, type WireRates } from '../../attestation/receipt.ts';
import type { Host } from '../p2p/host.ts';
import { LOG_PROTOCOL } from '../p2p/log-protocol.ts';
import { readResponse, request as p2pRequest } from '../p2p/request-stream.ts';
import type { Paid } from './tickets.ts';

export interface DisputedRates {
  version: string;
  model: string;
  /** What the receipt bills at. */
  receipt: WireRates;
  /** What the marketplace said the version's rates are. */
  market: WireRates;
}

/** Whether the provider's signed price list of the disputed version has the receipt's rates for its model (false when it cannot be had). */
export async function providerListBacksReceipt(host: Host, p: Pick<Paid, 'provider' | 'target'>, d: DisputedRates, timeoutMs = 3000): Promise<boolean> {
  try {
    const r = await readResponse(await p2pRequest(host, p.target, LOG_PROTOCOL, { op: 'price_list', version: d.version }, undefined, { signal: AbortSignal.timeout(timeoutMs) }));
    if (r.head.status !== 200) return false;
    const list = (JSON.parse(Buffer.from(r.body).toString('utf8')) as { price_list?: unknown }).price_list;
    const v = verifyPriceList(list as never, { provider: p.provider });
    if (!v.ok || v.value.version !== d.version) return false;
    const entry = v.value.models.find((m) => m.model === d.model);
    return entry !== undefined && ratesMatch(d.receipt, ratesFromWire(entry));
  } catch {
    return false;
  }
}
