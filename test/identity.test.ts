import { execFileSync, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { toHex } from '../attestation/bytes.ts';
import { createKeyFile, IdentityError, loadKeyFile } from '../src/identity.ts';
import { REPO_ROOT } from './helpers/vectors.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ident-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('node key file', () => {
  test('created with mode 0600, loaded back to the same provider id', () => {
    const file = path.join(dir, 'a', 'node.key');
    const id = createKeyFile(file);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(id.providerId).toMatch(/^[0-9a-f]{64}$/);
    expect(loadKeyFile(file).providerId).toBe(id.providerId);
    // It is a standard PKCS#8 key: OpenSSL's view of the public key is the provider id.
    const pub = crypto.createPublicKey(fs.readFileSync(file, 'utf8')).export({ format: 'der', type: 'spki' });
    expect(toHex(pub.subarray(-32))).toBe(id.providerId);
  });
  test('a key file that cannot be written (a full disk) is not left behind: the next `init` succeeds', () => {
    // The file size limit (ulimit -f 0, SIGXFSZ ignored) fails the write as a full disk would, after the file was created.
    const data = path.join(dir, 'full');
    const cli = path.join(REPO_ROOT, 'bin', 'seller-node.js');
    const failed = spawnSync('sh', ['-c', `trap '' XFSZ; ulimit -f 0; exec "${process.execPath}" "${cli}" init --data "${data}"`], { encoding: 'utf8' });
    expect(failed.status).toBe(1);
    expect(failed.stderr).toMatch(/^seller-node: key file .*node\.key: .*nothing was written\n$/);
    expect(fs.existsSync(path.join(data, 'node.key'))).toBe(false);
    const ok = spawnSync(process.execPath, [cli, 'init', '--data', data], { encoding: 'utf8' });
    expect(ok.status).toBe(0);
    expect(loadKeyFile(path.join(data, 'node.key')).providerId).toBe(ok.stdout.split('\n')[0]);
  });
  test('never overwrites an existing key', () => {
    const file = path.join(dir, 'b.key');
    const id = createKeyFile(file);
    expect(() => createKeyFile(file)).toThrow(IdentityError);
    expect(loadKeyFile(file).providerId).toBe(id.providerId);
  });
  test('refuses a key file others can read', () => {
    const file = path.join(dir, 'c.key');
    createKeyFile(file);
    fs.chmodSync(file, 0o644);
    expect(() => loadKeyFile(file)).toThrow(/has mode 644; any user can read it\. Run: chmod 600 /);
    fs.chmodSync(file, 0o640);
    expect(() => loadKeyFile(file)).toThrow(/has mode 640; its group can read it\. /);
    fs.chmodSync(file, 0o620);
    expect(() => loadKeyFile(file)).toThrow(/has mode 620; its group can write it\. /);
  });
  test('a key from openssl genpkey loads', () => {
    const file = path.join(dir, 'o.key');
    try {
      execFileSync('openssl', ['genpkey', '-algorithm', 'ed25519', '-out', file], { stdio: 'ignore' });
    } catch {
      fs.writeFileSync(file, crypto.generateKeyPairSync('ed25519').privateKey.export({ format: 'pem', type: 'pkcs8' }));
    }
    fs.chmodSync(file, 0o600);
    const expected = toHex(crypto.createPublicKey(fs.readFileSync(file, 'utf8')).export({ format: 'der', type: 'spki' }).subarray(-32));
    expect(loadKeyFile(file).providerId).toBe(expected);
  });
  test('missing, garbage and non-Ed25519 keys are named errors', () => {
    expect(() => loadKeyFile(path.join(dir, 'none.key'))).toThrow(/not found/);
    const g = path.join(dir, 'g.key');
    fs.writeFileSync(g, 'garbage', { mode: 0o600 });
    expect(() => loadKeyFile(g)).toThrow(/not a PEM private key/);
    const r = path.join(dir, 'r.key');
    fs.writeFileSync(r, crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ format: 'pem', type: 'pkcs8' }), { mode: 0o600 });
    expect(() => loadKeyFile(r)).toThrow(/not Ed25519/);
  });
});
