// Signed price lists (design.md §Money): what each model costs, under a version that tickets and
// receipts name. The version is derived from the prices themselves, so the same prices always
// carry the same version and a changed price always carries a new one.
import { utf8 } from './bytes.ts';
import { canonicalize } from './canonical-json.ts';
import { signEnvelope, type DsseEnvelope } from './dsse.ts';
import * as f from './fields.ts';
import { sha256Hex } from './hash.ts';
import type { VerifyError, VerifyResult } from './result.ts';
import { verifyProviderSigned } from './signed-payload.ts';
import type { WireRates } from './receipt.ts';

export const PRICELIST_PAYLOAD_TYPE = 'application/vnd.service.pricelist.v1+json';

export interface PriceListEntry extends WireRates {
  model: string;
}

export interface PriceListPayload {
  v: 1;
  provider: string;
  version: string;
  issued_at: number;
  models: PriceListEntry[];
}

/** Whether `v` is written as a price version is ("p-" and 32 lowercase hex digits). */
export function isPriceVersion(v: unknown): v is string {
  return typeof v === 'string' && /^p-[0-9a-f]{32}$/.test(v);
}

/**
 * "p-" + 32 hex (128 bits) of SHA-256 over the canonical model prices. A version names its prices
 * wherever a receipt cites it, so two lists must never share one: with 64 bits (until session 23)
 * a provider found two lists of one version in minutes on two cores (a birthday search, 2^32
 * hashes), and an export carrying the other list audited receipts at 100 times the prices it had
 * registered (s23 h3). A 2^64 search is out of reach.
 */
export function priceVersion(models: readonly PriceListEntry[]): string {
  return 'p-' + sha256Hex(canonicalize(sortedEntries(models))).slice(0, 32);
}

function sortedEntries(models: readonly PriceListEntry[]): PriceListEntry[] {
  return [...models].sort((a, b) => (a.model < b.model ? -1 : a.model > b.model ? 1 : 0));
}

export function validatePriceList(value: unknown): PriceListPayload {
  const p = f.object(value, '');
  f.keys(p, '', ['v', 'provider', 'version', 'issued_at', 'models']);
  if (p.v !== 1) throw new f.FieldError('v', 'expected 1');
  f.hex32(p.provider, 'provider');
  f.string(p.version, 'version', 64, /^[A-Za-z0-9._:-]+$/);
  f.uint(p.issued_at, 'issued_at');
  if (!Array.isArray(p.models) || p.models.length === 0 || p.models.length > 1000) throw new f.FieldError('models', 'expected 1 to 1000 entries');
  const seen = new Set<string>();
  p.models.forEach((m, i) => {
    const where = `models[${i}]`;
    const e = f.object(m, where);
    f.keys(e, where, ['model', 'input_per_mtok', 'output_per_mtok'], ['per_unit']);
    const id = f.string(e.model, `${where}.model`, 256);
    if (seen.has(id)) throw new f.FieldError(`${where}.model`, `"${id}" is listed twice`);
    seen.add(id);
    f.micro(e.input_per_mtok, `${where}.input_per_mtok`);
    f.micro(e.output_per_mtok, `${where}.output_per_mtok`);
    if (e.per_unit !== undefined) f.record(e.per_unit, `${where}.per_unit`, f.micro);
  });
  const payload = p as unknown as PriceListPayload;
  if (payload.version !== priceVersion(payload.models)) throw new f.FieldError('version', 'is not the version of these prices');
  return payload;
}

export function signPriceList(seed: Uint8Array, provider: string, models: readonly PriceListEntry[], issuedAt = Date.now()): { payload: PriceListPayload; envelope: DsseEnvelope } {
  const sorted = sortedEntries(models);
  const payload: PriceListPayload = { v: 1, provider, version: priceVersion(sorted), issued_at: issuedAt, models: sorted };
  validatePriceList(payload);
  return { payload, envelope: signEnvelope(PRICELIST_PAYLOAD_TYPE, utf8(canonicalize(payload)), { keyid: provider, seed }) };
}

/** Verifies a provider's signed price list. Never throws. */
export function verifyPriceList(envelope: DsseEnvelope | string, opts: { provider: string }): VerifyResult<PriceListPayload> {
  return verifyProviderSigned(envelope, opts, PRICELIST_PAYLOAD_TYPE, validatePriceList, 'price list');
}

/** What a price list contributes to a PriceBook: plain data, so it crosses to worker threads as is. */
export interface PricedVersion {
  version: string;
  models: readonly PriceListEntry[];
}

function wireRates(e: PriceListEntry): WireRates {
  return { input_per_mtok: e.input_per_mtok, output_per_mtok: e.output_per_mtok, ...(e.per_unit !== undefined ? { per_unit: e.per_unit } : {}) };
}

function modelRates(list: PricedVersion): Map<string, string> {
  const models = new Map<string, string>();
  for (const e of list.models) models.set(e.model, canonicalize(wireRates(e)));
  return models;
}

/**
 * The rates of every (price version, model) of a provider's verified price lists, in canonical JSON
 * (as ratesMatch compares rates): a receipt is checked with two map lookups and one canonicalize
 * of its rates (~0.2 µs, against ~100 µs of its signature). Build it only from lists
 * verifyPriceList accepted.
 */
export class PriceBook {
  private readonly byVersion = new Map<string, Map<string, string>>();

  constructor(lists: Iterable<PricedVersion> = []) {
    for (const l of lists) this.add(l);
  }

  /** A version's models. A version names its prices (priceVersion), so a list added twice changes nothing. */
  add(list: PricedVersion): void {
    this.byVersion.set(list.version, modelRates(list));
  }

  /** Whether the book holds another list of `list`'s version, with other prices (two lists of one version must never both be believed). */
  conflicts(list: PricedVersion): boolean {
    const held = this.byVersion.get(list.version);
    if (!held) return false;
    const rates = modelRates(list);
    return held.size !== rates.size || [...rates].some(([model, r]) => held.get(model) !== r);
  }

  /**
   * Undefined when a (verified) receipt's price is exactly its model's in the list of the version
   * it cites; else why not.
   */
  check(receipt: { model: string; price: { version: string; rates: WireRates } }): VerifyError | undefined {
    const { version, rates } = receipt.price;
    const models = this.byVersion.get(version);
    if (!models) return { code: 'price_list_missing', message: `the receipt cites price version ${version}, and there is no price list of that version`, field: 'price.version' };
    const listed = models.get(receipt.model);
    if (listed === undefined) return { code: 'price_mismatch', message: `model ${receipt.model} is not in price list ${version}`, field: 'model' };
    const cited = canonicalize(rates);
    if (cited === listed) return undefined;
    return { code: 'price_mismatch', message: `rates ${cited} are not those of ${receipt.model} in price list ${version} (${listed})`, field: 'price.rates' };
  }
}
