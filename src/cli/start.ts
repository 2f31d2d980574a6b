import { Command } from 'commander';
import { loadConfig } from '../config.ts';
import { startNode } from '../node.ts';
import { untilSignal } from './until-signal.ts';

export function startCommand(): Command {
  return new Command('start')
    .description('run the node: serve the configured models over libp2p, sign receipts, expose ops HTTP')
    .requiredOption('--config <file>', 'the YAML config (see config.example.yaml)')
    .action(async (opts: { config: string }) => {
      const node = await startNode(loadConfig(opts.config), { logDestination: 2 });
      process.stdout.write(`seller-node started: provider ${node.providerId}\n  peer ${node.peerId}\n${node.addresses.map((a) => `  listening ${a}\n`).join('')}  ops ${node.opsUrl}\n  price version ${node.priceVersion}\n`);
      await untilSignal('seller-node', 'finishing in-flight requests, flushing receipts', () => node.stop());
    });
}
