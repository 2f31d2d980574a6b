import { describe, expect, test } from 'vitest';
import { Coalescer } from '../src/serve/coalescer.ts';

const b = (s: string) => new TextEncoder().encode(s);
const dec = (x: Uint8Array) => new TextDecoder().decode(x);

describe('Coalescer', () => {
  test('the first write goes at once, quick followers share a write, nothing is lost or reordered', async () => {
    const writes: string[] = [];
    const c = new Coalescer(async (x) => void writes.push(dec(x)), { windowMs: 20 });
    await c.push(b('a'), 1);
    expect(writes).toEqual(['a']);
    await c.push(b('b'), 1);
    await c.push(b(''), 1); // a token with no text yet
    await c.push(b('c'), 1);
    expect(writes).toEqual(['a']);
    expect(c.delivered).toBe(1);
    await new Promise((r) => setTimeout(r, 40)); // the window's timer writes the rest
    expect(writes).toEqual(['a', 'bc']);
    expect(c.delivered).toBe(4);
    await c.push(b('d'), 1);
    await c.flush();
    expect(writes.join('')).toBe('abcd');
  });
  test('tokens whose text is held back count as delivered only with the next bytes written', async () => {
    const writes: string[] = [];
    const c = new Coalescer(async (x) => void writes.push(dec(x)), { windowMs: 0 });
    await c.push(b('Hel'), 1);
    await c.push(b(''), 1); // text held (a partial character, a possible stop): nothing to write
    await c.push(b(''), 1);
    await c.flush();
    expect(writes).toEqual(['Hel']);
    expect(c.delivered).toBe(1);
    await c.push(b('lo'), 1); // the held text goes out with this one: all four tokens reached the buyer
    await c.flush();
    expect(writes).toEqual(['Hel', 'lo']);
    expect(c.delivered).toBe(4);
    await c.push(b(''), 1);
    c.discard(); // the buyer left: the held token never reached them
    await c.flush();
    expect(c.delivered).toBe(4);
  });

  test('a token whose text is held back while a batch waits for the window is not delivered with that batch (s28 review)', async () => {
    const writes: string[] = [];
    const c = new Coalescer(async (x) => void writes.push(dec(x)), { windowMs: 1000 });
    await c.push(b('A'), 1); // written at once
    await c.push(b('B'), 1); // waits for the window
    await c.push(b(''), 1); // its text held (a partial character, a possible stop)
    await c.flush(); // the window's write: 'B' alone
    expect(writes).toEqual(['A', 'B']);
    expect(c.delivered).toBe(2);
    c.discard(); // the buyer left: the held token never reached them
    await c.flush();
    expect(c.delivered).toBe(2);
    // Not left: the held token goes with the next bytes.
    const d = new Coalescer(async (x) => void writes.push(dec(x)), { windowMs: 1000 });
    await d.push(b('A'), 1);
    await d.push(b(''), 2);
    await d.flush();
    expect(d.delivered).toBe(1);
    await d.push(b('xy'), 1);
    await d.flush();
    expect(d.delivered).toBe(4);
  });

  test('tokens queued when the write side fails are not delivered; later pushes fail', async () => {
    let fail = false;
    const c = new Coalescer(async () => {
      if (fail) throw new Error('gone');
    }, { windowMs: 1000 });
    await c.push(b('a'), 1);
    fail = true;
    await c.push(b('b'), 2);
    await expect(c.flush()).rejects.toThrow('gone');
    expect(c.delivered).toBe(1);
    await expect(c.push(b('c'), 1)).rejects.toThrow('gone');
  });
  test('a full buffer is written without waiting for the window', async () => {
    const writes: number[] = [];
    const c = new Coalescer(async (x) => void writes.push(x.length), { windowMs: 10_000, maxBytes: 8 });
    await c.push(b('12345'), 1);
    await c.push(b('12345'), 1);
    await c.push(b('12345'), 1);
    expect(writes).toEqual([5, 10]);
    c.discard();
    await c.flush();
    expect(writes).toEqual([5, 10]);
  });
});
