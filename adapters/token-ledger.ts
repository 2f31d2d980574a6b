// Which output tokens have all their text sent. A generated chunk carries the tokens whose text
// ends in it (runtime-adapter.ts, GeneratedChunk): a token whose text is held back, wholly or in
// part (a partial character, the start of a possible stop sequence), waits for the chunk that sends
// its end, and a buyer who leaves is billed only for text they got (s28 review: with stop "e!", the
// token " mone" went out as " mon" and was billed to a buyer who left before the "e"). Positions
// are UTF-16 units of the answer's text.

export class TokenLedger {
  /** Tokens not handed over yet, in order. */
  private readonly waiting: number[] = [];
  /** Where waiting[i]'s text ends, for the first ends.length of them (the rest end in a character not complete yet). */
  private readonly ends: number[] = [];
  private decodedLength = 0;
  private sentLength = 0;

  /** A token generated; its end is known once its characters are (decoded()). */
  add(token: number): void {
    this.waiting.push(token);
  }

  /**
   * The tokens since the last decode came out as `text`. `inner[j]`: where, in `text`, the j-th of
   * them ends (all but the last; groupEnd); the others end with it.
   */
  decoded(text: string, inner: readonly number[] = []): void {
    for (const e of inner) this.ends.push(this.decodedLength + e);
    this.decodedLength += text.length;
    while (this.ends.length < this.waiting.length) this.ends.push(this.decodedLength);
  }

  /** `length` more of the text went out: the tokens whose text has now all been sent, in order. */
  sent(length: number): number[] {
    this.sentLength += length;
    let n = 0;
    while (n < this.ends.length && this.ends[n]! <= this.sentLength) n++;
    this.ends.splice(0, n);
    return this.waiting.splice(0, n);
  }

  /** Every token not handed over yet (those of a stop sequence, whose text the answer leaves out). */
  rest(): number[] {
    this.ends.length = 0;
    return this.waiting.splice(0);
  }
}

/**
 * Where, in `text` (tokens decoded together: the first ones ended in a partial character), the
 * token that ends `prefix` ends: after the character its bytes are part of (a byte that is no
 * character's start is a U+FFFD for good, and ends before the text after it; s29 review). `prefix`
 * is the tokens up to it decoded, ending in one U+FFFD for its unfinished bytes. Never before
 * `atLeast` (the token before it); the whole text when `prefix` is not the text's start (nothing
 * is counted before its text is sure to be sent).
 */
export function groupEnd(prefix: string, text: string, atLeast: number): number {
  const stable = prefix.length - 1;
  if (!prefix.endsWith('\uFFFD') || !text.startsWith(prefix.slice(0, stable))) return text.length;
  const cp = text.codePointAt(stable);
  const end = cp === undefined ? text.length : stable + (cp > 0xffff ? 2 : 1);
  return Math.max(atLeast, end);
}
