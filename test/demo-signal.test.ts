// `seller-node demo` (npm start) run as a user runs it: the curl line it prints works and is
// answered with a receipt that verifies, and Ctrl-C stops all three parts, exits 0 and removes the
// demo's temporary folder. A second Ctrl-C while it stops ends it at once, by SIGINT (the folder goes too).
// Each demo gets a TMPDIR of its own, so the folder it makes there (os.tmpdir()) is found without
// looking at anyone else's.
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, test } from 'vitest';
import { serializeEnvelope, type DsseEnvelope } from '../attestation/dsse.ts';
import { verifyReceipt } from '../attestation/receipt-verify.ts';
import { assertCliBuilt } from './helpers/cli-run.ts';
import { killLeftCliProcesses, spawnCli, waitForStdout, type CliProcess } from './helpers/cli-process.ts';
import { removeTemp, tempDir } from './helpers/tamper-log.ts';
import { waitFor } from './helpers/wait.ts';

const STOPPING = 'seller-node demo: SIGINT: stopping gateway, node (in-flight requests finish, receipts flushed), marketplace\n';

const tmps: string[] = [];
beforeAll(assertCliBuilt);
afterAll(() => {
  killLeftCliProcesses();
  tmps.forEach(removeTemp);
});

/** A demo on a free port, with its own TMPDIR; once it says it runs: its printed curl line and the folder it made. */
async function startDemo(): Promise<{ demo: CliProcess; curl: string; provider: string; gateway: string; folder: string; tmp: string }> {
  const tmp = tempDir('seller-node-demo-test-');
  tmps.push(tmp);
  const demo = spawnCli(['demo', '--port', '0'], { env: { TMPDIR: tmp } });
  await waitForStdout(demo, 'the demo to run', /^Ctrl-C stops all three\.$/m);
  const out = demo.stdout();
  const curl = /^ {2}(curl .*\/chat\/completions .*)$/m.exec(out)?.[1];
  const provider = /^node\s+provider ([0-9a-f]{64}),/m.exec(out)?.[1];
  const gateway = /^gateway\s+(http:\/\/127\.0\.0\.1:\d+\/v1)$/m.exec(out)?.[1];
  if (!curl || !provider || !gateway) throw new Error(`no curl line, provider or gateway URL in what it printed:\n${out}`);
  // The one folder it made in its TMPDIR, holding the node's key and the model.
  const made = fs.readdirSync(tmp).filter((f) => f.startsWith('seller-node-demo-'));
  if (made.length !== 1) throw new Error(`expected one seller-node-demo-* folder in its TMPDIR, found ${JSON.stringify(made)}`);
  const folder = path.join(tmp, made[0]!);
  for (const f of ['node.key', 'tiny.gguf']) if (!fs.existsSync(path.join(folder, f))) throw new Error(`${folder} has no ${f}: not the demo's folder`);
  return { demo, curl, provider, gateway, folder, tmp };
}

/** The parts of `curl -s URL -H 'name: value' -d 'body'` (single-quoted, as a shell reads them: no quote inside). */
function parseCurl(line: string): { url: string; header: [string, string]; body: string } {
  const m = /^curl -s (http:\/\/\S+) -H '([^':]+): ([^']*)' -d '([^']*)'$/.exec(line);
  if (!m) throw new Error(`not a curl line of the expected shape: ${line}`);
  return { url: m[1]!, header: [m[2]!, m[3]!], body: m[4]! };
}

describe.concurrent('seller-node demo', () => {
  test('the printed curl line is answered with a verifiable receipt; SIGINT stops it, exit 0, its temporary folder removed', async ({ expect }) => {
    const { demo, curl, provider, gateway, folder, tmp } = await startDemo();
    const ask = parseCurl(curl);
    expect(ask.url).toBe(`${gateway}/chat/completions`);
    const res = await fetch(ask.url, { method: 'POST', headers: { [ask.header[0]]: ask.header[1] }, body: ask.body });
    const text = await res.text();
    expect(res.status, text).toBe(200);
    const body = JSON.parse(text) as { choices: { message: { content: string } }[]; usage: { completion_tokens: number }; service: { request_id: string; receipt: DsseEnvelope } };
    expect(body.choices[0]!.message.content.length).toBeGreaterThan(0);
    const v = verifyReceipt(serializeEnvelope(body.service.receipt), { provider });
    if (!v.ok) throw new Error(`the receipt does not verify: ${v.error.code}: ${v.error.message}`);
    expect(v.value.payload).toMatchObject({ provider, request_id: body.service.request_id, model: 'tiny/llama', status: 'completed', usage: { output_tokens: body.usage.completion_tokens } });

    demo.child.kill('SIGINT');
    expect(await demo.exited, demo.stderr()).toBe(0);
    expect(demo.stderr()).toContain(STOPPING);
    expect(demo.stderr()).not.toContain('stop failed');
    expect(fs.existsSync(folder)).toBe(false);
    expect(fs.readdirSync(tmp)).toEqual([]); // nothing else of it left in its TMPDIR either
  });

  test('a second SIGINT while it stops ends it at once by SIGINT, its temporary folder removed all the same', async ({ expect }) => {
    const { demo, gateway, folder } = await startDemo();
    // A request whose body never finishes arriving holds the gateway's stop (it waits for requests
    // under way, up to its grace of seconds), so the second signal comes while the stop runs. Its
    // "100 Continue" says the gateway has the request under way (an idle connection would just be closed).
    const { hostname, port } = new URL(gateway);
    const held = net.connect(Number(port), hostname);
    held.on('error', () => {});
    let answer = '';
    held.on('data', (d: Buffer) => (answer += d.toString()));
    held.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: ${hostname}:${port}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n`);
    try {
      await waitFor('100 Continue', () => (answer.startsWith('HTTP/1.1 100 Continue\r\n') ? true : undefined));
      held.write('{"model":');
      demo.child.kill('SIGINT');
      await waitFor('the stopping line', () => (demo.stderr().includes(STOPPING) ? true : undefined));
      demo.child.kill('SIGINT');
      expect(await demo.exited, demo.stderr()).toBe('SIGINT');
      expect(demo.stderr()).toContain('seller-node demo: SIGINT again: exiting now\n');
      expect(demo.stderr()).not.toContain('stopped already');
      expect(fs.existsSync(folder)).toBe(false);
    } finally {
      held.destroy();
    }
  });
});
