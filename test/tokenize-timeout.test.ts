// models[].tokenize_timeout_s reaches the running node: a long text that llama.cpp's tokenizer
// takes longer than that over is refused 400 input_too_complex, naming the deadline, and the node
// goes on tokenising the next request.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, expect, test } from 'vitest';
import { toHex, utf8 } from '../attestation/bytes.ts';
import { ed25519PublicKey } from '../attestation/ed25519.ts';
import { parseConfig } from '../src/config.ts';
import { startNode, type RunningNode } from '../src/node.ts';
import { createHost, type Host } from '../src/p2p/host.ts';
import { INFER_PROTOCOL } from '../src/p2p/infer-protocol.ts';
import { readResponse, request } from '../src/p2p/request-stream.ts';
import { createKeyFile } from '../src/identity.ts';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';

const home = fs.mkdtempSync(path.join(os.tmpdir(), 'tokenize-timeout-'));
let node: RunningNode | undefined;
let buyer: Host | undefined;
afterAll(async () => {
  await buyer?.stop();
  await node?.stop(1000);
  fs.rmSync(home, { recursive: true, force: true });
});

test('tokenize_timeout_s: a text the tokenizer takes longer over is 400 input_too_complex within that deadline; the next request is answered', async () => {
  createKeyFile(path.join(home, 'node.key'));
  writeTinyLlama(path.join(home, 'tiny.gguf'));
  const market = toHex(ed25519PublicKey(new Uint8Array(crypto.randomBytes(32))));
  const yaml = tinyNodeConfigYaml({ publicKey: market, logLevel: 'fatal' }).replace('    prices', '    tokenize_timeout_s: 1\n    prices');
  const config = parseConfig(yaml, home);
  expect(config.models[0]!.tokenize_timeout_s).toBe(1);
  node = await startNode(config);
  buyer = await createHost({ seed: new Uint8Array(crypto.randomBytes(32)), listen: [] });
  const ask = async (prompt: string) => {
    const r = await readResponse(await request(buyer!, node!.addresses[0]!, INFER_PROTOCOL, { endpoint: 'tokenize' }, utf8(JSON.stringify({ model: 'tiny/llama', prompt }))));
    // (an answer is the body; a refusal, the trailer)
    return { status: r.head.status, body: r.body.length ? (JSON.parse(Buffer.from(r.body).toString('utf8')) as Record<string, unknown>) : r.trailer };
  };
  // ~5 s of llama.cpp's tokenizer here (quadratic in runs of characters it has no token for).
  const slow = await ask('é'.repeat(200_000));
  expect(slow.status).toBe(400);
  expect(slow.body).toMatchObject({ error: { code: 'input_too_complex', message: expect.stringMatching(/was not tokenised within 1 s/) } });
  // The second of node time the refused text took counts against free work's share (25 %): the
  // next free request is told when to come back, and is then answered.
  const busy = await ask('hello world');
  expect(busy).toMatchObject({ status: 503, body: { error: { code: 'no_capacity' } } });
  const wait = Number(/try again in (\d+) ms/.exec(JSON.stringify(busy.body))![1]);
  expect(wait).toBeLessThanOrEqual(6000);
  await new Promise((r) => setTimeout(r, wait + 50));
  const ok = await ask('hello world');
  expect(ok.status).toBe(200);
  expect(ok.body).toMatchObject({ model: 'tiny/llama', count: expect.any(Number) });
}, 60_000);
