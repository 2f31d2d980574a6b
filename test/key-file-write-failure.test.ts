// A write refused for a size limit or a quota (EFBIG, EDQUOT) is said in words an operator can act
// on, like the other file system codes; and the node key, whose write fails after its file was
// created (a full disk, a quota, a file size limit), is not left behind empty or partial: such a file
// would block every later `init` as "already exists" and fail every start as "not a PEM private key".
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, describe, expect, test, vi } from 'vitest';
import { folderProblem, fsProblem, isErrnoError } from '../src/fs-problem.ts';
import { createKeyFile, IdentityError, loadKeyFile } from '../src/identity.ts';
import { REPO_ROOT } from './helpers/vectors.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'key-write-fail-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
afterEach(() => void vi.restoreAllMocks());

/** An error as Node's fs raises it for `code`. */
const errno = (code: string, syscall = 'write') => Object.assign(new Error(`${code}: ${syscall} failed`), { code, syscall, errno: -1 });
const LIMIT = 'the file system refused the write (a size limit or quota)';

describe('fsProblem: a size limit or a quota', () => {
  test.each(['EFBIG', 'EDQUOT'])('%s is said as a refused write (a size limit or quota), not as Node\'s terse message', (code) => {
    expect(fsProblem(errno(code))).toBe(LIMIT);
    expect(isErrnoError(errno(code))).toBe(true);
    expect(folderProblem(errno(code, 'mkdir'))).toBe(LIMIT);
  });

  test('the other codes keep their own words, and an unknown code falls back to the message', () => {
    expect(fsProblem(errno('ENOSPC'))).toBe('no space left on the device');
    expect(fsProblem(errno('EROFS'))).toBe('the file system is read-only');
    expect(fsProblem(errno('EIO'))).toBe('EIO: write failed');
    expect(fsProblem(null)).toBe('null');
  });

  test('a real EFBIG (the process\'s file size limit, SIGXFSZ ignored) gets those words', () => {
    const file = path.join(dir, 'big.bin');
    const script = `import { fsProblem } from ${JSON.stringify(path.join(REPO_ROOT, 'src', 'fs-problem.ts'))};
import fs from 'node:fs';
try { fs.writeFileSync(${JSON.stringify(file)}, 'x'); console.log('written'); } catch (e) { console.log(e.code + ' ' + fsProblem(e)); }`;
    const r = spawnSync('sh', ['-c', `trap '' XFSZ; ulimit -f 0; exec "${process.execPath}" --input-type=module -e "$0"`, script], { encoding: 'utf8' });
    expect(r.stdout.trim(), r.stderr).toBe(`EFBIG ${LIMIT}`);
  });
});

describe('createKeyFile: the write fails after the file was created', () => {
  test.each([
    ['the write refused for a size limit (EFBIG)', 'writeSync', 'EFBIG', LIMIT],
    ['the fsync refused for a quota (EDQUOT), the key already written', 'fsyncSync', 'EDQUOT', LIMIT],
    ['the disk full (ENOSPC)', 'writeSync', 'ENOSPC', 'no space left on the device'],
  ] as const)('%s: an IdentityError in words, nothing left behind, and the next try makes a key that loads', (_name, call, code, words) => {
    const file = path.join(dir, `${call}-${code}`, 'node.key');
    const spy = vi.spyOn(fs, call).mockImplementationOnce(((...args: unknown[]) => {
      if (call === 'fsyncSync') {
        // (the bytes reached the file before the fsync failed: a whole key file that must go too)
        expect(fs.readFileSync(file, 'utf8')).toMatch(/^-----BEGIN PRIVATE KEY-----\n/);
      } else {
        expect(typeof args[0]).toBe('number');
      }
      throw errno(code, call === 'fsyncSync' ? 'fsync' : 'write');
    }) as never);
    let thrown: unknown;
    try {
      createKeyFile(file);
    } catch (e) {
      thrown = e;
    }
    expect(spy).toHaveBeenCalledTimes(1);
    expect(thrown).toBeInstanceOf(IdentityError);
    expect((thrown as Error).message).toBe(`key file ${file}: ${words}; nothing was written`);
    expect(fs.existsSync(file)).toBe(false);
    expect(fs.readdirSync(path.dirname(file))).toEqual([]);
    // The next try (the disk freed) is not refused as "already exists", and its key loads.
    const id = createKeyFile(file);
    expect(loadKeyFile(file).providerId).toBe(id.providerId);
  });

  test('a real size limit (ulimit -f 0) in the process that writes the key: the message says so, and no file is left', () => {
    const file = path.join(dir, 'ulimit', 'node.key');
    const script = `import { createKeyFile } from ${JSON.stringify(path.join(REPO_ROOT, 'src', 'identity.ts'))};
try { createKeyFile(${JSON.stringify(file)}); console.log('created'); } catch (e) { console.log(e.message); }`;
    const r = spawnSync('sh', ['-c', `trap '' XFSZ; ulimit -f 0; exec "${process.execPath}" --input-type=module -e "$0"`, script], { encoding: 'utf8' });
    expect(r.stdout.trim(), r.stderr).toBe(`key file ${file}: ${LIMIT}; nothing was written`);
    expect(fs.existsSync(file)).toBe(false);
    const id = createKeyFile(file); // (here, without the limit)
    expect(loadKeyFile(file).providerId).toBe(id.providerId);
  });

  test.each([60, 200])('a real file size limit that cuts a write short (%i bytes: 60 cuts the key, 200 the config): init fails in words, leaves no key or config, and runs again once there is room', (bytes) => {
    const data = path.join(dir, `init-limit-${bytes}`);
    const cli = path.join(REPO_ROOT, 'bin', 'seller-node.js');
    // (What prlimit sets is the file size limit of the process: the first write passes `bytes` bytes, the next fails EFBIG.)
    const r = spawnSync('sh', ['-c', `trap '' XFSZ; exec prlimit --fsize=${bytes} "${process.execPath}" "$0" init --data "$1"`, cli, data], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(1);
    expect(r.stderr).toMatch(bytes === 60 ? `key file ${path.join(data, 'node.key')}: ${LIMIT}; nothing was written` : `${path.join(data, 'config.yaml')}: ${LIMIT}; the key was not kept either: run init again once there is room`);
    expect(fs.readdirSync(data)).toEqual([]);
    const again = spawnSync(process.execPath, [cli, 'init', '--data', data], { encoding: 'utf8' });
    expect(again.status, again.stderr).toBe(0);
    expect(loadKeyFile(path.join(data, 'node.key')).providerId).toBe(again.stdout.trim());
  });
});

describe('a file size limit reached by a running command', () => {
  test('the write fails and is said (exit 1); the process is not killed by SIGXFSZ, also with an exit hook like the one node-llama-cpp loads (signal-exit raises the signal again)', () => {
    const out = path.join(dir, 'big.gguf');
    // As `seller-node start` runs: signal-exit's hook installed (node-llama-cpp → proper-lockfile), then the CLI.
    const script = `import { createRequire } from 'node:module';
const require = createRequire(${JSON.stringify(path.join(REPO_ROOT, 'package.json'))});
require('signal-exit')(() => {});
const { main } = await import(${JSON.stringify(path.join(REPO_ROOT, 'src', 'cli', 'main.ts'))});
process.exitCode = await main(['dev-model', '--out', ${JSON.stringify(out)}]);
setTimeout(() => {}, 300); // (a signal raised again would land meanwhile)`;
    const r = spawnSync('prlimit', ['--fsize=200000', process.execPath, '--input-type=module', '-e', script], { encoding: 'utf8' });
    expect(r.signal, r.stderr).toBeNull();
    expect(r.status, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/refused the write \(a size limit or quota\)|EFBIG|file too large/i);
  });
});
