// A bound on how many log lines of one kind a second may bring. Refusals need no ticket, so a peer
// can ask for thousands a second, and each would be a line: beyond the bound, lines are counted
// instead, and the count is said once the next second begins (take() or a timer's tick()).
// Metrics still count every request.

export class LineBudget {
  private readonly perSecond: number;
  private readonly now: () => number;
  private windowStart = Number.NEGATIVE_INFINITY;
  private used = 0;
  private dropped = 0;

  constructor(perSecond: number, now: () => number = Date.now) {
    this.perSecond = perSecond;
    this.now = now;
  }

  /**
   * Whether this line may be written. `report` is told, once a new second begins, how many lines
   * the seconds before it held back (never more often than once a second, and only if there were some).
   */
  take(report: (dropped: number) => void): boolean {
    this.tick(report);
    if (this.used < this.perSecond) {
      this.used++;
      return true;
    }
    this.dropped++;
    return false;
  }

  /** Begins a new second if one is due, reporting what the last held back: call it on a timer too, so a burst that ends is still said. */
  tick(report: (dropped: number) => void): void {
    const t = this.now();
    if (t - this.windowStart < 1000) return;
    if (this.dropped > 0) report(this.dropped);
    this.windowStart = t;
    this.used = 0;
    this.dropped = 0;
  }

  /** Reports what is held back now, the second over or not (at stop: no count is lost). */
  flush(report: (dropped: number) => void): void {
    if (this.dropped > 0) report(this.dropped);
    this.dropped = 0;
  }
}
