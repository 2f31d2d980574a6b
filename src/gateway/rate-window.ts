// An exact sliding-window rate limit (marketplace-api.md, Authentication: "requests per minute, an
// exact sliding window"): a request is taken when fewer than `limit` were taken in the window that
// ends now. It keeps the times of the requests still in the window (at most `limit` of them), so
// its memory follows the traffic, not the limit. Refused requests are not counted.

export type WindowTake = { ok: true; remaining: number } | { ok: false; retryAfterMs: number };

export class SlidingWindow {
  readonly limit: number;
  readonly windowMs: number;
  /** Times (ms) of the requests taken, oldest first, from `head` on. */
  private times: number[] = [];
  private head = 0;

  constructor(limit: number, windowMs: number) {
    if (!Number.isSafeInteger(limit) || limit < 1) throw new RangeError(`rate window: the limit must be a positive integer, got ${limit}`);
    if (!(windowMs > 0)) throw new RangeError(`rate window: the window must be positive, got ${windowMs}`);
    this.limit = limit;
    this.windowMs = windowMs;
  }

  /** Requests taken in the window that ends at `now`. */
  count(now: number): number {
    this.evict(now);
    return this.times.length - this.head;
  }

  /** Takes one request at `now`, or says how long until one is taken (the oldest leaves the window). */
  take(now: number): WindowTake {
    const n = this.count(now);
    if (n >= this.limit) return { ok: false, retryAfterMs: Math.max(1, this.times[this.head]! + this.windowMs - now) };
    this.times.push(now);
    return { ok: true, remaining: this.limit - n - 1 };
  }

  private evict(now: number): void {
    const edge = now - this.windowMs;
    while (this.head < this.times.length && this.times[this.head]! <= edge) this.head++;
    // Compacted once half is dead, so each time is moved at most once on average.
    if (this.head > 0 && this.head * 2 >= this.times.length) {
      this.times = this.times.slice(this.head);
      this.head = 0;
    }
  }
}
