import crypto from 'node:crypto';
import { describe, expect, test } from 'vitest';
import { toHex } from '../attestation/bytes.ts';
import { utf8 } from '../attestation/bytes.ts';
import { envelopeLine, pae } from '../attestation/dsse.ts';
import { ed25519PublicKey, ed25519Verify } from '../attestation/ed25519.ts';
import { leafHash } from '../attestation/merkle.ts';
import { batchItem, packPayloads, signBatch, type SignBatchTask } from '../attestation/sign-batch.ts';
import { SignerPool } from '../attestation/signer-pool.ts';

const seed = new Uint8Array(crypto.randomBytes(32));
const taskOf = (texts: string[], payloadType = 'application/x-test', keyid = 'k'): SignBatchTask => ({ payloadType, keyid, ...packPayloads(texts.map(utf8)) });
const texts = Array.from({ length: 40 }, (_, i) => `{"i":${i}}`);
const task = taskOf(texts);

describe('signBatch', () => {
  test('each payload: an Ed25519 signature over its PAE and the leaf hash of its envelope line, in order', () => {
    // Non-ASCII in the payloads, the payload type and the keyid; a payload larger than the PAE scratch array.
    const payloads = ['{"a":"é"}', '{"b":"😀"}', '{}', `{"big":"${'x'.repeat(40_000)}"}`, '{"c":1}'];
    const type = 'application/vnd.tést+json';
    const keyid = 'kéy';
    const signed = signBatch(seed, taskOf(payloads, type, keyid));
    const pub = ed25519PublicKey(seed);
    payloads.forEach((text, i) => {
      const { payload, sig, leaf } = batchItem(signed, i);
      expect(Buffer.from(payload).toString()).toBe(text);
      expect(ed25519Verify(sig, pae(type, utf8(text)), pub)).toBe(true);
      expect(toHex(leaf)).toBe(toHex(leafHash(envelopeLine(Buffer.from(text).toString('base64'), type, keyid, Buffer.from(sig).toString('base64')))));
    });
  });
});

describe('SignerPool', () => {
  test('worker threads sign exactly what in-process signing does', async () => {
    const pool = new SignerPool({ seed, threads: 2 });
    try {
      const [a, b] = await Promise.all([pool.sign(task), pool.sign(taskOf(texts.slice(0, 3)))]);
      const local = signBatch(seed, task);
      expect(toHex(a.sigs)).toBe(toHex(local.sigs));
      expect(toHex(a.leaves)).toBe(toHex(local.leaves));
      expect(Buffer.from(batchItem(b, 2).payload).toString()).toBe('{"i":2}');
      expect(pool.fallbacks).toBe(0);
    } finally {
      await pool.close();
    }
  });

  test('a batch whose worker dies is signed in-process: same bytes, nothing lost', async () => {
    const pool = new SignerPool({ seed, threads: 1, workerUrl: new URL('./helpers/dying-signer-worker.ts', import.meta.url) });
    try {
      const signed = await pool.sign(task);
      expect(toHex(signed.sigs)).toBe(toHex(signBatch(seed, task).sigs));
      expect(pool.fallbacks).toBe(1);
    } finally {
      await pool.close();
    }
  });

  test('inline: a small batch is signed on the calling thread while no worker is busy, with the same bytes', async () => {
    // The dying worker would count a fallback for every batch it was given.
    const pool = new SignerPool({ seed, threads: 1, workerUrl: new URL('./helpers/dying-signer-worker.ts', import.meta.url) });
    try {
      const one = taskOf(['{"i":0}']);
      const signed = await pool.sign(one, { inline: true });
      expect(toHex(signed.sigs)).toBe(toHex(signBatch(seed, one).sigs));
      expect(pool.fallbacks).toBe(0);
      // While a batch is on a worker, even an inline-eligible batch goes to the workers.
      const big = pool.sign(task);
      expect(pool.running).toBe(1);
      await pool.sign(one, { inline: true });
      await big;
      expect(pool.fallbacks).toBe(2);
      expect(pool.running).toBe(0);
    } finally {
      await pool.close();
    }
  });

  test('refuses a seed of the wrong size', () => {
    expect(() => new SignerPool({ seed: seed.subarray(1), threads: 0 })).toThrow(RangeError);
  });
});
