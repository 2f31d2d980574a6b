// Any long-running `seller-node` subcommand (demo, market, gateway, start) as a child process,
// with everything it writes kept, for tests that talk to it and then signal it.
import { spawn, type ChildProcess } from 'node:child_process';
import { CLI_BIN } from './cli-run.ts';
import { waitFor } from './wait.ts';

export interface CliProcess {
  child: ChildProcess;
  /** Its exit code, or the signal that ended it ('SIGINT'). */
  exited: Promise<number | NodeJS.Signals>;
  stdout(): string;
  stderr(): string;
}

/** Processes spawned here; `killLeftCliProcesses` (in an afterEach/afterAll) kills any a failed assertion left running. */
const children: ChildProcess[] = [];

export function killLeftCliProcesses(): void {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
}

/** `seller-node ...args`; `env` is added to this process's environment. */
export function spawnCli(args: readonly string[], opts: { env?: Record<string, string> } = {}): CliProcess {
  const child = spawn(process.execPath, [CLI_BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NO_COLOR: '1', ...opts.env } });
  children.push(child);
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | NodeJS.Signals>((r) => child.on('exit', (code, signal) => r(code ?? signal!)));
  return { child, exited, stdout: () => out, stderr: () => err };
}

/** Waits until `re` matches its stdout and returns the match; throws (with its stderr) if it exits first. */
export function waitForStdout(p: CliProcess, what: string, re: RegExp, ms = 60_000): Promise<RegExpExecArray> {
  return waitFor(
    what,
    () => {
      const m = re.exec(p.stdout());
      if (m) return m;
      if (p.child.exitCode !== null || p.child.signalCode !== null) throw new Error(`exited (${p.child.exitCode ?? p.child.signalCode}) before ${what}: ${p.stderr()}`);
      return undefined;
    },
    ms,
  );
}
