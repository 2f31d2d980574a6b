// How long a provider may stay silent: the gateway cuts off a provider that sends nothing for too
// long, but not while the wait is the buyer's (slow to read).

/** How many times the idle limit keepalives alone may stretch a provider's wait (its default). */
const KEEPALIVE_STRETCH = 15;

/**
 * Aborts a provider request when nothing has arrived for `ms`; every frame (and the HEAD) restarts
 * the clock. A keepalive (an empty DATA frame: the node is working) restarts it too, but only until
 * `quietMaxMs` has passed since the last real frame: keepalives come from a timer at the node, so a
 * handler stuck for good would otherwise hold the buyer and the ticket for ever (s23 h5).
 */
export class IdleWatch {
  timedOut = false;
  /** Whether the clock ran out while keepalives still came (the provider kept the line but did nothing visible). */
  onlyKeepalives = false;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;
  private readonly ac: AbortController;
  /** When the last real frame came (or the clock started, or resumed). */
  private lastReal = Date.now();
  /** Whether the clock runs for less than ms (keepalives' last stretch). */
  private shortened = false;
  /** How long the provider may stay silent. */
  readonly ms: number;
  /** How long keepalives alone may keep it: KEEPALIVE_STRETCH × ms unless given. */
  readonly quietMaxMs: number;
  constructor(ac: AbortController, ms: number, quietMaxMs = ms * KEEPALIVE_STRETCH) {
    this.ac = ac;
    this.ms = ms;
    this.quietMaxMs = Math.max(ms, quietMaxMs);
    this.arm();
  }
  private arm(ms = this.ms): void {
    this.shortened = ms !== this.ms;
    this.timer = setTimeout(() => {
      this.timedOut = true;
      this.onlyKeepalives = this.shortened; // (keepalives' last stretch ran out; else the provider was silent for ms)
      this.ac.abort(new Error(`the provider ${this.reason}`));
    }, ms);
    this.timer.unref();
  }
  /** Why the clock ran out: "sent nothing for <ms> ms", or "sent only keepalives for <quietMaxMs> ms". */
  get reason(): string {
    return this.onlyKeepalives ? `sent only keepalives for ${this.quietMaxMs} ms` : `sent nothing for ${this.ms} ms`;
  }
  /** A real frame: the clock starts again. */
  kick(): void {
    this.lastReal = Date.now();
    if (this.stopped || this.timedOut || !this.timer) return;
    if (!this.shortened) this.timer.refresh();
    else {
      clearTimeout(this.timer);
      this.arm();
    }
  }
  /** A keepalive: the clock starts again while the provider's quiet time is within quietMaxMs; then it runs out. */
  keepalive(): void {
    if (this.stopped || this.timedOut || !this.timer || this.shortened) return;
    const left = this.quietMaxMs - (Date.now() - this.lastReal);
    if (left >= this.ms) this.timer.refresh();
    else {
      // The last stretch: the clock runs out when quietMaxMs is reached, not up to ms later.
      clearTimeout(this.timer);
      this.arm(Math.max(0, left));
    }
  }
  /** The wait is the buyer's (slow to read): the provider's clock stops until resume(). */
  pause(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
  resume(): void {
    if (this.stopped || this.timedOut || this.timer) return;
    this.lastReal = Date.now();
    this.arm();
  }
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}
