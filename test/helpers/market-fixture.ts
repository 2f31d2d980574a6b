// A development marketplace and the tiny nodes registered with it, in one temporary folder: the
// setup the gateway tests share. close() stops every node it started (a node stopped earlier by the
// test is fine: stop is idempotent), the market, and removes the folder.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createMarket, type Market } from '../../src/market/market.ts';
import type { RunningNode } from '../../src/node.ts';
import { startTinyNode, type TinyNodeConfig } from './node-config.ts';
import { MarketProxy } from './misbehaving-node.ts';

export interface MarketFixture {
  dir: string;
  market: Market;
  /** The market's base URL. */
  url: string;
  /** Starts a tiny node in `<dir>/<name>` registered with the market (context 1024, 2 slots, one signer thread, logs at error unless `over` says otherwise). */
  tinyNode(name: string, over?: Partial<TinyNodeConfig>): Promise<RunningNode>;
  /**
   * A tiny node that can crash: it reaches the market through a proxy of its own, and crash()
   * cuts that first, then stops the node, so the market hears nothing of it going (a stopping
   * node announces `accepting: false`; a crashed one cannot) and keeps listing it as live.
   */
  crashableNode(name: string, over?: Partial<TinyNodeConfig>): Promise<RunningNode & { crash(): Promise<void> }>;
  close(): Promise<void>;
}

export async function startMarketFixture(prefix: string, opts: { heartbeatIntervalMs: number }): Promise<MarketFixture> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  const market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)), heartbeatIntervalMs: opts.heartbeatIntervalMs });
  const url = (await market.listen()).url;
  const nodes: RunningNode[] = [];
  const proxies: MarketProxy[] = [];
  const start = async (name: string, marketUrl: string, over: Partial<TinyNodeConfig>): Promise<RunningNode> => {
    const node = await startTinyNode(path.join(dir, name), { publicKey: market.publicKey, marketUrl, context: 1024, slots: 2, receipts: '{ signer_threads: 1, checkpoint_interval_ms: 0 }', logLevel: 'error', ...over });
    nodes.push(node);
    return node;
  };
  return {
    dir,
    market,
    url,
    tinyNode: (name, over = {}) => start(name, url, over),
    async crashableNode(name, over = {}) {
      const proxy = await MarketProxy.start(url);
      proxies.push(proxy);
      const node = await start(name, proxy.url, over);
      return Object.assign(node, {
        async crash() {
          await proxy.close();
          await node.stop(1000);
        },
      });
    },
    async close() {
      for (const n of nodes) await n.stop(1000);
      for (const p of proxies) await p.close();
      await market.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
