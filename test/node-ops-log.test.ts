// The ops HTTP server logs through the node's logger: its requests at debug, with the component
// named (s29 review: it was started without one and logged nothing, a failing callback included).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { parseConfig } from '../src/config.ts';
import { createKeyFile } from '../src/identity.ts';
import { startNode } from '../src/node.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { testKey } from './helpers/receipts.ts';

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'node-ops-log-'));
afterAll(() => fs.rmSync(home, { recursive: true, force: true }));

test('at log level debug, each ops request is a line naming the component, path and status', async () => {
  createKeyFile(path.join(home, 'node.key'));
  writeTinyLlama(path.join(home, 'tiny.gguf'));
  const logFile = path.join(home, 'node.log');
  const fd = fs.openSync(logFile, 'w');
  const node = await startNode(parseConfig(tinyNodeConfigYaml({ publicKey: testKey().id, logLevel: 'debug' }), home), { logDestination: fd });
  try {
    expect((await fetch(`${node.opsUrl}/healthz`)).status).toBe(200);
    expect((await fetch(`${node.opsUrl}/nowhere`)).status).toBe(404);
  } finally {
    await node.stop(1000);
    fs.closeSync(fd);
  }
  const lines = fs.readFileSync(logFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);
  const ops = lines.filter((l) => l.msg === 'ops request');
  expect(ops).toContainEqual(expect.objectContaining({ level: 20, component: 'ops', method: 'GET', path: '/healthz', statusCode: 200 }));
  expect(ops).toContainEqual(expect.objectContaining({ component: 'ops', path: '/nowhere', statusCode: 404 }));
});
