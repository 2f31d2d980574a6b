// Free work (tokenize and count_tokens: unpaid, unticketed) holds the event loop while llama.cpp
// tokenizes: ~200 ms for a 512 KiB body on a small machine, and every paid stream on the node waits
// behind it. Three peers sending such bodies back to back made one paid stream take 129 s instead
// of 3. The pace keeps free work to a share of the time: after free work that took d ms, the next
// may start only d·(1/share − 1) ms later, so paid work always has the rest. Small counts (a chat
// prompt: well under a millisecond) are held back by no more than they took.
export class FreeWorkPace {
  /** The share of the time free work may take, in (0, 1]. */
  readonly share: number;
  /** A monotonic clock, in ms. */
  readonly now: () => number;
  private nextAt = -Infinity;

  constructor(opts: { share?: number; now?: () => number } = {}) {
    const share = opts.share ?? 0.25;
    if (!(share > 0 && share <= 1)) throw new RangeError('share must be in (0, 1]');
    this.share = share;
    this.now = opts.now ?? (() => performance.now());
  }

  /** Milliseconds until free work may start again (0: now). */
  wait(): number {
    return Math.max(0, this.nextAt - this.now());
  }

  /** Runs one piece of free work and paces the next by the time it took (also when it fails). */
  async run<T>(work: () => Promise<T>): Promise<T> {
    const started = this.now();
    try {
      return await work();
    } finally {
      const end = this.now();
      this.nextAt = end + (end - started) * (1 / this.share - 1);
    }
  }
}
