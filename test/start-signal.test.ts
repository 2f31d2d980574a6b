// A stop asked for while the node starts (SIGTERM, SIGINT, SIGHUP during a model load that takes
// minutes on a real GPU model) stops the start: what was opened is closed, the process says so and
// ends with 0 at once. It used to be killed without a word (node-llama-cpp's exit hook re-raised
// the signal), leaving its lock and SQLite side files behind.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { parseConfig } from '../src/config.ts';
import { lockDataDir } from '../src/data-dir-lock.ts';
import { createKeyFile } from '../src/identity.ts';
import { NodeStartStopped, startNode } from '../src/node.ts';
import { assertCliBuilt } from './helpers/cli-run.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { killLeftNodes, spawnNode, waitForStart } from './helpers/node-process.ts';
import { stopProbeChild } from './helpers/probe-child.ts';
import { waitFor } from './helpers/wait.ts';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'start-signal-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

/** A node's folder: its key, the tiny model and a config; its path. */
function home(name: string): string {
  const h = path.join(dir, name);
  fs.mkdirSync(h);
  createKeyFile(path.join(h, 'node.key'));
  writeTinyLlama(path.join(h, 'tiny.gguf'));
  fs.writeFileSync(path.join(h, 'config.yaml'), tinyNodeConfigYaml({ publicKey: '11'.repeat(32), logLevel: 'info' }));
  return h;
}

const gone = (pid: number): boolean => !fs.existsSync(`/proc/${pid}`) || /^State:\s+Z/m.test(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));

describe('seller-node start, stopped while it loads its model', () => {
  afterEach(killLeftNodes);
  beforeAll(assertCliBuilt);

  test.each(['SIGTERM', 'SIGINT', 'SIGHUP'] as const)('%s: it says so, closes what it opened and exits 0 at once; the load under way ends with it', async (sig) => {
    const h = home(`cli-${sig}`);
    const child = spawnNode(path.join(h, 'config.yaml'));
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    // The model's load held where it is (its probe child stopped): the node is mid-load.
    const probe = await stopProbeChild(path.join(h, 'tiny.gguf'));
    const t0 = Date.now();
    child.kill(sig);
    expect(await exited).toBe(0);
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(stderr).toContain(`seller-node: ${sig} during start-up: stopping\n`);
    expect(stderr).toContain('seller-node: stopped before it served\n');
    expect(stderr).not.toContain('"model ready"');
    // Its files closed: no lock journal, no SQLite side files; the data dir can be locked again.
    expect(fs.readdirSync(path.join(h, 'data')).filter((f) => /-(wal|shm|journal)$/.test(f))).toEqual([]);
    lockDataDir(path.join(h, 'data')).release();
    // The probe child, let go again, ends itself: its parent is gone.
    process.kill(probe, 'SIGCONT');
    await waitFor('the probe child to end', () => (gone(probe) ? true : undefined), 10_000);
  }, 60_000);

  test('a signal once it serves stops it as before, not as a start-up stop', async () => {
    const h = home('cli-after');
    const child = spawnNode(path.join(h, 'config.yaml'));
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    await waitForStart(child);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(stderr).toContain('seller-node: SIGTERM: finishing in-flight requests, flushing receipts\n');
    expect(stderr).not.toContain('during start-up');
  }, 60_000);

  test('a second signal as it stops ends it at once by that signal, never an abort from a thread at work', async () => {
    // (The stop frees the model on the runtime thread and closes SQLite on the writer's: an exit
    // then aborted the process, SIGABRT, in half the runs. Three runs, each signalled at once.)
    const h = home('cli-twice');
    for (let run = 0; run < 3; run++) {
      fs.rmSync(path.join(h, 'data'), { recursive: true, force: true });
      const child = spawnNode(path.join(h, 'config.yaml'));
      let stderr = '';
      const exited = new Promise<string>((r) => child.on('exit', (code, signal) => r(`${code ?? signal}`)));
      await waitForStart(child);
      child.stderr!.on('data', (d: Buffer) => {
        const first = !stderr.includes('finishing');
        stderr += d.toString();
        if (first && stderr.includes('finishing')) child.kill('SIGTERM');
      });
      child.kill('SIGTERM');
      expect(await exited, stderr).toBe('SIGTERM');
      expect(stderr).toContain('seller-node: SIGTERM again: exiting now\n');
      expect(stderr).not.toMatch(/terminate called|Napi::Error/);
    }
  }, 60_000);
});

describe('startNode with a signal', () => {
  test('aborted while the model loads: NodeStartStopped at once; the data dir is let go', async () => {
    const h = home('in-process');
    const ac = new AbortController();
    const probe = stopProbeChild(path.join(h, 'tiny.gguf'));
    const starting = startNode(parseConfig(fs.readFileSync(path.join(h, 'config.yaml'), 'utf8').replace('log_level: info', 'log_level: fatal'), h), { signal: ac.signal });
    const pid = await probe;
    ac.abort();
    await expect(starting).rejects.toBeInstanceOf(NodeStartStopped);
    lockDataDir(path.join(h, 'data')).release();
    process.kill(pid, 'SIGKILL'); // (this process stays: the probe's own deadline would end it in 10 minutes)
  });

  test('aborted before it starts: nothing is loaded', async () => {
    const h = home('in-process-early');
    const ac = new AbortController();
    ac.abort();
    await expect(startNode(parseConfig(fs.readFileSync(path.join(h, 'config.yaml'), 'utf8').replace('log_level: info', 'log_level: fatal'), h), { signal: ac.signal })).rejects.toBeInstanceOf(NodeStartStopped);
    expect(fs.existsSync(path.join(h, 'data', 'model-probes.json'))).toBe(false);
    lockDataDir(path.join(h, 'data')).release();
  });
});
