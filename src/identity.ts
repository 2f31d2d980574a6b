// The node's identity: one Ed25519 key. Provider id = lowercase hex of the public key; the libp2p
// PeerId derives from the same key. The key file is PKCS#8 PEM (what `openssl genpkey -algorithm
// ed25519` writes), mode 0600, and the node refuses a key file that others can read.
import fs from 'node:fs';
import crypto from 'node:crypto';
import path from 'node:path';
import { ed25519PublicKey } from '../attestation/ed25519.ts';
import { toHex } from '../attestation/bytes.ts';
import { fsProblem } from './fs-problem.ts';
import { readTextFile } from './read-text-file.ts';
import { writeAllSync } from './atomic-file.ts';
import { makeFolder } from './make-folder.ts';

export interface NodeIdentity {
  seed: Uint8Array;
  publicKey: Uint8Array;
  providerId: string;
}

export class IdentityError extends Error {
  override name = 'IdentityError';
}

const PKCS8_ED25519_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

export function identityFromSeed(seed: Uint8Array): NodeIdentity {
  const publicKey = ed25519PublicKey(seed);
  return { seed, publicKey, providerId: toHex(publicKey) };
}

function seedToPem(seed: Uint8Array): string {
  const der = Buffer.concat([PKCS8_ED25519_PREFIX, seed]);
  return `-----BEGIN PRIVATE KEY-----\n${der.toString('base64')}\n-----END PRIVATE KEY-----\n`;
}

/** Creates a new key file (mode 0600). Refuses to overwrite an existing one. */
export function createKeyFile(file: string): NodeIdentity {
  const seed = new Uint8Array(crypto.randomBytes(32));
  let fd: number;
  try {
    makeFolder(path.dirname(file));
    fd = fs.openSync(file, 'wx', 0o600);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST') throw new IdentityError(`key file ${file} already exists; refusing to overwrite it`);
    throw new IdentityError(`key file ${file}: ${fsProblem(e)}`);
  }
  try {
    writeAllSync(fd, seedToPem(seed));
    fs.fsyncSync(fd);
  } catch (e) {
    // (a full disk): the empty or partial file would block every later try as "already exists"
    fs.closeSync(fd);
    fs.rmSync(file, { force: true });
    throw new IdentityError(`key file ${file}: ${fsProblem(e)}; nothing was written`);
  }
  fs.closeSync(fd);
  fs.chmodSync(file, 0o600); // the umask may have narrowed it further; never wider
  return identityFromSeed(seed);
}

/** Loads the key file; refuses one readable or writable by group or others. */
export function loadKeyFile(file: string): NodeIdentity {
  let st: fs.Stats;
  try {
    st = fs.statSync(file);
  } catch (e) {
    if ((e as { code?: unknown }).code === 'ENOENT') throw new IdentityError(`key file ${file} not found (create one with: seller-node init --data DIR)`);
    throw new IdentityError(`key file ${file}: ${fsProblem(e)}`);
  }
  if ((st.mode & 0o077) !== 0) {
    throw new IdentityError(`key file ${file} has mode ${(st.mode & 0o777).toString(8)}; ${st.mode & 0o007 ? 'any user' : 'its group'} can ${st.mode & 0o044 ? 'read' : 'write'} it. Run: chmod 600 ${file}`);
  }
  let pem: string;
  try {
    pem = readTextFile(file, { maxBytes: 64 * 1024, pipes: true });
  } catch (e) {
    throw new IdentityError(`key file ${file}: ${fsProblem(e)}`);
  }
  let key: crypto.KeyObject;
  try {
    key = crypto.createPrivateKey(pem);
  } catch {
    throw new IdentityError(`key file ${file} is not a PEM private key`);
  }
  if (key.asymmetricKeyType !== 'ed25519') throw new IdentityError(`key file ${file} holds a ${key.asymmetricKeyType} key, not Ed25519`);
  const der = key.export({ format: 'der', type: 'pkcs8' });
  return identityFromSeed(new Uint8Array(der.subarray(der.length - 32)));
}
