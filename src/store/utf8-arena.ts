// UTF-8 encodings of many short strings written one after another into large chunks, so each costs
// no allocation of its own (a Buffer or array per receipt payload was a measurable part of the
// receipt log's event-loop time and garbage). A view stays valid as long as it is held: a full
// chunk is left to its views, never reused.
export class Utf8Arena {
  private chunk: Buffer;
  private at = 0;
  private readonly chunkSize: number;

  constructor(chunkSize = 1 << 20) {
    this.chunkSize = chunkSize;
    this.chunk = Buffer.allocUnsafeSlow(chunkSize);
  }

  /** The UTF-8 bytes of `text` (a lone surrogate becomes U+FFFD, as TextEncoder does). */
  encode(text: string): Uint8Array {
    // (at most 3 bytes a UTF-16 unit)
    if (this.chunk.length - this.at < text.length * 3) {
      this.chunk = Buffer.allocUnsafeSlow(Math.max(this.chunkSize, text.length * 3));
      this.at = 0;
    }
    const written = this.chunk.write(text, this.at, 'utf8');
    const view = new Uint8Array(this.chunk.buffer, this.at, written);
    this.at += written;
    return view;
  }
}
