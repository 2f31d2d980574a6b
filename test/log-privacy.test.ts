// No prompt or output text in the logs (the product rule in src/ops/logger.ts), checked on real
// processes: `seller-node market`, `seller-node start` at log_level trace and `seller-node gateway
// --log-level trace` serve a chat request, whole and streamed, and nothing any of them wrote holds
// the prompt or a piece of the answers, while each did log the requests (by id).
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { writeTinyLlama } from '../adapters/gguf/tiny-llama.ts';
import { createKeyFile } from '../src/identity.ts';
import { assertCliBuilt } from './helpers/cli-run.ts';
import { killLeftCliProcesses, spawnCli, waitForStdout, type CliProcess } from './helpers/cli-process.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';
import { waitFor, waitForListed } from './helpers/wait.ts';

// Words of the tiny model's vocabulary (adapters/gguf/tiny-llama.ts), in an order no log line has.
const PROMPT = 'yesterday queen believe seven hundred yellow receipt through important morning music';
const MODEL = 'tiny/llama';

const dir = tempDir('seller-node-log-privacy-');
beforeAll(assertCliBuilt);
afterAll(() => {
  killLeftCliProcesses();
  removeTemp(dir);
});

/** Everything a process wrote, both streams. */
const written = (p: CliProcess): string => p.stdout() + p.stderr();

/** `text` as it appears raw and inside a JSON string (a log line's quoting). */
const forms = (text: string): string[] => [text, JSON.stringify(text).slice(1, -1)];

/**
 * Pieces of generated text to look for: 16-character windows every 4 characters, printable ASCII
 * (as a leak would show them), each with at least 12 characters that are not spaces: the tiny
 * model's gibberish, so no log line holds one by chance.
 */
function needles(output: string): string[] {
  const out: string[] = [];
  for (let i = 0; i + 16 <= output.length; i += 4) {
    const w = output.slice(i, i + 16);
    if (/^[\x20-\x7e]+$/.test(w) && w.replace(/ /g, '').length >= 12) out.push(w);
  }
  return out;
}

/** The prompt and each run of three of its words. */
function promptNeedles(prompt: string): string[] {
  const words = prompt.split(' ');
  return [prompt, ...words.slice(0, -2).map((_, i) => words.slice(i, i + 3).join(' '))];
}

describe('log privacy, at the most verbose level', () => {
  test('market, node and gateway log each request by id, and never its prompt or any of its output', async () => {
    const market = spawnCli(['market', '--data', path.join(dir, 'market'), '--listen', '127.0.0.1:0']);
    const [, marketUrl, marketKey] = await waitForStdout(market, 'the market to start', /seller-node market: (http:\/\/\S+)\n\s+public key ([0-9a-f]{64})/);

    const home = path.join(dir, 'node');
    fs.mkdirSync(home);
    const { providerId } = createKeyFile(path.join(home, 'node.key'));
    writeTinyLlama(path.join(home, 'tiny.gguf'));
    fs.writeFileSync(path.join(home, 'config.yaml'), tinyNodeConfigYaml({ publicKey: marketKey!, marketUrl: marketUrl!, logLevel: 'trace' }));
    const node = spawnCli(['start', '--config', path.join(home, 'config.yaml')]);
    const [, ops] = await waitForStdout(node, 'the node to start', /^ {2}ops (\S+)$/m);
    await waitForListed(marketUrl!, [providerId]);

    const gateway = spawnCli(['gateway', '--market', marketUrl!, '--listen', '127.0.0.1:0', '--log-level', 'trace']);
    const [, gw] = await waitForStdout(gateway, 'the gateway to start', /listening (http:\/\/\S+)/);

    const ask = (extra: object) => fetch(`${gw}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: PROMPT }], max_tokens: 40, ...extra }) });
    // Whole.
    const whole = await ask({ seed: 1 });
    const wholeText = await whole.text();
    expect(whole.status, wholeText).toBe(200);
    const wholeBody = JSON.parse(wholeText) as { choices: { message: { content: string } }[]; service: { request_id: string } };
    const wholeOutput = wholeBody.choices[0]!.message.content;
    // Streamed: the deltas' text, and the request id from the closing chunk's service.
    const streamed = await ask({ seed: 2, stream: true });
    const sse = await streamed.text();
    expect(streamed.status, sse).toBe(200);
    const chunks = sse
      .split('\n')
      .filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
      .map((l) => JSON.parse(l.slice(6)) as { choices?: { delta?: { content?: string } }[]; service?: { request_id: string } });
    const streamOutput = chunks.map((c) => c.choices?.[0]?.delta?.content ?? '').join('');
    const streamId = chunks.find((c) => c.service)?.service?.request_id;
    const ids = [wholeBody.service.request_id, streamId!];
    expect(streamId).toMatch(/^req-/);
    expect(ids[0]).not.toBe(ids[1]);
    // (A debug line of the node's: its ops server logs each request at debug.)
    expect((await fetch(`${ops}/healthz`)).status).toBe(200);

    const outputNeedles = [...needles(wholeOutput), ...needles(streamOutput)];
    expect(needles(wholeOutput).length, wholeOutput).toBeGreaterThanOrEqual(3);
    expect(needles(streamOutput).length, streamOutput).toBeGreaterThanOrEqual(3);

    // Each logs both requests (the market: the receipts the gateway posts it after answering).
    await waitFor('each process to log both requests', () => ([market, node, gateway].every((p) => ids.every((id) => p.stderr().includes(id))) ? true : undefined));
    // Stopped, so that everything they would log is written (their stop lines too).
    for (const p of [gateway, node, market]) p.child.kill('SIGTERM');
    for (const p of [gateway, node, market]) expect(await p.exited, p.stderr()).toBe(0);

    const logs = { market: written(market), node: written(node), gateway: written(gateway) };
    // Captured, and at the level asked for: the node's log holds a debug line.
    expect(logs.node).toMatch(/"level":20\b/);
    for (const [name, text] of Object.entries(logs)) {
      for (const id of ids) expect(text, `${name} logged request ${id}`).toContain(id);
      for (const n of [...promptNeedles(PROMPT), ...outputNeedles]) {
        for (const f of forms(n)) expect(text.includes(f), `${name}'s output holds ${JSON.stringify(f)}`).toBe(false);
      }
    }
  });
});
