// How long a provider may stay silent: the gateway cuts off a provider that sends nothing for too
// long, but not while the wait is the buyer's (slow to read).

/** Aborts a provider request when nothing has arrived for `ms`; every frame (and the HEAD) restarts the clock. */
export class IdleWatch {
  timedOut = false;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;
  private readonly ac: AbortController;
  /** How long the provider may stay silent. */
  readonly ms: number;
  constructor(ac: AbortController, ms: number) {
    this.ac = ac;
    this.ms = ms;
    this.arm();
  }
  private arm(): void {
    this.timer = setTimeout(() => {
      this.timedOut = true;
      this.ac.abort(new Error(`the provider sent nothing for ${this.ms} ms`));
    }, this.ms);
    this.timer.unref();
  }
  kick(): void {
    if (!this.stopped) this.timer?.refresh();
  }
  /** The wait is the buyer's (slow to read): the provider's clock stops until resume(). */
  pause(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
  resume(): void {
    if (!this.stopped && !this.timer) this.arm();
  }
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}
