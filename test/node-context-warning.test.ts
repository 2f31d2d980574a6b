// A model's configured context above what its GGUF was trained for: the runtime serves the trained
// context, and the node says so at start (one warning naming both), and reports what it serves. More
// threads than cores are warned about the same way.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { parseConfig } from '../src/config.ts';
import { createKeyFile } from '../src/identity.ts';
import { startNode, type RunningNode } from '../src/node.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { testKey } from './helpers/receipts.ts';

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'node-context-warning-'));
const market = testKey();
let node: RunningNode | undefined;
let logFd: number | undefined;

afterAll(async () => {
  await node?.stop(1000);
  if (logFd !== undefined) fs.closeSync(logFd);
  fs.rmSync(home, { recursive: true, force: true });
});

const warnings = (file: string): { msg: string; [k: string]: unknown }[] =>
  fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as { level: number; msg: string })
    .filter((l) => l.level === 40);

/** Stops the node of an earlier test, starts one with `yaml` logging to `logName` (in the model's folder), runs `fn`, and stops it. */
async function withNode(yaml: string, logName: string, fn: (n: RunningNode, logFile: string) => Promise<void>): Promise<void> {
  await node?.stop(1000);
  node = undefined;
  const logFile = path.join(home, logName);
  const fd = fs.openSync(logFile, 'w');
  try {
    node = await startNode(parseConfig(yaml, home), { logDestination: fd });
    await fn(node, logFile);
  } finally {
    await node?.stop(1000);
    node = undefined;
    fs.closeSync(fd);
  }
}

describe('a configured context larger than the model was trained for', () => {
  test('is served at the trained context, with a warning at start naming both', async () => {
    createKeyFile(path.join(home, 'node.key'));
    writeTinyLlama(path.join(home, 'tiny.gguf'), { contextLength: 1024 });
    const logFile = path.join(home, 'node.log');
    logFd = fs.openSync(logFile, 'w');
    node = await startNode(parseConfig(tinyNodeConfigYaml({ publicKey: market.id, context: 8192 }), home), { logDestination: logFd });
    const status = (await (await fetch(`${node.opsUrl}/status`)).json()) as { models: { id: string; context: number }[] };
    expect(status.models).toMatchObject([{ id: 'tiny/llama', context: 1024 }]);
    expect(warnings(logFile)).toContainEqual(expect.objectContaining({ model: 'tiny/llama', configured: 8192, context: 1024, msg: 'model tiny/llama: context 8192 is more than the model was trained for; serving 1024' }));
  });

  test('the default context (not set) on a smaller model is no warning', async () => {
    const yaml = tinyNodeConfigYaml({ publicKey: market.id }).replace(/^ {4}context: .*$/m, '');
    await withNode(yaml, 'node2.log', async (n, logFile) => {
      const status = (await (await fetch(`${n.opsUrl}/status`)).json()) as { models: { context: number }[] };
      expect(status.models[0]!.context).toBe(1024);
      expect(warnings(logFile).filter((w) => /context/.test(w.msg))).toEqual([]);
      // Threads within the cores (1, the default): no threads warning either.
      expect(warnings(logFile).filter((w) => /threads/.test(w.msg))).toEqual([]);
    });
  });
});

describe('more threads than the machine has cores', () => {
  test('are served, with a warning at start naming both', async () => {
    const threads = os.availableParallelism() + 1;
    const yaml = tinyNodeConfigYaml({ publicKey: market.id }).replace(/^( {4}context: .*)$/m, `$1\n    threads: ${threads}`);
    await withNode(yaml, 'node3.log', async (_n, logFile) => {
      expect(warnings(logFile)).toContainEqual(expect.objectContaining({ model: 'tiny/llama', threads, cores: os.availableParallelism(), msg: expect.stringMatching(/^model tiny\/llama: threads \d+ is more than this machine's \d+ cores/) }));
    });
  });
});
