// Whether the node's state store (state.db: used tickets, idempotency records) takes writes. A
// write it refuses (disk full, I/O error, read-only) means no ticket can be marked used, so no
// paid request can start: each is refused 503 no_capacity (a gateway then tries another
// provider), and the node says it is not accepting work for a while after the last failure, so
// the marketplace stops routing to it. Nothing probes: when that while is over the next request
// tries again, and one write that succeeds clears it.

/** How long after a failed write the node says it is not accepting work. */
export const STATE_FAILURE_HOLD_MS = 30_000;

/** Whether an error comes from SQLite (better-sqlite3 gives its result code as `code`). */
export function isStoreError(e: unknown): e is Error & { code: string } {
  const code = e instanceof Error ? (e as Error & { code?: unknown }).code : undefined;
  return typeof code === 'string' && code.startsWith('SQLITE_');
}

/** Why a store was stopped for good (StoreHealth.stop): said as it is, in full. */
export class StoreStopped extends Error {
  override name = 'StoreStopped';
}

export class StoreHealth {
  private last: { error: Error; at: number } | undefined;
  private stoppedBy: Error | undefined;
  private readonly holdMs: number;
  private readonly now: () => number;
  private readonly onFailure: ((e: Error, first: boolean) => void) | undefined;

  constructor(opts: { holdMs?: number; now?: () => number; onFailure?: (e: Error, first: boolean) => void } = {}) {
    this.holdMs = opts.holdMs ?? STATE_FAILURE_HOLD_MS;
    this.now = opts.now ?? Date.now;
    this.onFailure = opts.onFailure;
  }

  /** A write failed: `first` when the store was taking writes until now. */
  failed(e: Error): void {
    const first = this.last === undefined;
    this.last = { error: e, at: this.now() };
    try {
      this.onFailure?.(e, first);
    } catch {
      // an observer must not break serving
    }
  }

  /**
   * The store cannot be trusted until a restart (its file was deleted or replaced under it: writes
   * still succeed, into a file that is gone when the node stops). Paid requests are refused.
   */
  stop(e: StoreStopped): void {
    this.stoppedBy ??= e;
  }

  /** Why the store was stopped for good (see stop()), if it was. */
  get stopped(): Error | undefined {
    return this.stoppedBy;
  }

  /** A write succeeded: the store takes writes again (unless stopped). */
  ok(): void {
    this.last = undefined;
  }

  /** The failure that stopped the store, or the last failure while it still counts (STATE_FAILURE_HOLD_MS), else undefined. */
  get failure(): Error | undefined {
    if (this.stoppedBy) return this.stoppedBy;
    if (this.last && this.now() - this.last.at >= this.holdMs) return undefined;
    return this.last?.error;
  }
}
