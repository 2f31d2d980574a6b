// Long-running commands (start, market, gateway) run until SIGTERM or SIGINT, then stop gracefully.
// A second signal while stopping exits at once with code 1; a failed stop sets exit code 1.

/**
 * Resolves once `stop` has finished after the first SIGTERM/SIGINT.
 * `name` prefixes the messages on stderr; `doing` says what the stop does ("stopping", …).
 */
export function untilSignal(name: string, doing: string, stop: () => Promise<void>): Promise<void> {
  return new Promise<void>((resolve) => {
    let stopping = false;
    const onSignal = (sig: string): void => {
      if (stopping) {
        process.stderr.write(`${name}: ${sig} again: exiting now\n`);
        process.exit(1);
      }
      stopping = true;
      process.stderr.write(`${name}: ${sig}: ${doing}\n`);
      stop().then(resolve, (e: Error) => {
        process.stderr.write(`${name}: stop failed: ${e.message}\n`);
        process.exitCode = 1;
        resolve();
      });
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}
