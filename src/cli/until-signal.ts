// Long-running commands (start, market, gateway) run until SIGTERM, SIGINT or SIGHUP (the terminal
// or ssh session it ran in closed), then stop gracefully: in-flight requests finish, receipts flush.
// A second signal while stopping exits at once with code 1; a failed stop sets exit code 1. A signal
// once the stop has finished (the process is only winding down) exits at once with the stop's code.

/** The parts of `process` this uses (tests pass a fake). */
export interface SignalHost {
  on(event: 'SIGTERM' | 'SIGINT' | 'SIGHUP', listener: (signal: string) => void): unknown;
  stderr: { write(text: string): unknown };
  exit(code: number): void;
  exitCode?: number | string | null | undefined;
}

/**
 * Resolves once `stop` has finished after the first SIGTERM/SIGINT/SIGHUP.
 * `name` prefixes the messages on stderr; `doing` says what the stop does ("stopping", …).
 */
export function untilSignal(name: string, doing: string, stop: () => Promise<void>, host: SignalHost = process): Promise<void> {
  return new Promise<void>((resolve) => {
    let stopping = false;
    let stopped = false;
    const onSignal = (sig: string): void => {
      if (stopped) {
        host.stderr.write(`${name}: ${sig}: stopped already; exiting\n`);
        host.exit(typeof host.exitCode === 'number' ? host.exitCode : 0);
        return;
      }
      if (stopping) {
        host.stderr.write(`${name}: ${sig} again: exiting now\n`);
        host.exit(1);
        return;
      }
      stopping = true;
      host.stderr.write(`${name}: ${sig}: ${doing}\n`);
      stop().then(
        () => {
          stopped = true;
          resolve();
        },
        (e: Error) => {
          stopped = true;
          host.stderr.write(`${name}: stop failed: ${e.message}\n`);
          host.exitCode = 1;
          resolve();
        },
      );
    };
    host.on('SIGTERM', onSignal);
    host.on('SIGINT', onSignal);
    host.on('SIGHUP', onSignal);
  });
}
