// Which providers the gateway may ask for a free request (tokenize, count_tokens, estimates): the
// marketplace's live providers of the model whose listed offer meets the routing controls, judged
// by the node's own checkOffer (src/dispatch/routing.ts) so that the gateway, the marketplace and
// the node agree on what a control means.
import type { Rates } from '../../attestation/money.ts';
import { ATTESTATION_TIERS, ratesFromWire } from '../../attestation/receipt.ts';
import type { TicketRouting } from '../../attestation/ticket.ts';
import { checkOffer, NOT_ACCEPTING, quantizationBucket, type Refusal } from '../dispatch/routing.ts';
import { modelServes } from '../market/registration-payload.ts';
import { GatewayError } from './errors.ts';
import { acceptsModel, type ProviderEntry, type ProviderModel } from './market-client.ts';
import type { RoutingControls } from './routing-headers.ts';

export interface Candidate {
  provider: ProviderEntry;
  /** The model's context length at that provider, when listed. */
  context: number | undefined;
}

const unlisted = (what: string): Refusal => ({ status: 503, code: 'routing_unsatisfied', message: `the listing shows no ${what}` });

/**
 * Why the listed offer of a model cannot take a request under these controls, or undefined when it
 * can. What the listing leaves out cannot meet a control that asks for it (a minimum tier without
 * a listed tier, a price ceiling without listed rates); it is no reason to refuse otherwise.
 */
export function listingUnmet(entry: ProviderEntry, m: ProviderModel, routing: TicketRouting): Refusal | undefined {
  const tier = ATTESTATION_TIERS.find((t) => t === entry.attestation_tier);
  if (routing.min_attestation_tier !== undefined && tier === undefined) return unlisted('attestation tier');
  const ceilings = routing.max_input_price_micro_usd_per_mtok !== undefined || routing.max_output_price_micro_usd_per_mtok !== undefined || routing.max_request_price_micro_usd !== undefined;
  let rates: Rates = { input_per_mtok: 0n, output_per_mtok: 0n };
  const wire = entry.rates?.[m.id];
  if (ceilings) {
    if (!wire) return unlisted(`price for "${m.id.slice(0, 256)}"`);
    try {
      rates = ratesFromWire(wire);
    } catch {
      return unlisted(`valid price for "${m.id.slice(0, 256)}"`);
    }
  }
  const offer = { contextLength: m.context ?? 0, quantization: m.quantization === undefined ? '' : quantizationBucket(m.quantization), tokensPerSecond: m.tokens_per_second ?? 0, tier: tier ?? 'T1', rates };
  return checkOffer(offer, routing);
}

/** Live listings of the model, each with why it cannot take a request under `routing` (undefined: it can). */
function judged(listing: readonly ProviderEntry[], model: string, routing: TicketRouting): { provider: ProviderEntry; model: ProviderModel; why: Refusal | undefined }[] {
  return listing.flatMap((p) => {
    const m = p.live === false ? undefined : p.models.find((x) => x.id === model);
    // As the marketplace: a provider that is stopping is a reason of its own, not a price.
    return m ? [{ provider: p, model: m, why: !acceptsModel(p, model) ? NOT_ACCEPTING : listingUnmet(p, m, routing) }] : [];
  });
}

/**
 * Providers that list the model and whose listed offer meets the routing controls, preferred first.
 * None: 404 model_not_found when nobody lists the model; 403 price_ceiling_exceeded when every live
 * provider is refused for its price alone (as the marketplace refuses a ticket); else 503 no_provider.
 */
export function candidates(providers: ProviderEntry[], model: string, controls: RoutingControls): Candidate[] {
  if (!providers.some((p) => p.models.some((m) => m.id === model))) throw new GatewayError(404, 'model_not_found', `no provider serves model "${model.slice(0, 256)}"`);
  const preferred = controls.preferredProviders;
  const serving = judged(providers, model, controls.routing).filter((c) => !preferred || preferred.includes(c.provider.provider));
  const reasons = serving.flatMap((c) => (c.why ? [c.why] : []));
  let fit = serving.filter((c) => !c.why);
  if (preferred) fit = fit.sort((a, b) => preferred.indexOf(a.provider.provider) - preferred.indexOf(b.provider.provider));
  if (fit.length === 0) {
    if (reasons.length > 0 && reasons.every((r) => r.code === 'price_ceiling_exceeded')) throw new GatewayError(403, 'price_ceiling_exceeded', `every provider of "${model.slice(0, 256)}" is above the price ceiling: ${reasons[0]!.message}`);
    throw new GatewayError(503, 'no_provider', `no live provider of "${model.slice(0, 256)}" meets the routing controls${reasons[0] ? `: ${reasons[0].message}` : ''}`);
  }
  return fit.map((c) => ({ provider: c.provider, context: c.model.context }));
}

/**
 * Live providers of a model that sell it for `endpoint`, take requests and whose listed offer meets
 * the routing controls, in the market's order, but for `except`: where a hedge's second half or a failover may go. (A
 * provider the listing already rules out would only be refused by the marketplace, and a hedge
 * planned on it would take a half-cap ticket for nothing.)
 */
export function fitProvidersOf(listing: readonly ProviderEntry[], model: string, endpoint: string, routing: TicketRouting, except: readonly string[]): string[] {
  return judged(listing, model, routing)
    .filter((c) => !c.why && modelServes(c.model, endpoint) && !except.includes(c.provider.provider))
    .map((c) => c.provider.provider);
}

/** The providers whose listing has the model but does not sell it for `endpoint` (one without a chat template, for chat's). */
export function notSellingFor(listing: readonly ProviderEntry[], model: string, endpoint: string): Set<string> {
  return new Set(listing.filter((p) => p.models.some((m) => m.id === model && !modelServes(m, endpoint))).map((p) => p.provider));
}
