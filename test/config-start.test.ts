// `seller-node start` with a listen address the node cannot listen on: refused as a config error
// naming the entry, before anything starts (no model loaded, no data folder made).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { createKeyFile } from '../src/identity.ts';
import { assertCliBuilt, runCli } from './helpers/cli-run.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { testKey } from './helpers/receipts.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'config-start-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
beforeAll(() => {
  assertCliBuilt();
  createKeyFile(path.join(dir, 'node.key'));
  writeTinyLlama(path.join(dir, 'tiny.gguf'));
});

// A node that would start (key, model, free ports) but for its listen address; logging at info, so
// a model that loaded would say "model ready" on stderr.
const config = (listen: string) =>
  tinyNodeConfigYaml({ publicKey: testKey().id, logLevel: 'info' }).replace('listen: [/ip4/127.0.0.1/tcp/0]', `listen: [${listen}]`);

describe('seller-node start: listen addresses', () => {
  const expected = 'expected a TCP multiaddr like /ip4/0.0.0.0/tcp/4101 or /ip6/::/tcp/4101';
  test.each([
    ['/foo/bar', `not a multiaddr: Protocol foo was unknown (${expected})`],
    ['/ip4/127.0.0.1/udp/1', `/ip4/127.0.0.1/udp/1: the node listens with TCP only: ${expected}`],
  ])('listen: [%s] exits 1 naming listen[0] before the model loads', async (listen, problem) => {
    const file = path.join(dir, 'config.yaml');
    fs.writeFileSync(file, config(listen));
    expect(fs.readFileSync(file, 'utf8')).toContain(`listen: [${listen}]`);
    const r = await runCli(['start', '--config', file]);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(`seller-node: config: listen[0]: ${problem}\n`);
    expect(fs.existsSync(path.join(dir, 'data'))).toBe(false);
  });

  test('SELLER_NODE_LISTEN is checked the same way, naming the variable', async () => {
    const file = path.join(dir, 'env.yaml');
    fs.writeFileSync(file, config('/ip4/127.0.0.1/tcp/0'));
    const r = await runCli(['start', '--config', file], { env: { SELLER_NODE_LISTEN: '["/ip4/127.0.0.1/udp/1"]' } });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^seller-node: config: listen\[0\]: \/ip4\/127\.0\.0\.1\/udp\/1: the node listens with TCP only: .*\(from environment variable SELLER_NODE_LISTEN\)\n$/);
    expect(fs.existsSync(path.join(dir, 'data'))).toBe(false);
  });
});
