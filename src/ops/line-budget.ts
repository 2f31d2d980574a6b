// A bound on how many log lines of one kind a second may bring. Refusals need no ticket, so a peer
// can ask for thousands a second, and each would be a line: beyond the bound, lines are counted
// instead, and the count is said once the next second begins (at the next take(), or by the
// budget's own timer once started, so a burst that ends is still said). Metrics still count every
// request.

export class LineBudget {
  private readonly perSecond: number;
  private readonly report: (dropped: number) => void;
  private readonly now: () => number;
  private windowStart = Number.NEGATIVE_INFINITY;
  private used = 0;
  private dropped = 0;
  private timer: NodeJS.Timeout | undefined;

  /** `report` is told how many lines were held back (never more often than once a second, and only if there were some). */
  constructor(perSecond: number, report: (dropped: number) => void, now: () => number = Date.now) {
    this.perSecond = perSecond;
    this.report = report;
    this.now = now;
  }

  /** Whether this line may be written. */
  take(): boolean {
    this.tick();
    if (this.used < this.perSecond) {
      this.used++;
      return true;
    }
    this.dropped++;
    return false;
  }

  /** Begins a new second if one is due, reporting what the last held back. */
  tick(): void {
    const t = this.now();
    if (t - this.windowStart < 1000) return;
    if (this.dropped > 0) this.report(this.dropped);
    this.windowStart = t;
    this.used = 0;
    this.dropped = 0;
  }

  /** Ticks every second (the timer does not hold the process open). */
  start(): void {
    this.timer ??= setInterval(() => this.tick(), 1000).unref();
  }

  /** Stops the timer and reports what is held back now, the second over or not: no count is lost. */
  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    if (this.dropped > 0) this.report(this.dropped);
    this.dropped = 0;
  }
}
