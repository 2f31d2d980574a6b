import { Command } from 'commander';
import { loadConfig, opsHostPort } from '../config.ts';
import { isLoopbackHost } from '../host-port.ts';
import { exitBySignal, untilSignal } from './until-signal.ts';

const STOP_SIGNALS = ['SIGTERM', 'SIGINT', 'SIGHUP'] as const;
const STOPPED_EARLY = 'seller-node: stopped before it served\n';

export function startCommand(): Command {
  return new Command('start')
    .summary('run the node (serve models, sign receipts)')
    .description('run the node: serve the configured models over libp2p, sign receipts, expose ops HTTP')
    .requiredOption('--config <file>', 'the YAML config (see config.example.yaml)')
    .action(async (opts: { config: string }) => {
      const config = loadConfig(opts.config);
      // As the gateway does for its own address: the ops server has no authentication.
      if (!isLoopbackHost(opsHostPort(config).host)) process.stderr.write(`seller-node: warning: the ops HTTP server listens on ${config.ops.http}, beyond this machine; /status and /metrics have no authentication\n`);
      const { startNode, NodeStartStopped } = await import('../node.ts'); // (loaded when it runs: --help stays fast)
      // A signal while it starts (a model load takes minutes on a real GPU model) stops the start:
      // what was opened is closed, and the process ends at once, a model load under way with it.
      // (Without a handler of ours, node-llama-cpp's exit hook re-raised the signal: killed, without a word.)
      const starting = new AbortController();
      const duringStart = (sig: string): void => {
        if (starting.signal.aborted) {
          process.stderr.write(`seller-node: ${sig} again: exiting now\n`);
          exitBySignal(sig); // (an exit while the model loads on the runtime thread may abort the process)
          return;
        }
        process.stderr.write(`seller-node: ${sig} during start-up: stopping\n`);
        starting.abort();
      };
      for (const sig of STOP_SIGNALS) process.on(sig, duringStart);
      let node: Awaited<ReturnType<typeof startNode>>;
      try {
        node = await startNode(config, { logDestination: 2, signal: starting.signal });
      } catch (e) {
        if (!(e instanceof NodeStartStopped)) throw e;
        process.stderr.write(STOPPED_EARLY);
        process.exit(0);
      } finally {
        for (const sig of STOP_SIGNALS) process.off(sig, duringStart);
      }
      if (starting.signal.aborted) {
        // (the signal came as the start finished: it served nothing yet)
        await node.stop();
        process.stderr.write(STOPPED_EARLY);
        return;
      }
      // The signal handlers first, then the line that says it runs: a signal sent on reading that
      // line must find them (without one, a SIGINT or SIGTERM ends the process at once).
      const stopped = untilSignal('seller-node', 'finishing in-flight requests, flushing receipts', () => node.stop(config.stop_grace_s * 1000));
      process.stdout.write(`seller-node started: provider ${node.providerId}\n  peer ${node.peerId}\n${node.addresses.map((a) => `  listening ${a}\n`).join('')}  ops ${node.opsUrl}\n  price version ${node.priceVersion}\n`);
      await stopped;
    });
}
