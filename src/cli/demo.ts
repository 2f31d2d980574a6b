// `seller-node demo` (npm start): a development marketplace, a node serving the tiny generated
// model on the embedded runtime, and the buyer gateway, all on this machine, in a temporary
// folder. Prints the gateway URL and a curl line that works; Ctrl-C stops all three cleanly.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Command } from 'commander';
import { parseConfig } from '../config.ts';
import { createKeyFile } from '../identity.ts';
import { fetchPortProblem } from '../fetch-ports.ts';
import { CliError, intOption } from './cli-error.ts';
import { untilSignal } from './until-signal.ts';
import { listenProblem } from '../host-port.ts';

export function demoCommand(): Command {
  return new Command('demo')
    .summary('market, node and gateway together (npm start)')
    .description('run a marketplace, a node (tiny model, embedded runtime) and the gateway together (what npm start runs)')
    .option('--port <n>', 'gateway port', intOption('--port', 0, 65535), 11435)
    .option('--smoke', 'send one paid request through the gateway (which answers only once its receipt verifies), print its tokens, its cost and what the market collected, and stop')
    .action(async (opts: { port: number; smoke?: boolean }) => {
      const portProblem = fetchPortProblem(opts.port);
      if (portProblem) throw new CliError(`--port: ${portProblem}`, 2);
      // (loaded when it runs: --help stays fast)
      const [{ writeTinyLlama }, { createGateway }, { createMarket }, { startNode }] = await Promise.all([
        import('../../adapters/gguf/tiny-llama.ts'),
        import('../gateway/gateway.ts'),
        import('../market/market.ts'),
        import('../node.ts'),
      ]);
      const say = (s: string) => process.stdout.write(s + '\n');
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'seller-node-demo-'));
      // The folder goes with every end: after the stops, at an exit, and before a second Ctrl-C
      // ends the process at once (no stops, no exit handlers then: see untilSignal).
      const removeDir = () => fs.rmSync(dir, { recursive: true, force: true });
      process.once('exit', removeDir);
      const stops: [string, () => Promise<void>][] = [];
      /** Each part stops once, the last started first; one that fails is named and the others still stop. */
      const stopAll = async () => {
        const failed: string[] = [];
        for (const [name, stop] of stops.splice(0).reverse()) await stop().catch((e: unknown) => void failed.push(`${name}: ${(e as Error).message}`));
        removeDir();
        if (failed.length > 0) throw new Error(failed.join('; '));
      };
      try {
        const market = createMarket({ seed: new Uint8Array(crypto.randomBytes(32)) });
        const m = await market.listen();
        stops.push(['marketplace', () => market.close()]);
        createKeyFile(path.join(dir, 'node.key'));
        writeTinyLlama(path.join(dir, 'tiny.gguf'));
        const config = parseConfig(
          [
            'key: ./node.key',
            'data_dir: ./data',
            'listen: [/ip4/127.0.0.1/tcp/0]',
            `marketplace: { url: "${m.url}", public_keys: ["${market.publicKey}"] }`,
            'models:',
            '  - { id: tiny/llama, adapter: llama-embedded, path: ./tiny.gguf, context: 2048, slots: 2, prices: { input_per_mtok_usd: "0.15", output_per_mtok_usd: "0.60" } }',
            'ops: { http: "127.0.0.1:0" }',
            'receipts: { checkpoint_every: 100, checkpoint_interval_ms: 5000, signer_threads: 1 }',
            'log_level: warn',
          ].join('\n'),
          dir,
        );
        const node = await startNode(config, { logDestination: 2 });
        stops.push(['node', () => node.stop(5000)]);
        // The node registers itself; wait until the market lists it.
        for (let i = 0; i < 100; i++) {
          const providers = (await (await fetch(`${m.url}/v1/providers`)).json()) as { provider: string }[];
          if (providers.some((p) => p.provider === node.providerId)) break;
          await new Promise((r) => setTimeout(r, 100));
        }
        const gateway = await createGateway({ market: m.url, port: opts.smoke ? 0 : opts.port }).catch((e: unknown) => {
          throw new CliError(listenProblem(e, `127.0.0.1:${opts.port}`, 'the gateway\'s port: pick another with --port') ?? (e as Error).message);
        });
        stops.push(['gateway', () => gateway.close()]);
        const curl = `curl -s ${gateway.url}/chat/completions -H 'content-type: application/json' -d '{"model":"tiny/llama","messages":[{"role":"user","content":"hello world"}],"max_tokens":24,"seed":1}'`;
        say(`marketplace  ${m.url}  (key ${market.publicKey})`);
        say(`node         provider ${node.providerId}, ${node.addresses[0]}, ops ${node.opsUrl}`);
        say(`gateway      ${gateway.url}`);
        say(`\ntry:\n  ${curl}\n  curl -s ${m.url}/v1/totals\n`);
        if (opts.smoke) {
          const res = await fetch(`${gateway.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny/llama', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 24, seed: 1 }) });
          const body = (await res.json()) as { usage?: { completion_tokens: number; cost: string }; service?: { request_id: string } };
          const totals = (await (await fetch(`${m.url}/v1/totals`)).json()) as { receipts: number; cost_micro_usd: string };
          say(`smoke        ${res.status}: ${body.usage?.completion_tokens} tokens for ${body.usage?.cost} USD, request ${body.service?.request_id}; market collected ${totals.receipts} receipt(s), ${totals.cost_micro_usd} micro-USD`);
          await stopAll();
          process.exitCode = res.status === 200 && totals.receipts === 1 ? 0 : 1;
          return;
        }
        // As start/market/gateway: a second signal while stopping ends it at once; handlers before the line.
        const stopped = untilSignal('seller-node demo', 'stopping gateway, node (in-flight requests finish, receipts flushed), marketplace', stopAll, { beforeExitNow: removeDir });
        say('Ctrl-C stops all three.');
        await stopped;
      } catch (e) {
        await stopAll().catch(() => undefined); // (the error that stopped the demo is the one to report)
        throw e;
      }
    });
}
