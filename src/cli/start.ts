import { Command } from 'commander';
import { ConfigError, loadConfig } from '../config.ts';
import { IdentityError } from '../identity.ts';
import { NodeStartError, startNode } from '../node.ts';
import { ReceiptLogError } from '../store/receipt-log.ts';
import { CliError } from './cli-error.ts';
import { untilSignal } from './until-signal.ts';

export function startCommand(): Command {
  return new Command('start')
    .description('run the node: serve the configured models over libp2p, sign receipts, expose ops HTTP')
    .requiredOption('--config <file>', 'the YAML config (see config.example.yaml)')
    .action(async (opts: { config: string }) => {
      let node;
      try {
        node = await startNode(loadConfig(opts.config), { logDestination: 2 });
      } catch (e) {
        if (e instanceof ConfigError || e instanceof IdentityError || e instanceof NodeStartError || e instanceof ReceiptLogError) throw new CliError(e.message);
        throw e;
      }
      process.stdout.write(`seller-node started: provider ${node.providerId}\n  peer ${node.peerId}\n${node.addresses.map((a) => `  listening ${a}\n`).join('')}  ops ${node.opsUrl}\n  price version ${node.priceVersion}\n`);
      await untilSignal('seller-node', 'finishing in-flight requests, flushing receipts', () => node.stop());
    });
}
