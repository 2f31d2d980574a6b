// What llama.cpp aborts on kills the process it runs in. The embedded runtime loads and runs a
// model in a child process first (adapters/model-probe.ts): a model that kills the child is
// refused, naming llama.cpp's assertion, and this process (the node) goes on. Verdicts that passed
// are kept by the file's hash, in the data dir and for the process: a restart does not probe again.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { u32 } from '../adapters/gguf/gguf-writer.ts';
import { writeTinyLlama, type TinyLlamaOptions } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import type { ProbeMemo } from '../adapters/model-probe.ts';
import { parseConfig } from '../src/config.ts';
import { createKeyFile } from '../src/identity.ts';
import { dataDirProbeMemo, PROBE_MEMO_FILE } from '../src/model-probe-memo.ts';
import { NodeStartError, startNode } from '../src/node.ts';
import { assertCliBuilt } from './helpers/cli-run.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { killLeftNodes, spawnNode, waitForStart } from './helpers/node-process.ts';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'model-probe-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

/**
 * The tiny model with 3 kv heads to its 4 query heads, the kv weights shaped to match: every check
 * before llama.cpp passes it, and llama.cpp aborts building its first graph
 * (GGML_ASSERT(ggml_can_mul_mat(k, q))), which a node running it in-process would not survive.
 */
const threeKvHeads: TinyLlamaOptions['edit'] = (m) => {
  const i = m.metadata.findIndex((k) => k.key === 'llama.attention.head_count_kv');
  m.metadata[i] = { key: 'llama.attention.head_count_kv', value: u32(3) };
  for (const [j, t] of m.tensors.entries()) if (/attn_[kv]\.weight$/.test(t.name)) m.tensors[j] = { ...t, dims: [64, 48], data: t.data.subarray(0, 64 * 48) };
};

const memoOf = (): ProbeMemo & { keys: Set<string> } => {
  const keys = new Set<string>();
  return { keys, known: (k) => keys.has(k), remember: (k) => void keys.add(k) };
};

describe('the embedded runtime with a probe', () => {
  test('a model llama.cpp aborts on is refused, naming the assertion; nothing is remembered, and this process is still here', async () => {
    const file = path.join(dir, 'three-kv.gguf');
    writeTinyLlama(file, { edit: threeKvHeads });
    const memo = memoOf();
    const rt = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 256, probe: { memo } });
    await expect(rt.start()).rejects.toThrow(`${file}: llama.cpp crashed loading or running it in a child process (SIGABRT): GGML_ASSERT(ggml_can_mul_mat(k, q)) failed: the node would have died with it`);
    expect(memo.keys.size).toBe(0);
    expect(rt.info.modelSha256).toBe(''); // not started
  });

  test('a model that passed is remembered by its hash: the next start does not probe (a probe that cannot finish in 1 ms would refuse it)', async () => {
    const file = path.join(dir, 'good.gguf');
    writeTinyLlama(file);
    const memo = memoOf();
    const first = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 256, probe: { memo } });
    await first.start();
    await first.stop();
    expect(memo.keys.size).toBe(1);
    const sha = crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');
    expect([...memo.keys][0]).toContain(sha);

    const hurried = { memo, timeoutMs: 1 };
    const again = new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 256, probe: hurried });
    await again.start();
    await again.stop();
    // Another file (other weights): not known, probed, and 1 ms is not enough.
    const other = path.join(dir, 'other.gguf');
    writeTinyLlama(other, { seed: 9 });
    const fresh = new LlamaEmbeddedAdapter({ modelPath: other, contextLength: 256, probe: hurried });
    await expect(fresh.start()).rejects.toThrow(`${other}: llama.cpp did not load and run it within 0.001 s in a child process: the node would hang on it`);
  });
});

/** A node's folder: its key and the tiny model (changed by `edit`). */
const home = (name: string, edit?: TinyLlamaOptions['edit']): string => {
  const h = path.join(dir, name);
  fs.mkdirSync(h);
  createKeyFile(path.join(h, 'node.key'));
  writeTinyLlama(path.join(h, 'tiny.gguf'), edit ? { edit } : {});
  return h;
};

describe('the node', () => {

  test('refuses to start on a model llama.cpp aborts on, naming the model, the file and the assertion', async () => {
    const h = home('node-abort', threeKvHeads);
    const e = await startNode(parseConfig(tinyNodeConfigYaml({ publicKey: '11'.repeat(32), logLevel: 'fatal' }), h)).then(
      async (n) => void (await n.stop(1000)),
      (err: unknown) => err as Error,
    );
    expect(e).toBeInstanceOf(NodeStartError);
    expect(e!.message).toBe(`models: tiny/llama: the runtime could not start: model file ${path.join(h, 'tiny.gguf')}: llama.cpp crashed loading or running it in a child process (SIGABRT): GGML_ASSERT(ggml_can_mul_mat(k, q)) failed: the node would have died with it`);
    expect(fs.existsSync(path.join(h, 'data', PROBE_MEMO_FILE))).toBe(false);
  });

  test('keeps the verdict of a model that passed in its data dir (mode 0600), by the model\'s hash', async () => {
    const h = home('node-ok');
    const node = await startNode(parseConfig(tinyNodeConfigYaml({ publicKey: '11'.repeat(32), logLevel: 'fatal' }), h));
    await node.stop(1000);
    const file = path.join(h, 'data', PROBE_MEMO_FILE);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    const kept = JSON.parse(fs.readFileSync(file, 'utf8')) as { v: number; passed: string[] };
    const sha = crypto.createHash('sha256').update(fs.readFileSync(path.join(h, 'tiny.gguf'))).digest('hex');
    expect(kept.v).toBe(1);
    expect(kept.passed).toHaveLength(1);
    expect(JSON.parse(kept.passed[0]!)[0]).toBe(sha);
  });
});

describe('seller-node start, as an operator restarts it', () => {
  afterEach(killLeftNodes);
  beforeAll(assertCliBuilt);

  /** Starts the CLI on `h`, stops it (SIGTERM) once it listens; resolves with its "model ready" log line. */
  async function startStop(h: string): Promise<Record<string, unknown>> {
    const child = spawnNode(path.join(h, 'config.yaml'));
    let log = ''; // (the node logs to stderr)
    child.stderr!.on('data', (d: Buffer) => (log += d.toString()));
    const exited = new Promise((r) => child.on('exit', r));
    await waitForStart(child);
    child.kill('SIGTERM');
    await exited;
    const line = log.split('\n').find((l) => l.includes('"model ready"'));
    return JSON.parse(line!) as Record<string, unknown>;
  }

  test('the first start probes the model (logged), a restart on the same file does not; a changed file is probed again', async () => {
    const h = home('cli');
    fs.writeFileSync(path.join(h, 'config.yaml'), tinyNodeConfigYaml({ publicKey: '11'.repeat(32), logLevel: 'info' }));
    expect(await startStop(h)).toMatchObject({ model: 'tiny/llama', probe: 'ran', runtime: expect.stringMatching(/^node-llama-cpp\/\d+\.\d+\.\d+\/prebuilt\/cpu$/) });
    expect(await startStop(h)).toMatchObject({ probe: 'remembered' });
    writeTinyLlama(path.join(h, 'tiny.gguf'), { seed: 5 }); // other weights: another hash
    expect(await startStop(h)).toMatchObject({ probe: 'ran' });
    expect((JSON.parse(fs.readFileSync(path.join(h, 'data', PROBE_MEMO_FILE), 'utf8')) as { passed: string[] }).passed).toHaveLength(2);
  }, 60_000);
});

describe('dataDirProbeMemo', () => {
  test('a file that is not its own counts as empty and is written anew; at most 64 verdicts; a file that cannot be written changes nothing', () => {
    const d = path.join(dir, 'memo');
    fs.mkdirSync(d);
    const file = path.join(d, PROBE_MEMO_FILE);
    fs.writeFileSync(file, 'not json');
    const memo = dataDirProbeMemo(d);
    expect(memo.known('a-key-never-seen')).toBe(false);
    memo.remember('k0');
    expect(JSON.parse(fs.readFileSync(file, 'utf8'))).toEqual({ v: 1, passed: ['k0'] });
    for (let i = 1; i <= 70; i++) memo.remember(`k${i}`);
    const passed = (JSON.parse(fs.readFileSync(file, 'utf8')) as { passed: string[] }).passed;
    expect([passed.length, passed[0], passed.at(-1)]).toEqual([64, 'k7', 'k70']);
    // Known from the file by a memo of another process (this one's own is fresh in each test file).
    fs.writeFileSync(file, JSON.stringify({ v: 1, passed: ['from-disk'] }));
    expect(dataDirProbeMemo(d).known('from-disk')).toBe(true);
    // A data dir that went away: remember does not throw (the next start probes again).
    expect(() => dataDirProbeMemo(path.join(d, 'gone')).remember('k-x')).not.toThrow();
  });
});
