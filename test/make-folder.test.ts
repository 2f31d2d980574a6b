// makeFolder makes the folders a path needs, as a recursive mkdir does, and fails where that one
// hangs: Node's recursive mkdir loops for ever (100 % CPU, deaf to signals) when mkdir says ENOENT
// under a folder that exists (anywhere under /proc; a mount gone stale). Every command that makes
// a folder the operator names goes through it.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { fsProblem } from '../src/fs-problem.ts';
import { makeFolder } from '../src/make-folder.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { assertCliBuilt, runCli } from './helpers/cli-run.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { REPO_ROOT } from './helpers/vectors.ts';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'make-folder-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const codeOf = (f: () => void): unknown => {
  try {
    f();
    return undefined;
  } catch (e) {
    return (e as { code?: unknown }).code;
  }
};

describe('makeFolder', () => {
  test('makes every missing folder, with the mode given to those it makes; an existing folder is fine', () => {
    const deep = path.join(dir, 'a', 'b', 'c');
    makeFolder(deep, 0o700);
    expect(fs.statSync(deep).isDirectory()).toBe(true);
    expect(fs.statSync(path.join(dir, 'a')).mode & 0o777).toBe(0o700 & ~process.umask());
    makeFolder(deep, 0o755); // (there: nothing to do, its mode kept)
    expect(fs.statSync(deep).mode & 0o777).toBe(0o700 & ~process.umask());
    makeFolder(path.relative(process.cwd(), path.join(dir, 'rel', 'x')));
    expect(fs.statSync(path.join(dir, 'rel', 'x')).isDirectory()).toBe(true);
    fs.symlinkSync(deep, path.join(dir, 'link'));
    makeFolder(path.join(dir, 'link')); // a link to a folder is a folder
    makeFolder(path.join(dir, 'link', 'd'));
    expect(fs.statSync(path.join(deep, 'd')).isDirectory()).toBe(true);
  });

  test('a file in the way, a link to nothing and a folder it may not write in are errors with fs\'s codes', () => {
    fs.writeFileSync(path.join(dir, 'file'), 'x');
    expect(codeOf(() => makeFolder(path.join(dir, 'file')))).toBe('EEXIST');
    expect(codeOf(() => makeFolder(path.join(dir, 'file', 'below')))).toBe('ENOTDIR');
    fs.symlinkSync(path.join(dir, 'nowhere', 'x'), path.join(dir, 'dangling'));
    expect(codeOf(() => makeFolder(path.join(dir, 'dangling')))).toBe('ENOENT');
    if (process.getuid?.() === 0) return; // (root may write anywhere)
    fs.mkdirSync(path.join(dir, 'locked'), { mode: 0o500 });
    expect(codeOf(() => makeFolder(path.join(dir, 'locked', 'x')))).toBe('EACCES');
  });

  test('under /proc (mkdir says ENOENT below a folder that exists) it fails at once, in words, where a recursive mkdir spins for ever', () => {
    // In a child with a deadline: a regression would spin this test's process beyond any timeout.
    const script = `import { makeFolder } from ${JSON.stringify(path.join(REPO_ROOT, 'src', 'make-folder.ts'))};
      try { makeFolder('/proc/seller-node-test/data'); console.log('made'); } catch (e) { console.log(e.code, e.syscall); }`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
    expect([r.signal, r.stdout.trim()]).toEqual([null, 'ENOENT mkdir']);
    expect(fsProblem(Object.assign(new Error('x'), { code: 'ENOENT', syscall: 'mkdir' }))).toMatch(/^no folder can be made there/);
    expect(fsProblem(Object.assign(new Error('x'), { code: 'ENOENT', syscall: 'open' }))).toBe('not found');
  });
});

describe('the commands that make the folders an operator names', () => {
  beforeAll(assertCliBuilt);

  test('init, market and log export under /proc: exit 1 at once, naming the folder and why', async () => {
    const why = 'no folder can be made there (the file system says "no such file or folder": /proc, or a mount gone stale?)';
    const init = await runCli(['init', '--data', '/proc/seller-node-test'], { timeoutMs: 20_000 });
    expect([init.code, init.stderr]).toEqual([1, `seller-node: --data /proc/seller-node-test: ${why}\n`]);
    const market = await runCli(['market', '--data', '/proc/seller-node-test', '--listen', '127.0.0.1:0'], { timeoutMs: 20_000 });
    expect([market.code, market.stderr]).toEqual([1, `seller-node: cannot use --data /proc/seller-node-test: ${why}\n`]);
    const data = path.join(dir, 'node');
    expect((await runCli(['init', '--data', data])).code).toBe(0);
    const exported = await runCli(['log', 'export', '--data', data, '--out', '/proc/seller-node-test'], { timeoutMs: 20_000 });
    expect(exported.code).toBe(1);
    expect(exported.stderr).toContain(`seller-node: cannot write the export to /proc/seller-node-test: ${why}`);
    // start, with its data_dir there: refused before anything loads.
    writeTinyLlama(path.join(data, 'tiny.gguf'));
    fs.writeFileSync(path.join(data, 'proc.yaml'), tinyNodeConfigYaml({ publicKey: '11'.repeat(32) }).replace('data_dir: ./data', 'data_dir: /proc/seller-node-test'));
    const start = await runCli(['start', '--config', path.join(data, 'proc.yaml')], { timeoutMs: 20_000 });
    expect([start.code, start.stderr]).toEqual([1, `seller-node: data_dir: /proc/seller-node-test: ${why}\n`]);
  });
});
