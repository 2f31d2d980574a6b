import { Command } from 'commander';
import { loadConfig, opsHostPort } from '../config.ts';
import { isLoopbackHost } from '../host-port.ts';
import { untilSignal } from './until-signal.ts';

export function startCommand(): Command {
  return new Command('start')
    .description('run the node: serve the configured models over libp2p, sign receipts, expose ops HTTP')
    .requiredOption('--config <file>', 'the YAML config (see config.example.yaml)')
    .action(async (opts: { config: string }) => {
      const config = loadConfig(opts.config);
      // As the gateway does for its own address: the ops server has no authentication.
      if (!isLoopbackHost(opsHostPort(config).host)) process.stderr.write(`seller-node: warning: the ops HTTP server listens on ${config.ops.http}, beyond this machine; /status and /metrics have no authentication\n`);
      const { startNode } = await import('../node.ts'); // (loaded when it runs: --help stays fast)
      const node = await startNode(config, { logDestination: 2 });
      // The signal handlers first, then the line that says it runs: a signal sent on reading that
      // line must find them (without one, a SIGINT or SIGTERM ends the process at once).
      const stopped = untilSignal('seller-node', 'finishing in-flight requests, flushing receipts', () => node.stop());
      process.stdout.write(`seller-node started: provider ${node.providerId}\n  peer ${node.peerId}\n${node.addresses.map((a) => `  listening ${a}\n`).join('')}  ops ${node.opsUrl}\n  price version ${node.priceVersion}\n`);
      await stopped;
    });
}
