// libp2p's debug logging costs per stream even when nothing is printed: every stream builds scoped
// loggers, and the `debug` package asks the terminal (an isatty system call) for each one. Unless
// DEBUG is set, hosts get loggers that are off and cost nothing; with DEBUG set (e.g.
// DEBUG='libp2p:*'), libp2p keeps its own logger and prints as usual.
import type { ComponentLogger, Logger } from '@libp2p/interface';

const noop = (): void => {};

const OFF: Logger = Object.assign((_formatter: unknown, ..._args: unknown[]) => {}, {
  error: noop,
  trace: noop,
  enabled: false,
  newScope: (): Logger => OFF,
});

const QUIET: ComponentLogger = { forComponent: () => OFF };

/** The component logger for a host: silent and free, or undefined (libp2p's own) when DEBUG is set. */
export function hostLogger(env: NodeJS.ProcessEnv = process.env): ComponentLogger | undefined {
  return env.DEBUG ? undefined : QUIET;
}
