// A failure that may repeat on every request or batch (a full disk, a file that cannot be
// written): said at once, then at most every `everyMs` with how many times it was not said, so a
// cause that lasts gives a line every few seconds, not one a request (on a disk that may be the
// full one). LineBudget bounds lines of many kinds a second; this is one kind's repetition.

export class RepeatLimit {
  private readonly everyMs: number;
  private readonly now: () => number;
  private saidAt = Number.NEGATIVE_INFINITY;
  private unsaid = 0;

  constructor(everyMs = 10_000, now: () => number = () => performance.now()) {
    this.everyMs = everyMs;
    this.now = now;
  }

  /**
   * One more time it happened: how many times it was not said since the last line (say it now),
   * or undefined (counted, not said). `first` says it now whatever the time (the first after a
   * recovery).
   */
  take(first = false): number | undefined {
    const t = this.now();
    if (!first && t - this.saidAt < this.everyMs) {
      this.unsaid++;
      return undefined;
    }
    const unsaid = this.unsaid;
    this.saidAt = t;
    this.unsaid = 0;
    return unsaid;
  }
}
