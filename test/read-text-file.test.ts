// The small files an operator names (config, key, API keys, price lists) are read without ever
// waiting or running away: a FIFO, a device, a socket, a folder or a huge file is refused at once,
// in fsProblem's words, and a regular file is read whole.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.ts';
import { fsProblem } from '../src/fs-problem.ts';
import { loadKeyFile } from '../src/identity.ts';
import { readTextFile } from '../src/read-text-file.ts';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'read-text-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const why = (f: () => unknown): string => {
  try {
    f();
  } catch (e) {
    return fsProblem(e);
  }
  throw new Error('expected a refusal');
};

describe('readTextFile', () => {
  it('reads a regular file whole, as UTF-8, also through a symlink', () => {
    const f = path.join(dir, 'plain.yaml');
    fs.writeFileSync(f, 'a: "é"\n');
    expect(readTextFile(f)).toBe('a: "é"\n');
    fs.symlinkSync(f, path.join(dir, 'link.yaml'));
    expect(readTextFile(path.join(dir, 'link.yaml'))).toBe('a: "é"\n');
  });

  it('refuses a FIFO at once, with no writer and no wait', () => {
    const f = path.join(dir, 'fifo');
    execFileSync('mkfifo', [f]);
    expect(why(() => readTextFile(f))).toBe('it is a FIFO, not a regular file');
  });

  it('refuses a device, a socket, a folder and a missing file in words', async () => {
    expect(why(() => readTextFile('/dev/zero'))).toBe('it is a device, not a regular file');
    expect(why(() => readTextFile(dir))).toBe('it is a folder');
    expect(why(() => readTextFile(path.join(dir, 'none')))).toBe('not found');
    const sock = path.join(dir, 'sock');
    const server = net.createServer().listen(sock);
    await new Promise((r) => server.once('listening', r));
    try {
      expect(why(() => readTextFile(sock))).toBe('it is a socket or an absent device, not a regular file');
    } finally {
      server.close();
    }
  });

  it('refuses a file larger than its bound without reading it', () => {
    const f = path.join(dir, 'sparse');
    fs.writeFileSync(f, '');
    fs.truncateSync(f, 3 * 1024 * 1024 * 1024); // sparse: 3 GiB that readFileSync could not hold
    expect(why(() => readTextFile(f))).toBe(`it holds ${3 * 1024 * 1024 * 1024} bytes, more than the 16777216 such a file may`);
    fs.writeFileSync(f, 'x'.repeat(11));
    expect(why(() => readTextFile(f, 10))).toBe('it holds 11 bytes, more than the 10 such a file may');
    expect(readTextFile(f, 11)).toBe('x'.repeat(11));
  });
});

describe('its users', () => {
  it('a config or key from a pipe (process substitution) is read to its end, its writer waited on; a FIFO nobody writes to reads as empty at once', () => {
    const script = `import { readTextFile } from ${JSON.stringify(path.resolve('src/read-text-file.ts'))}; process.stdout.write(readTextFile(process.argv[1], { pipes: true }))`;
    const out = execFileSync('bash', ['-c', `${JSON.stringify(process.execPath)} --input-type=module -e ${JSON.stringify(script)} <(sleep 0.3; printf 'a: 1\\n')`], { encoding: 'utf8' });
    expect(out).toBe('a: 1\n');
    expect(() => readTextFile(path.join(dir, 'fifo'))).toThrow('it is a FIFO, not a regular file'); // (not where pipes are not taken)
    const f = path.join(dir, 'config-fifo.yaml');
    execFileSync('mkfifo', [f]);
    expect(readTextFile(f, { pipes: true })).toBe('');
    expect(loadConfig(f, {}).models).toEqual([]); // (an empty config: its defaults, and start then asks for a model)
    const k = path.join(dir, 'key-fifo');
    execFileSync('mkfifo', ['-m', '600', k]);
    expect(() => loadKeyFile(k)).toThrow(`key file ${k} is not a PEM private key`);
  });
});
