// File descriptors nearing the process's limit (src/ops/descriptor-watch.ts): read from /proc (a real
// child process under a real limit), said once at 90 % of the limit and once when below 80 % again.
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { describe, expect, test } from 'vitest';
import { DescriptorWatch, type DescriptorUse } from '../src/ops/descriptor-watch.ts';
import { REPO_ROOT } from './helpers/vectors.ts';

/** Runs `body` (which prints its JSON result) in a Node child with descriptorUse imported, under `prlimit --nofile=limit`. */
function underLimit<T>(limit: number, body: string): T {
  const script = `import fs from 'node:fs';
import { descriptorUse } from ${JSON.stringify(path.join(REPO_ROOT, 'src', 'ops', 'descriptor-watch.ts'))};
${body}`;
  const r = spawnSync('prlimit', [`--nofile=${limit}:${limit}`, process.execPath, '--input-type=module', '-e', script], { encoding: 'utf8' });
  expect(r.status, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as T;
}

describe('descriptor use', () => {
  test('read from /proc in a process under a real limit (prlimit --nofile=200): the limit, and every descriptor it opens counted', () => {
    const { before, after } = underLimit<{ before: DescriptorUse; after: DescriptorUse }>(
      200,
      `const before = descriptorUse();
const fds = Array.from({ length: 50 }, () => fs.openSync('/dev/null', 'r'));
const after = descriptorUse();
console.log(JSON.stringify({ before, after }));`,
    );
    expect(before.limit).toBe(200);
    expect(after.limit).toBe(200);
    expect(after.open - before.open).toBe(50);
  });

  test('at the limit itself (reading /proc needs a descriptor too, and fails EMFILE): all of the limit in use, as last read', () => {
    const { first, full } = underLimit<{ first: DescriptorUse; full: DescriptorUse }>(
      100,
      `const first = descriptorUse();
const fds = [];
try { for (;;) fds.push(fs.openSync('/dev/null', 'r')); } catch (e) { if (e.code !== 'EMFILE') throw e; }
const full = descriptorUse();
console.log(JSON.stringify({ first, full }));`,
    );
    expect(first.limit).toBe(100);
    expect(first.open).toBeLessThan(100);
    expect(full).toEqual({ open: 100, limit: 100 });
  });

  test('said once at 90 % of the limit, not again while it stays above 80 %, cleared once below it, and said again when it comes back', () => {
    const said: string[] = [];
    let use: DescriptorUse | undefined = { open: 100, limit: 1000 };
    const w = new DescriptorWatch({ error: (u) => said.push(`error ${u.open}/${u.limit}`), info: (u) => said.push(`info ${u.open}/${u.limit}`) }, () => use);
    w.check();
    use = { open: 899, limit: 1000 };
    w.check();
    expect(said).toEqual([]);
    use = { open: 900, limit: 1000 };
    w.check();
    use = { open: 990, limit: 1000 };
    w.check();
    use = { open: 800, limit: 1000 };
    w.check();
    expect(said).toEqual(['error 900/1000']);
    use = { open: 799, limit: 1000 };
    w.check();
    w.check();
    expect(said).toEqual(['error 900/1000', 'info 799/1000']);
    use = undefined; // (no /proc: nothing said, nothing changed)
    w.check();
    use = { open: 950, limit: 1000 };
    w.check();
    expect(said).toEqual(['error 900/1000', 'info 799/1000', 'error 950/1000']);
  });
});
