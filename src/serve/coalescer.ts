// Stream events written in quick succession go out together: the first at once (time to first
// token), later ones at most `windowMs` later, in one DATA frame. A libp2p frame costs a muxer
// frame, a Noise message and a syscall on each side; a token every half millisecond would pay
// that per token. The window is 8 ms by default: at most ~125 frames a second, faster than a
// screen shows them, and a model slower than that (most are, on most hardware) never waits on
// it; with a 2 ms window the tiny model's relay ran at ~0.87–0.89 of the runtime's rate, with 8 ms
// ~0.94–0.95, with 16 ms ~0.95–0.97 (session 26; docs/decisions.md). Tokens count as delivered
// only once their bytes were written. A runtime hands over a token with the chunk that ends its
// text (adapters/runtime-adapter.ts); tokens pushed with no bytes (a stop sequence's, whose text
// the answer leaves out) wait for the next bytes.
import { concatBytes } from '../../attestation/bytes.ts';

export class Coalescer {
  /** Tokens whose bytes have been written. */
  delivered = 0;
  /** Writes bytes and says how many tokens they carry. */
  private readonly write: (bytes: Uint8Array, tokens: number) => Promise<void>;
  private readonly windowMs: number;
  private readonly maxBytes: number;
  private parts: Uint8Array[] = [];
  private size = 0;
  private tokens = 0;
  /** Tokens pushed without bytes: they join the next bytes pushed, not the batch before them. */
  private held = 0;
  private last = -Infinity;
  private timer: NodeJS.Timeout | undefined;
  private chain: Promise<void> = Promise.resolve();
  private failure: unknown;

  constructor(write: (bytes: Uint8Array, tokens: number) => Promise<void>, opts: { windowMs?: number; maxBytes?: number } = {}) {
    this.write = write;
    this.windowMs = opts.windowMs ?? 8;
    this.maxBytes = opts.maxBytes ?? 16_384;
  }

  /** Queues bytes and the tokens they carry (no bytes: tokens carried by the next bytes); writes when the window has passed. */
  async push(bytes: Uint8Array, tokens: number): Promise<void> {
    if (this.failure !== undefined) throw this.failure;
    if (bytes.length === 0) {
      // Were they counted with the batch waiting for the window, that batch's write would bill them
      // to a buyer who left before the bytes that follow them (s28 review).
      this.held += tokens;
      return;
    }
    this.parts.push(bytes);
    this.size += bytes.length;
    this.tokens += this.held + tokens;
    this.held = 0;
    const since = performance.now() - this.last;
    if (since >= this.windowMs || this.size >= this.maxBytes) return this.flush();
    this.timer ??= setTimeout(() => void this.flush().catch(() => undefined), this.windowMs - since);
  }

  /** Writes whatever is queued; resolves when everything queued so far is written. */
  flush(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.parts.length === 0) return this.chain; // (nothing queued: tokens pushed without bytes wait in `held`)
    const parts = this.parts;
    const tokens = this.tokens;
    this.parts = [];
    this.size = 0;
    this.tokens = 0;
    this.last = performance.now();
    this.chain = this.chain.then(async () => {
      await this.write(parts.length === 1 ? parts[0]! : concatBytes(...parts), tokens);
      this.delivered += tokens;
    });
    this.chain.catch((e: unknown) => {
      this.failure ??= e;
    });
    return this.chain;
  }

  /** Drops what is queued (the buyer left) and stops the timer. */
  discard(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.parts = [];
    this.size = 0;
    this.tokens = 0;
    this.held = 0;
  }
}
