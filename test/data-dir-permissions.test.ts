// A data dir or an export this user may not use (the usual cause: `sudo seller-node init`, then
// the service runs as itself): every command names the file and says "permission denied", never
// "not found", "holds no receipt log", SQLite's "unable to open database file" or a stack trace.
// As root, the CLI runs as nobody (uid 65534); otherwise as this user, kept out by chmod 000.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { assertCliBuilt, runCli, STACK_TRACE, type CliResult } from './helpers/cli-run.ts';

const ROOT = process.getuid?.() === 0;
const other = ROOT ? { uid: 65534, gid: 65534 } : {};
const otherUid = ROOT ? 65534 : process.getuid!();
const DENIED = `permission denied to this user (uid ${otherUid}): run seller-node as the user who owns it, or change its permissions`;

let tmp: string;
let data: string;
let exp: string;

const asOther = (args: string[]): Promise<CliResult> => runCli(args, { ...other, cwd: tmp });

function expectRefused(r: CliResult, stderr: string): void {
  expect(r.stderr).toBe(`seller-node: ${stderr}\n`);
  expect(r.code).toBe(1);
  expect(r.stderr).not.toMatch(STACK_TRACE);
}

/** Runs `f` with `file` at `mode`, then puts its mode back. */
async function withMode(file: string, mode: number, f: () => Promise<void>): Promise<void> {
  const before = fs.statSync(file).mode & 0o7777;
  fs.chmodSync(file, mode);
  try {
    await f();
  } finally {
    fs.chmodSync(file, before);
  }
}

beforeAll(async () => {
  assertCliBuilt();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'seller-node-perm-'));
  fs.chmodSync(tmp, 0o755); // (others may enter: only what a case closes is closed)
  data = path.join(tmp, 'data');
  exp = path.join(tmp, 'export');
  for (const args of [['dev-model', '--out', path.join(tmp, 'tiny.gguf')], ['init', '--data', data], ['log', 'fill', '--data', data, '--count', '3'], ['log', 'export', '--data', data, '--out', exp]]) {
    const r = await runCli(args);
    expect(r.code, r.stderr).toBe(0);
  }
  fs.writeFileSync(path.join(tmp, 'node.yaml'), `key: ${data}/node.key\ndata_dir: ${data}\nlisten: [/ip4/127.0.0.1/tcp/0]\nops: { http: "127.0.0.1:0" }\nmodels:\n  - id: tiny/llama\n    adapter: llama-embedded\n    path: ${tmp}/tiny.gguf\n    prices: { input_per_mtok_usd: "0.1", output_per_mtok_usd: "0.2" }\n`, { mode: 0o644 });
}, 60_000);

afterAll(() => {
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

describe('a data dir this user may not enter', () => {
  test('every command that uses it names the file and says permission denied', async () => {
    await withMode(data, 0o000, async () => {
      expectRefused(await asOther(['start', '--config', path.join(tmp, 'node.yaml')]), `key file ${data}/node.key: ${DENIED}`);
      expectRefused(await asOther(['log', 'export', '--data', data, '--out', path.join(tmp, 'out-a')]), `key file ${data}/node.key: ${DENIED}`);
      expectRefused(await asOther(['log', 'prove', '--data', data, '--seq', '0']), `${data}/receipts.db: ${DENIED}`);
      expectRefused(await asOther(['log', 'fill', '--data', data, '--count', '1']), `${data}/node.lock: ${DENIED}`);
      expectRefused(await asOther(['init', '--data', path.join(data, 'sub')]), `--data ${data}/sub: ${DENIED}`);
    });
    expect(fs.existsSync(path.join(tmp, 'out-a'))).toBe(false);
  });
});

describe('a data dir to be made where this user may not write', () => {
  test('start, market and init name the folder that refused, not the one that does not exist', async () => {
    const locked = path.join(tmp, 'locked');
    fs.mkdirSync(locked, { mode: 0o755 });
    await withMode(locked, ROOT ? 0o755 : 0o555, async () => {
      const yaml = path.join(tmp, 'locked.yaml');
      fs.writeFileSync(yaml, fs.readFileSync(path.join(tmp, 'node.yaml'), 'utf8').replace(`data_dir: ${data}`, `data_dir: ${locked}/new/data`), { mode: 0o644 });
      const key = path.join(data, 'node.key');
      if (ROOT) fs.chownSync(key, 65534, 65534);
      try {
        await withMode(data, 0o755, async () => {
          expectRefused(await asOther(['start', '--config', yaml]), `data_dir: ${locked}/new/data: it cannot be made: this user (uid ${otherUid}) may not write in ${locked}`);
        });
      } finally {
        if (ROOT) fs.chownSync(key, 0, 0);
      }
      expectRefused(await asOther(['market', '--data', `${locked}/m`, '--listen', '127.0.0.1:0']), `cannot use --data ${locked}/m: it cannot be made: this user (uid ${otherUid}) may not write in ${locked}`);
      expectRefused(await asOther(['init', '--data', `${locked}/i`]), `--data ${locked}/i: it cannot be made: this user (uid ${otherUid}) may not write in ${locked}`);
    });
  });
});

describe('a config file this user may not read (the `sudo seller-node init` case)', () => {
  test('start names it and says permission denied', async () => {
    await withMode(path.join(tmp, 'node.yaml'), 0o000, async () => {
      expectRefused(await asOther(['start', '--config', path.join(tmp, 'node.yaml')]), `config: cannot read ${path.join(tmp, 'node.yaml')}: ${DENIED}`);
    });
  });
});

describe('a data dir this user may read but not write', () => {
  test('start, log export and log prove name the file or folder they cannot write', async () => {
    const key = path.join(data, 'node.key');
    if (ROOT) fs.chownSync(key, 65534, 65534); // (the key this user's own; the rest not)
    try {
      await withMode(path.join(data, 'node.lock'), 0o444, async () => {
        await withMode(data, 0o777, async () => {
          // A lock file it may only read: refused, naming it (the folder is another user's).
          expectRefused(await asOther(['start', '--config', path.join(tmp, 'node.yaml')]), `data_dir: ${data}/node.lock: ${DENIED}`);
        });
      });
      await withMode(path.join(data, 'receipts.db'), 0o444, async () => {
        await withMode(data, 0o555, async () => {
          expectRefused(await asOther(['start', '--config', path.join(tmp, 'node.yaml')]), `data_dir: ${data}: this user (uid ${otherUid}) may not write in it`);
          // (Not SQLite's "attempt to write a readonly database", once the log is open.)
          expectRefused(await asOther(['log', 'export', '--data', data, '--out', path.join(tmp, 'out-b')]), `${data}/receipts.db: ${DENIED}`);
          expectRefused(await asOther(['log', 'prove', '--data', data, '--seq', '0']), `${data}/receipts.db: ${DENIED}`);
        });
      });
    } finally {
      if (ROOT) fs.chownSync(key, process.getuid!(), process.getgid!());
    }
    // Nothing was harmed: the owner still exports and audits it clean.
    const again = await runCli(['log', 'export', '--data', data, '--out', path.join(tmp, 'out-c')]);
    expect(again.code, again.stderr).toBe(0);
    const audit = await runCli(['audit', path.join(tmp, 'out-c')]);
    expect(audit.code, audit.stdout).toBe(0);
  });
});

describe('an export this user may not read', () => {
  test.each([
    ['the folder', () => exp],
    ['provider.pub', () => path.join(exp, 'provider.pub')],
    ['receipts.jsonl', () => path.join(exp, 'receipts.jsonl')],
  ])('%s: export_unreadable naming it, not a missing or malformed file', async (_what, file) => {
    await withMode(file(), 0o000, async () => {
      const r = await asOther(['audit', exp]);
      expect(r.code, r.stderr).toBe(1);
      expect(r.stdout).toMatch(new RegExp(`^FAIL: export_unreadable: ${file().replace(/[.]/g, '\\.')}: permission denied to this user \\(uid ${otherUid}\\)`, 'm'));
      const j = await asOther(['audit', exp, '--json']);
      expect((JSON.parse(j.stdout) as { ok: boolean; fault: { code: string } })).toMatchObject({ ok: false, fault: { code: 'export_unreadable' } });
    });
  });
});

describe('files and folders this user may not use, in every other command', () => {
  test('verify, audit --replay, market --data, dev-model --out and start name the file and say permission denied', async () => {
    const closed = path.join(tmp, 'closed');
    fs.mkdirSync(closed, { mode: 0o700 });
    fs.writeFileSync(path.join(closed, 'r.json'), '{}');
    await withMode(closed, 0o000, async () => {
      const file = path.join(closed, 'r.json');
      expectRefused(await asOther(['verify', file]), `cannot read ${file}: ${DENIED}`);
      expectRefused(await asOther(['audit', exp, '--replay', '--model', path.join(tmp, 'tiny.gguf'), '--requests', file]), `cannot read --requests ${file}: ${DENIED}`);
      expectRefused(await asOther(['market', '--data', path.join(closed, 'market'), '--listen', '127.0.0.1:0']), `cannot use --data ${path.join(closed, 'market')}: ${DENIED}`);
      expectRefused(await asOther(['dev-model', '--out', path.join(closed, 'm.gguf')]), `cannot write --out ${path.join(closed, 'm.gguf')}: ${DENIED}`);
      // (a key of this user's own, outside: the data dir is what is refused)
      const key = path.join(tmp, 'own.key');
      fs.copyFileSync(path.join(data, 'node.key'), key);
      if (ROOT) fs.chownSync(key, 65534, 65534);
      fs.writeFileSync(path.join(tmp, 'node-closed.yaml'), fs.readFileSync(path.join(tmp, 'node.yaml'), 'utf8').replace(`data_dir: ${data}`, `data_dir: ${closed}/data`).replace(`key: ${data}/node.key`, `key: ${key}`));
      expectRefused(await asOther(['start', '--config', path.join(tmp, 'node-closed.yaml')]), `data_dir: ${closed}/data: ${DENIED}`);
    });
  });
});
