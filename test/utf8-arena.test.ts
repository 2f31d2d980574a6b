import { expect, test } from 'vitest';
import { Utf8Arena } from '../src/store/utf8-arena.ts';

test("Utf8Arena: each text's UTF-8 bytes, across chunk boundaries; earlier views stay valid when a new chunk starts", () => {
  const arena = new Utf8Arena(64);
  const texts = ['plain', 'é and 😀', 'x'.repeat(50), '{"a":"ü"}', 'y'.repeat(300), 'lone \uD800 surrogate', ''];
  const views = texts.map((t) => arena.encode(t));
  // (a text longer than a chunk gets a chunk of its own; a lone surrogate becomes U+FFFD, as TextEncoder does)
  views.forEach((v, i) => expect(Buffer.from(v).toString('utf8'), texts[i]).toBe(new TextDecoder().decode(new TextEncoder().encode(texts[i]))));
  expect(Buffer.from(views[1]!)).toEqual(Buffer.from('é and 😀'));
  expect(views.map((v) => v.length)).toEqual(texts.map((t) => new TextEncoder().encode(t).length));
});
