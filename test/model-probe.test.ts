// What llama.cpp aborts on kills the process it runs in. The embedded runtime loads and runs a
// model in a child process first (adapters/model-probe.ts): a model that kills the child is
// refused, naming llama.cpp's assertion, and this process (the node) goes on. Verdicts that passed
// are kept by the file's hash, in the data dir and for the process: a restart does not probe again.
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, test } from 'vitest';
import { u32 } from '../adapters/gguf/gguf-writer.ts';
import { writeTinyLlama, type TinyLlamaOptions } from '../adapters/gguf/tiny-llama.ts';
import { LlamaEmbeddedAdapter } from '../adapters/llama-embedded.ts';
import { crashLine, PROBE_CHILD, probeModel, type ProbeMemo } from '../adapters/model-probe.ts';
import { parseConfig } from '../src/config.ts';
import { createKeyFile } from '../src/identity.ts';
import { dataDirProbeMemo, PROBE_MEMO_FILE } from '../src/model-probe-memo.ts';
import { NodeStartError, startNode } from '../src/node.ts';
import { assertCliBuilt, runCli } from './helpers/cli-run.ts';
import { tinyNodeConfigYaml } from './helpers/node-config.ts';
import { stopProbeChild } from './helpers/probe-child.ts';
import { waitFor } from './helpers/wait.ts';
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

describe('the probe itself', () => {
  test('its child is where the built and the source tree put it; a child that cannot run refuses the model (nothing is loaded unprobed)', async () => {
    expect(fs.existsSync(PROBE_CHILD)).toBe(true);
    const good = path.join(dir, 'probe-good.gguf');
    writeTinyLlama(good);
    const missing = path.join(dir, 'no such folder', 'model-probe-child.js');
    const e = await probeModel({ modelPath: good, gpu: 'auto', mmap: false }, missing).then(() => undefined, (err: unknown) => err as Error);
    expect(e?.message.startsWith(`the model probe (${missing}) could not run: exit code 1: `)).toBe(true);
    expect(e?.message).toMatch(/Cannot find module.*; the node loads no model it could not probe$/);
    // A path with a space in it (an install folder) runs: the crasher is caught there too.
    const spaced = path.join(dir, 'with space');
    fs.symlinkSync(path.dirname(PROBE_CHILD), spaced);
    const crasher = path.join(dir, 'probe-crasher.gguf');
    writeTinyLlama(crasher, { edit: threeKvHeads });
    await expect(probeModel({ modelPath: crasher, gpu: 'auto', mmap: false }, path.join(spaced, path.basename(PROBE_CHILD)))).rejects.toThrow(/\(SIGABRT\): GGML_ASSERT\(ggml_can_mul_mat\(k, q\)\) failed/);
    expect(await probeModel({ modelPath: good, gpu: 'auto', mmap: false }, path.join(spaced, path.basename(PROBE_CHILD)))).toBe(true);
  });

  test('a model JavaScript refuses in the child (a truncated file) is not remembered; the node\'s own load says why', async () => {
    const file = path.join(dir, 'half.gguf');
    const whole = fs.readFileSync(path.join(dir, 'probe-good.gguf'));
    fs.writeFileSync(file, whole.subarray(0, whole.length >> 1));
    expect(await probeModel({ modelPath: file, gpu: 'auto', mmap: false })).toBe(false);
    const memo = memoOf();
    await expect(new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 256, probe: { memo } }).start()).rejects.toThrow(/half\.gguf: llama\.cpp could not load it: tensor '.*' data is not within the file bounds/);
    expect(memo.keys.size).toBe(0);
  });

  test('a file swapped after it was hashed: the probe ran on another file, the start is refused and its verdict not kept', async () => {
    const file = path.join(dir, 'swapped.gguf');
    writeTinyLlama(file, { edit: threeKvHeads }); // hashed as the crasher...
    const good = path.join(dir, 'swap-in.gguf');
    writeTinyLlama(good);
    const remembered: string[] = [];
    const memo: ProbeMemo = {
      known: () => (fs.renameSync(good, file), false), // ...then a good file renamed over it before the probe runs
      remember: (k) => void remembered.push(k),
    };
    await expect(new LlamaEmbeddedAdapter({ modelPath: file, contextLength: 256, probe: { memo } }).start()).rejects.toThrow(/changed while it was loaded and hashed/);
    expect(remembered).toEqual([]); // (had the crasher's hash been kept, its next start would abort the node)
  });

  test('the child ends when the process that probes goes (killed mid-probe)', async () => {
    const { spawn } = await import('node:child_process');
    // A model file that never finishes arriving (a FIFO no one writes): the child waits on it for ever.
    const fifo = path.join(dir, 'never.gguf');
    execFileSync('mkfifo', [fifo]);
    const script = path.join(dir, 'prober.ts');
    fs.writeFileSync(script, `import { probeModel } from ${JSON.stringify(path.resolve('adapters/model-probe.ts'))};\nawait probeModel({ modelPath: ${JSON.stringify(fifo)}, gpu: 'auto', mmap: false });\n`);
    const parent = spawn(process.execPath, [script], { stdio: 'ignore' });
    const childPid = await waitFor('the probe child', () => {
      try {
        return Number(execFileSync('pgrep', ['-P', String(parent.pid)], { encoding: 'utf8' }).trim().split('\n')[0]) || undefined;
      } catch {
        return undefined;
      }
    }, 10_000, 10);
    parent.kill('SIGKILL');
    await waitFor('the probe child to end', () => (fs.existsSync(`/proc/${childPid}`) && !/^State:\s+Z/m.test(fs.readFileSync(`/proc/${childPid}/status`, 'utf8')) ? undefined : true), 10_000);
  });

  test('the crash line: llama.cpp\'s assertion or abort message without the build path, a JavaScript heap exhaustion, or nothing', () => {
    expect(crashLine('/home/runner/work/x/llama.cpp/ggml/src/ggml.c:5455: GGML_ASSERT(ggml_can_mul_mat(k, q)) failed\n[backtrace]\n')).toBe(': GGML_ASSERT(ggml_can_mul_mat(k, q)) failed');
    expect(crashLine('/b/llama.cpp/src/llama-model.cpp:1234: fatal error: unsupported op\n')).toBe(': fatal error: unsupported op');
    expect(crashLine('<--- Last few GCs --->\nFATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory\n 1: 0xb8 node::Abort()')).toBe(': JavaScript heap out of memory');
    expect(crashLine('some earlier error: nothing to do with it\nSegmentation fault\n')).toBe('');
  });
});

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

  test('a probe slower than models[].probe_timeout_s refuses the start, naming the key that allows a slower load; the child is ended', async () => {
    const h = home('node-slow');
    const yaml = tinyNodeConfigYaml({ publicKey: '11'.repeat(32), logLevel: 'fatal' }).replace('    prices', '    probe_timeout_s: 1\n    prices');
    const config = parseConfig(yaml, h);
    expect(config.models[0]!.probe_timeout_s).toBe(1);
    const stopped = stopProbeChild(path.join(h, 'tiny.gguf')); // (a load that never finishes)
    const e = await startNode(config).then(
      async (n) => void (await n.stop(1000)),
      (err: unknown) => err as Error,
    );
    expect(e).toBeInstanceOf(NodeStartError);
    expect(e!.message).toBe(`models: tiny/llama: the runtime could not start: model file ${path.join(h, 'tiny.gguf')}: llama.cpp did not load and run it within 1 s in a child process: the node would hang on it (models[0].probe_timeout_s, now 1, allows a slower load)`);
    const pid = await stopped;
    await waitFor('the stopped child to be gone', () => (fs.existsSync(`/proc/${pid}`) ? undefined : true), 10_000);
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

describe('seller-node check-model', () => {
  beforeAll(assertCliBuilt);

  test('a model start would serve: exit 0, its hash, runtime and context; one it would refuse: exit 1, why, no stack; bad usage: exit 2', async () => {
    const good = path.join(dir, 'check-good.gguf');
    writeTinyLlama(good);
    const ok = await runCli(['check-model', good, '--context', '256']);
    expect([ok.code, ok.stderr]).toEqual([0, '']);
    const sha = crypto.createHash('sha256').update(fs.readFileSync(good)).digest('hex');
    expect(ok.stdout).toBe(`${good}: would be served\n  sha256 ${sha}\n  runtime ${ok.stdout.match(/runtime (\S+)/)![1]}\n  context 256, embedding length 64\n  chat template yes\n`);
    expect(ok.stdout).toMatch(/runtime node-llama-cpp\/\d+\.\d+\.\d+\/prebuilt\/cpu\n/);

    const crasher = path.join(dir, 'check-crasher.gguf');
    writeTinyLlama(crasher, { edit: threeKvHeads });
    const refused = await runCli(['check-model', crasher]);
    expect(refused.code).toBe(1);
    expect(refused.stdout).toBe('');
    expect(refused.stderr).toContain(`seller-node: model file ${crasher}: llama.cpp crashed loading or running it in a child process (SIGABRT): GGML_ASSERT(ggml_can_mul_mat(k, q)) failed`);
    expect(refused.stderr).not.toMatch(/\n\s+at /);

    const fifo = path.join(dir, 'check.fifo');
    execFileSync('mkfifo', [fifo]);
    const piped = await runCli(['check-model', fifo], { timeoutMs: 20_000 });
    expect([piped.code, piped.stderr]).toEqual([1, `seller-node: model file ${fifo} is not a regular file (a FIFO), not a model file\n`]);
    const missing = await runCli(['check-model', path.join(dir, 'nope.gguf')]);
    expect([missing.code, missing.stderr]).toEqual([1, `seller-node: model file ${path.join(dir, 'nope.gguf')} not found\n`]);
    expect((await runCli(['check-model', good, '--gpu', 'cuda'])).code).toBe(2);
    for (const bad of ['0', '86401', 'soon']) expect((await runCli(['check-model', good, '--probe-timeout', bad])).code).toBe(2);
  }, 60_000);

  test('--probe-timeout S bounds the load and run in a child process; a slower one is refused, saying how to allow it', async () => {
    const slow = path.join(dir, 'check-slow.gguf');
    writeTinyLlama(slow);
    const stopped = stopProbeChild(slow);
    const refused = await runCli(['check-model', slow, '--probe-timeout', '1']);
    await stopped;
    expect([refused.code, refused.stdout]).toEqual([1, '']);
    expect(refused.stderr).toBe(`seller-node: model file ${slow}: llama.cpp did not load and run it within 1 s in a child process: the node would hang on it (--probe-timeout S allows a slower load)\n`);
    const ok = await runCli(['check-model', slow, '--probe-timeout', '60', '--context', '256']);
    expect([ok.code, ok.stderr]).toEqual([0, '']);
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
    // Not a regular file of a sane size: counted as empty at once (s21 h2: /dev/zero ran a start out of memory; a FIFO blocked it).
    fs.rmSync(file);
    fs.symlinkSync('/dev/zero', file);
    expect(dataDirProbeMemo(d).known('from-disk')).toBe(false);
    fs.rmSync(file);
    execFileSync('mkfifo', [file]);
    expect(dataDirProbeMemo(d).known('from-disk')).toBe(false);
    fs.rmSync(file);
    fs.writeFileSync(file, JSON.stringify({ v: 1, passed: ['from-disk', 'x'.repeat(1 << 20)] }));
    expect(dataDirProbeMemo(d).known('from-disk')).toBe(false);
    // A data dir that went away: remember does not throw (the next start probes again).
    expect(() => dataDirProbeMemo(path.join(d, 'gone')).remember('k-x')).not.toThrow();
  });
});
