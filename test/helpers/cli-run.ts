// Runs the real `seller-node` CLI (bin/seller-node.js, which imports dist/) in a child process.
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { REPO_ROOT } from './vectors.ts';

export const CLI_BIN = path.join(REPO_ROOT, 'bin', 'seller-node.js');
const DIST_MAIN = path.join(REPO_ROOT, 'dist', 'src', 'cli', 'main.js');

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Throws a clear error when the CLI has not been built (`npm run build`). */
export function assertCliBuilt(): void {
  if (!fs.existsSync(DIST_MAIN)) throw new Error(`${DIST_MAIN} is missing: run \`npm run build\` before the CLI tests`);
}

export function runCli(args: readonly string[], opts: { cwd?: string; input?: string; timeoutMs?: number; env?: Record<string, string>; uid?: number; gid?: number } = {}): Promise<CliResult> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      [CLI_BIN, ...args],
      {
        cwd: opts.cwd ?? REPO_ROOT,
        encoding: 'utf8',
        timeout: opts.timeoutMs ?? 30_000,
        maxBuffer: 16 << 20,
        // No npm_package_version leaking in from `npm test`; no colours in commander's output.
        env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', NO_COLOR: '1', ...opts.env },
        ...(opts.uid !== undefined ? { uid: opts.uid } : {}),
        ...(opts.gid !== undefined ? { gid: opts.gid } : {}),
      },
      (err, stdout, stderr) => {
        const e = err as (NodeJS.ErrnoException & { code?: number | string; signal?: NodeJS.Signals | null }) | null;
        resolve({
          code: e ? (typeof e.code === 'number' ? e.code : null) : 0,
          signal: e?.signal ?? null,
          stdout,
          stderr,
        });
      },
    );
    if (opts.input !== undefined) child.stdin!.end(opts.input);
    else child.stdin!.end();
  });
}

/** A V8 stack frame line ("    at fn (file:line:col)"), which the CLI must never print. */
export const STACK_TRACE = /^\s+at .+(:\d+:\d+\)?|\(native\)|<anonymous>)$/m;
