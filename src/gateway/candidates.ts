// Which providers the gateway may ask for a free request (tokenize, count_tokens, estimates): the
// marketplace's live providers of the model that meet the routing controls its list can show.
import { quantizationBucket } from '../dispatch/routing.ts';
import { GatewayError } from './errors.ts';
import type { ProviderEntry } from './market-client.ts';
import type { RoutingControls } from './routing-headers.ts';

export interface Candidate {
  provider: ProviderEntry;
  /** The model's context length at that provider, when listed. */
  context: number | undefined;
}

/** Providers that list the model and meet the routing controls the list can show, preferred first. */
export function candidates(providers: ProviderEntry[], model: string, controls: RoutingControls): Candidate[] {
  const known = providers.filter((p) => p.models.some((m) => m.id === model));
  if (known.length === 0) throw new GatewayError(404, 'model_not_found', `no provider serves model "${model.slice(0, 256)}"`);
  const serving = known.filter((p) => p.live !== false && p.accepting !== false);
  const r = controls.routing;
  let fit = serving
    .map((p) => ({ provider: p, model: p.models.find((m) => m.id === model)! }))
    .filter(({ provider: p }) => r.min_attestation_tier === undefined || p.attestation_tier === undefined || p.attestation_tier >= r.min_attestation_tier)
    .filter(({ model: m }) => (r.min_context === undefined || (m.context ?? 0) >= r.min_context) && (r.quantization === undefined || (m.quantization !== undefined && quantizationBucket(m.quantization) === r.quantization)) && (r.min_tokens_per_second === undefined || (m.tokens_per_second ?? 0) >= r.min_tokens_per_second));
  const preferred = controls.preferredProviders;
  if (preferred) fit = fit.filter((c) => preferred.includes(c.provider.provider)).sort((a, b) => preferred.indexOf(a.provider.provider) - preferred.indexOf(b.provider.provider));
  if (fit.length === 0) throw new GatewayError(503, 'no_provider', `no live provider of "${model.slice(0, 256)}" meets the routing controls`);
  return fit.map((c) => ({ provider: c.provider, context: c.model.context }));
}
