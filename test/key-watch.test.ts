// The node's key file watched while it runs (s25 hS: a deleted node.key went unnoticed until the
// next start, which refuses: the receipt log is bound to the key).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { createKeyFile } from '../src/identity.ts';
import { KeyFileWatch } from '../src/key-watch.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'key-watch-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('KeyFileWatch', () => {
  test('says once when the key file is deleted, replaced by another key, or opened to others, and once when it is right again', () => {
    const file = path.join(dir, 'node.key');
    const id = createKeyFile(file);
    const saved = fs.readFileSync(file);
    const watch = new KeyFileWatch(file, id.providerId);
    expect(watch.check()).toBeUndefined();

    fs.rmSync(file);
    const gone = watch.check();
    expect(gone).toMatchObject({ kind: 'wrong', message: expect.stringContaining(`key file ${file} not found any more`) });
    expect(gone!.message).toContain(id.providerId);
    expect(gone!.message).toContain('do not run seller-node init');
    expect(watch.check()).toBeUndefined(); // (said once)

    fs.writeFileSync(file, saved, { mode: 0o600 });
    expect(watch.check()).toEqual({ kind: 'right', message: `key file ${file} holds this node's key again` });
    expect(watch.check()).toBeUndefined();

    // Another key written over it.
    const other = path.join(dir, 'other.key');
    const otherId = createKeyFile(other);
    fs.copyFileSync(other, file);
    expect(watch.check()).toMatchObject({ kind: 'wrong', message: expect.stringContaining(`now holds another key (provider ${otherId.providerId})`) });
    fs.writeFileSync(file, saved);
    expect(watch.check()).toMatchObject({ kind: 'right' });

    // Readable by others: the next start would refuse it.
    fs.chmodSync(file, 0o644);
    expect(watch.check()).toMatchObject({ kind: 'wrong', message: expect.stringContaining('chmod 600') });
    fs.chmodSync(file, 0o600);
    expect(watch.check()).toMatchObject({ kind: 'right' });
  });
});
