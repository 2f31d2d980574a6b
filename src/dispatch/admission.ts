// Admission: each model runs at most `slots` requests at once and lets at most `queue` more wait,
// first come first served. A request that cannot start within its maximum wait is refused (the
// node answers 503 and charges nothing). Nothing here knows about money or tickets.

export class AdmissionError extends Error {
  override name = 'AdmissionError';
  readonly code: 'queue_full' | 'admission_timeout' | 'aborted' | 'closed';
  constructor(code: AdmissionError['code'], message: string) {
    super(message);
    this.code = code;
  }
}

const closedError = () => new AdmissionError('closed', 'the node is shutting down');

interface Waiter {
  resolve: (release: () => void) => void;
  reject: (e: AdmissionError) => void;
  cleanup: () => void;
}

export class Admission {
  readonly slots: number;
  readonly queueLimit: number;
  /** How long a request that names no wait of its own may wait for a slot (default 0: not at all). */
  private readonly defaultMaxWaitMs: number;
  private running = 0;
  private readonly waiting: Waiter[] = [];
  private closed = false;

  constructor(opts: { slots: number; queue: number; defaultMaxWaitMs?: number }) {
    if (!Number.isSafeInteger(opts.slots) || opts.slots < 1) throw new RangeError('slots must be at least 1');
    if (!Number.isSafeInteger(opts.queue) || opts.queue < 0) throw new RangeError('queue must be 0 or more');
    const wait = opts.defaultMaxWaitMs ?? 0;
    if (!(wait >= 0)) throw new RangeError('defaultMaxWaitMs must be 0 or more');
    this.slots = opts.slots;
    this.queueLimit = opts.queue;
    this.defaultMaxWaitMs = wait;
  }

  get inUse(): number {
    return this.running;
  }

  get queued(): number {
    return this.waiting.length;
  }

  /** True when a request arriving now would start at once. */
  get free(): number {
    return this.slots - this.running;
  }

  /**
   * Why a request arriving now would be refused however long it may wait (the node stopping, or
   * every slot busy and the queue full), or undefined: asked before a ticket is used, so that a
   * request the node cannot take anyway does not spend it.
   */
  refusedNow(): AdmissionError | undefined {
    if (this.closed) return closedError();
    if (this.running >= this.slots && this.waiting.length >= this.queueLimit) return this.queueFull();
    return undefined;
  }

  private queueFull(): AdmissionError {
    return new AdmissionError('queue_full', `all ${this.slots} slots are busy and ${this.queueLimit} requests are waiting`);
  }

  /**
   * Resolves with a release function once a slot is held. maxWaitMs 0 means "start now or not at
   * all"; undefined, the default wait. Rejects with queue_full, admission_timeout, aborted (the
   * signal) or closed.
   */
  acquire(opts: { maxWaitMs?: number; signal?: AbortSignal } = {}): Promise<() => void> {
    if (this.closed) return Promise.reject(closedError());
    if (opts.signal?.aborted) return Promise.reject(new AdmissionError('aborted', 'the request was abandoned'));
    if (this.running < this.slots && this.waiting.length === 0) {
      this.running++;
      return Promise.resolve(this.releaser());
    }
    const maxWait = opts.maxWaitMs ?? this.defaultMaxWaitMs;
    if (maxWait <= 0) return Promise.reject(new AdmissionError('admission_timeout', 'no slot is free and the request may not wait'));
    if (this.waiting.length >= this.queueLimit) return Promise.reject(this.queueFull());
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const onAbort = () => {
        drop();
        reject(new AdmissionError('aborted', 'the request was abandoned while waiting'));
      };
      const drop = () => {
        const i = this.waiting.indexOf(waiter);
        if (i >= 0) this.waiting.splice(i, 1);
        waiter.cleanup();
      };
      const waiter: Waiter = {
        resolve,
        reject,
        cleanup: () => {
          if (timer) clearTimeout(timer);
          opts.signal?.removeEventListener('abort', onAbort);
        },
      };
      if (Number.isFinite(maxWait)) {
        timer = setTimeout(() => {
          drop();
          reject(new AdmissionError('admission_timeout', `no slot became free within ${maxWait} ms`));
        }, maxWait);
      }
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(waiter);
    });
  }

  private releaser(): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting.shift();
      if (next) {
        next.cleanup();
        next.resolve(this.releaser()); // the slot passes straight to the next in line
      } else {
        this.running--;
      }
    };
  }

  /** Refuses new requests and every waiting one; running ones finish and release as usual. */
  close(): void {
    this.closed = true;
    for (const w of this.waiting.splice(0)) {
      w.cleanup();
      w.reject(closedError());
    }
  }
}
