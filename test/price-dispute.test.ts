// Who misstated a price version's rates: the gateway asks the provider's node for its signed price
// list of that version (/service/log/1.0.0, op price_list). Only a list that the provider signed,
// of exactly that version, with the receipt's rates for the model, puts the fault on the market;
// anything else (another key, another version, other rates, an unknown version, a node that cannot
// be reached or does not answer in time) leaves it on the provider. Real libp2p on loopback.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { toHex } from '../attestation/bytes.ts';
import { ed25519PublicKey } from '../attestation/ed25519.ts';
import { signPriceList, type PriceListEntry } from '../attestation/price-list.ts';
import { dialTarget } from '../src/gateway/dial-target.ts';
import { providerListBacksReceipt, type DisputedRates } from '../src/gateway/price-dispute.ts';
import { createHost, type Host } from '../src/p2p/host.ts';
import { LOG_PROTOCOL, serveLog } from '../src/p2p/log-protocol.ts';
import { handleRequests } from '../src/p2p/request-stream.ts';
import { ReceiptLog } from '../src/store/receipt-log.ts';

const seed = new Uint8Array(crypto.randomBytes(32));
const provider = toHex(ed25519PublicKey(seed));
const entries: PriceListEntry[] = [
  { model: 'tiny/llama', input_per_mtok: '150000', output_per_mtok: '600000' },
  { model: 'other/model', input_per_mtok: '1', output_per_mtok: '2' },
];
const signed = signPriceList(seed, provider, entries);
const version = signed.payload.version;
const receiptRates = { input_per_mtok: '150000', output_per_mtok: '600000' };
const disputed = (over: Partial<DisputedRates> = {}): DisputedRates => ({ version, model: 'tiny/llama', receipt: receiptRates, market: { input_per_mtok: '150000', output_per_mtok: '1' }, ...over });

let dir: string;
let log: ReceiptLog;
let node: Host;
let gateway: Host;
/** What the node's price-list lookup answers, per version (a test may swap it). */
let lists: Record<string, string> = {};
const target = () => dialTarget(provider, node.peerId.toString(), node.getMultiaddrs().map((m) => m.toString()));

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'price-dispute-'));
  log = ReceiptLog.open({ path: path.join(dir, 'r.db'), seed, threads: 0, checkpointIntervalMs: 0 });
  node = await createHost({ seed, listen: ['/ip4/127.0.0.1/tcp/0'] });
  gateway = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  await serveLog(node, log, (v) => lists[v]);
});

afterAll(async () => {
  await gateway.stop();
  await node.stop();
  await log.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe('providerListBacksReceipt: the provider\'s signed list decides whose fault disputed rates are', () => {
  test('the list of that version, signed by the provider, has the receipt\'s rates: the market misstated them', async () => {
    lists = { [version]: JSON.stringify(signed.envelope) };
    expect(await providerListBacksReceipt(gateway, { provider, target: target() }, disputed())).toBe(true);
  });

  test('the list has other rates for the model than the receipt bills: not backed', async () => {
    lists = { [version]: JSON.stringify(signed.envelope) };
    expect(await providerListBacksReceipt(gateway, { provider, target: target() }, disputed({ receipt: { input_per_mtok: '150000', output_per_mtok: '600001' } }))).toBe(false);
  });

  test('the list does not price the receipt\'s model: not backed', async () => {
    lists = { [version]: JSON.stringify(signed.envelope) };
    expect(await providerListBacksReceipt(gateway, { provider, target: target() }, disputed({ model: 'absent/model' }))).toBe(false);
  });

  test('the node has no list of that version (404): not backed', async () => {
    lists = {};
    expect(await providerListBacksReceipt(gateway, { provider, target: target() }, disputed())).toBe(false);
  });

  test('the node answers another version\'s list under the asked version: not backed', async () => {
    const other = signPriceList(seed, provider, [{ model: 'tiny/llama', input_per_mtok: '150000', output_per_mtok: '600000' }]);
    expect(other.payload.version).not.toBe(version);
    lists = { [version]: JSON.stringify(other.envelope) };
    expect(await providerListBacksReceipt(gateway, { provider, target: target() }, disputed())).toBe(false);
  });

  test('a list with the receipt\'s rates but signed by another key: not backed', async () => {
    const stranger = new Uint8Array(crypto.randomBytes(32));
    const forged = signPriceList(stranger, provider, entries);
    expect(forged.payload.version).toBe(version);
    lists = { [version]: JSON.stringify(forged.envelope) };
    expect(await providerListBacksReceipt(gateway, { provider, target: target() }, disputed())).toBe(false);
  });

  test('the node answers 200 with a body that is not JSON: not backed, nothing thrown', async () => {
    lists = { [version]: 'not json {' };
    expect(await providerListBacksReceipt(gateway, { provider, target: target() }, disputed())).toBe(false);
  });
});

describe('a node that cannot be asked leaves the fault with the provider, in bounded time', () => {
  test('nothing listens at the provider\'s address: not backed', async () => {
    const gone = await createHost({ seed, listen: ['/ip4/127.0.0.1/tcp/0'] });
    const addrs = gone.getMultiaddrs().map((m) => m.toString());
    await gone.stop();
    expect(await providerListBacksReceipt(gateway, { provider, target: dialTarget(provider, node.peerId.toString(), addrs) }, disputed(), 3000)).toBe(false);
  });

  test('a node that takes the stream and never answers: not backed once the timeout passes', async () => {
    const silentSeed = new Uint8Array(crypto.randomBytes(32));
    const silent = await createHost({ seed: silentSeed, listen: ['/ip4/127.0.0.1/tcp/0'] });
    try {
      let asked = 0;
      await handleRequests(silent, LOG_PROTOCOL, async () => {
        asked++;
        await new Promise(() => undefined); // never answers
      });
      const silentId = toHex(ed25519PublicKey(silentSeed));
      const to = dialTarget(silentId, silent.peerId.toString(), silent.getMultiaddrs().map((m) => m.toString()));
      expect(await providerListBacksReceipt(gateway, { provider: silentId, target: to }, disputed(), 300)).toBe(false);
      expect(asked).toBe(1); // it was reached: the timeout, not a failed dial, decided
    } finally {
      await silent.stop();
    }
  });
});
