// Long-running commands (start, market, gateway) run until SIGTERM, SIGINT or SIGHUP (the terminal
// or ssh session it ran in closed), then stop gracefully: in-flight requests finish, receipts flush.
// A second signal while stopping ends the process at once, by that signal (as if it had no handler:
// exit status 128 + its number, 130 for SIGINT, 143 for SIGTERM); a failed stop sets exit code 1. A
// signal once the stop has finished (the process is only winding down) exits at once with the
// stop's code.
//
// Why by the signal and not process.exit(1) (until session 32): an exit tears down the process's
// threads, and one in the middle of a native call (llama.cpp freeing a model, better-sqlite3
// committing) then throws from C++ where nothing can catch it: "terminate called after throwing an
// instance of 'Napi::Error'", SIGABRT. Measured: a second SIGTERM sent as a node began its stop
// aborted it in 10 of 20 runs. A death by signal tears nothing down; what the log acknowledged is
// on disk already (fsync), and SQLite's WAL is whole after any death.

/** The parts of `process` this uses (tests pass a fake). */
export interface SignalHost {
  on(event: 'SIGTERM' | 'SIGINT' | 'SIGHUP', listener: (signal: string) => void): unknown;
  stderr: { write(text: string): unknown };
  exit(code: number): void;
  /** Ends the process by `signal` as if it had no handler for it. */
  raise(signal: string): void;
  exitCode?: number | string | null | undefined;
}

/** Ends this process by `signal`, as if it had no handler for it: the handlers come off and it sends the signal to itself. */
export function exitBySignal(signal: string): void {
  process.removeAllListeners(signal);
  process.kill(process.pid, signal);
  setTimeout(() => process.exit(1), 1000); // (should the signal not end it)
}

/** This process. */
const processHost: SignalHost = {
  on: (event, listener) => process.on(event, listener),
  stderr: process.stderr,
  exit: (code) => process.exit(code),
  raise: exitBySignal,
  get exitCode() {
    return process.exitCode;
  },
  set exitCode(code) {
    process.exitCode = code;
  },
};

/**
 * Resolves once `stop` has finished after the first SIGTERM/SIGINT/SIGHUP.
 * `name` prefixes the messages on stderr; `doing` says what the stop does ("stopping", …);
 * `beforeExitNow` runs, synchronously, before a second signal ends the process.
 */
export function untilSignal(name: string, doing: string, stop: () => Promise<void>, opts: { host?: SignalHost; beforeExitNow?: () => void } = {}): Promise<void> {
  const host = opts.host ?? processHost;
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
        try {
          opts.beforeExitNow?.(); // (synchronous: removing a temporary folder, say)
        } finally {
          host.raise(sig);
        }
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
