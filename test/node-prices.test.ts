// The node keeps every signed price list it has used in its data dir (prices/<version>.json), so
// that `log export` can give auditors the list of every version its receipts cite; a file there
// that is not this node's list of that version is never replaced, and the node refuses to start.
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { ratesToWire } from '../attestation/receipt.ts';
import { signPriceList, verifyPriceList } from '../attestation/price-list.ts';
import { parseConfig } from '../src/config.ts';
import { PriceListConflictError, readPriceLists, savePriceList } from '../src/data-dir.ts';
import { loadKeyFile } from '../src/identity.ts';
import { NodeStartError, startNode } from '../src/node.ts';
import { TEST_RATES } from './helpers/serving.ts';
import { startTinyNode, tinyNodeConfigYaml } from './helpers/node-config.ts';
import { providerIdOf, randomSeed, removeTemp, tempDir } from './helpers/tamper-log.ts';

const temps: string[] = [];
afterAll(() => {
  for (const t of temps) removeTemp(t);
});
function temp(): string {
  const t = tempDir('node-prices-');
  temps.push(t);
  return t;
}

const MODELS = [{ model: 'a/model', input_per_mtok: '150000', output_per_mtok: '600000' }];

describe('savePriceList', () => {
  test('writes prices/<version>.json (0644), the signed envelope as signed; the same prices signed again later are kept, not rewritten', () => {
    const dir = temp();
    const seed = randomSeed();
    const id = providerIdOf(seed);
    const first = signPriceList(seed, id, MODELS, 1_700_000_000_000);
    expect(savePriceList(dir, first)).toBe('saved');
    const file = path.join(dir, 'prices', `${first.payload.version}.json`);
    expect(fs.statSync(file).mode & 0o777).toBe(0o644);
    const text = fs.readFileSync(file, 'utf8');
    expect(JSON.parse(text)).toEqual(first.envelope);
    expect(verifyPriceList(text, { provider: id })).toMatchObject({ ok: true, value: first.payload });
    // A restart signs the same prices with a new issued_at: the same version, and the file stays.
    const later = signPriceList(seed, id, MODELS, 1_800_000_000_000);
    expect(later.payload.version).toBe(first.payload.version);
    expect(savePriceList(dir, later)).toBe('kept');
    expect(fs.readFileSync(file, 'utf8')).toBe(text);
    expect(readPriceLists(dir)).toEqual([{ version: first.payload.version, text }]);
    expect(fs.readdirSync(path.join(dir, 'prices'))).toEqual([`${first.payload.version}.json`]);
  });

  test('a file that is not this provider\'s list of that version is refused, naming it, and left as it is', () => {
    const dir = temp();
    const seed = randomSeed();
    const mine = signPriceList(seed, providerIdOf(seed), MODELS);
    const other = randomSeed();
    expect(savePriceList(dir, signPriceList(other, providerIdOf(other), MODELS))).toBe('saved');
    const file = path.join(dir, 'prices', `${mine.payload.version}.json`);
    const before = fs.readFileSync(file, 'utf8');
    expect(() => savePriceList(dir, mine)).toThrow(PriceListConflictError);
    expect(() => savePriceList(dir, mine)).toThrow(new RegExp(`prices/${mine.payload.version}\\.json is not this node's price list of version ${mine.payload.version} \\(unknown_key: `));
    expect(fs.readFileSync(file, 'utf8')).toBe(before);
    // This provider's own list, but of other prices (another version), filed under this version.
    const otherPrices = signPriceList(seed, providerIdOf(seed), [{ ...MODELS[0]!, input_per_mtok: '1' }]);
    fs.writeFileSync(file, JSON.stringify(otherPrices.envelope));
    expect(() => savePriceList(dir, mine)).toThrow(`(it is the list of version ${otherPrices.payload.version})`);
    fs.writeFileSync(file, '{"truncated');
    expect(() => savePriceList(dir, mine)).toThrow(/envelope_not_json/);
    expect(fs.readFileSync(file, 'utf8')).toBe('{"truncated');
  });

  test('a data dir without prices/ has no lists', () => {
    expect(readPriceLists(temp())).toEqual([]);
  });
});

describe('the node', () => {
  test('keeps its signed price list before serving, keeps it across restarts, and refuses to start over another list of its version', async () => {
    const home = temp();
    const c = { publicKey: providerIdOf(randomSeed()) };
    const node = await startTinyNode(home, c);
    const version = node.priceVersion;
    await node.stop();
    const file = path.join(home, 'data', 'prices', `${version}.json`);
    const text = fs.readFileSync(file, 'utf8');
    const id = loadKeyFile(path.join(home, 'node.key')).providerId;
    expect(verifyPriceList(text, { provider: id })).toMatchObject({ ok: true, value: { version, models: [{ model: 'tiny/llama', ...ratesToWire(TEST_RATES) }] } });

    const config = () => parseConfig(tinyNodeConfigYaml(c), home);
    const again = await startNode(config());
    expect(again.priceVersion).toBe(version);
    await again.stop();
    expect(fs.readFileSync(file, 'utf8')).toBe(text);

    const other = randomSeed();
    const foreign = JSON.stringify(signPriceList(other, providerIdOf(other), [{ model: 'tiny/llama', ...ratesToWire(TEST_RATES) }]).envelope);
    fs.writeFileSync(file, foreign);
    const refused = startNode(config());
    await expect(refused).rejects.toThrow(NodeStartError);
    await expect(refused).rejects.toThrow(new RegExp(`^data_dir: .*prices/${version}\\.json is not this node's price list of version ${version} \\(unknown_key: `));
    expect(fs.readFileSync(file, 'utf8')).toBe(foreign);
  });
});
