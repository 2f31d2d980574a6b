// `seller-node start` as a child process, as an operator runs it: spawned, waited on until it
// prints where it listens, and killed after a test that left it running.
import { spawn, type ChildProcess } from 'node:child_process';
import { CLI_BIN } from './cli-run.ts';

/** Nodes started by a test; `killLeftNodes` (in an afterEach) kills any a failed assertion left running. */
const children: ChildProcess[] = [];

export function killLeftNodes(): void {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
}

export function spawnNode(configFile: string): ChildProcess {
  const child = spawn(process.execPath, [CLI_BIN, 'start', '--config', configFile], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  return child;
}

/** Resolves with the node's libp2p address, ops URL and price version once it has printed them. */
export function waitForStart(child: ChildProcess): Promise<{ addr: string; ops: string; priceVersion: string }> {
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const addr = /listening (\S+)/.exec(out)?.[1];
      const ops = /ops (\S+)/.exec(out)?.[1];
      const pv = /price version (\S+)/.exec(out)?.[1];
      if (addr && ops && pv) resolve({ addr, ops, priceVersion: pv });
    });
    child.on('exit', (code) => reject(new Error(`exited ${code} before starting: ${out}`)));
  });
}
