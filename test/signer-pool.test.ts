import crypto from 'node:crypto';
import { describe, expect, test } from 'vitest';
import { toHex } from '../attestation/bytes.ts';
import { batchItem, signBatch } from '../attestation/sign-batch.ts';
import { SignerPool } from '../attestation/signer-pool.ts';

const seed = new Uint8Array(crypto.randomBytes(32));
const task = { payloadType: 'application/x-test', keyid: 'k', payloads: Array.from({ length: 40 }, (_, i) => `{"i":${i}}`).join('\n') };

describe('SignerPool', () => {
  test('worker threads sign exactly what in-process signing does', async () => {
    const pool = new SignerPool({ seed, threads: 2 });
    try {
      const [a, b] = await Promise.all([pool.sign(task), pool.sign({ ...task, payloads: task.payloads.split('\n').slice(0, 3).join('\n') })]);
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
      const one = { ...task, payloads: '{"i":0}' };
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
