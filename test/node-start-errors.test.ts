// startNode refuses a config it cannot serve before it starts anything: no key read, no data
// folder made, no model loaded.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { parseConfig } from '../src/config.ts';
import { NodeStartError, startNode } from '../src/node.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'node-start-errors-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
writeTinyLlama(path.join(dir, 'tiny.gguf'));

const model = (id: string, extra: string) => `  - { id: ${id}, path: ./${extra}, url: "http://127.0.0.1:1", context: 256, prices: { input_per_mtok_usd: "0.1", output_per_mtok_usd: "0.2" } }`;
const yaml = (models: string[], adapter = 'llama-embedded') =>
  ['key: ./no-such.key', 'data_dir: ./data', `models:`, ...models.map((m) => m.replace('{ id:', `{ adapter: ${adapter}, id:`)), 'ops: { http: "127.0.0.1:0" }'].join('\n');

describe('startNode refuses what it cannot serve, before starting anything', () => {
  test('a missing model file, even for the second model', async () => {
    const config = parseConfig(yaml([model('a/one', 'tiny.gguf'), model('b/two', 'missing.gguf')]), dir);
    await expect(startNode(config)).rejects.toThrow(NodeStartError);
    await expect(startNode(config)).rejects.toThrow(/models: b\/two: model file .*missing\.gguf not found \(seller-node dev-model/);
    expect(fs.existsSync(path.join(dir, 'data'))).toBe(false);
  });

  test('an adapter this version does not have', async () => {
    const config = parseConfig(yaml([model('a/one', 'tiny.gguf')], 'vllm'), dir);
    await expect(startNode(config)).rejects.toThrow(/models: a\/one: the vllm adapter is not available in this version/);
    expect(fs.existsSync(path.join(dir, 'data'))).toBe(false);
  });
});
