// Why a node's start ended without a node: NodeStartError (a config, a file, a port, a model the
// operator must see to), or NodeStartStopped (the operator stopped it, e.g. a SIGTERM while a model
// loads). unlessStopped lets a start step be left behind when the start is stopped.

export class NodeStartError extends Error {
  override name = 'NodeStartError';
}

/** The start was stopped (its `signal`: the operator's SIGTERM or Ctrl-C) before the node served; what it had opened is closed. */
export class NodeStartStopped extends NodeStartError {
  override name = 'NodeStartStopped';
  constructor() {
    super('stopped during start-up, before the node served');
  }
}

/**
 * `work`, unless `signal` aborts first: then NodeStartStopped at once, and `work` goes on unwatched
 * (`abandon` releases what it gives when it ends; a model load cannot be cut short).
 */
export function unlessStopped<T>(work: Promise<T>, signal: AbortSignal | undefined, abandon: (t: T) => unknown = () => undefined): Promise<T> {
  if (!signal) return work;
  if (signal.aborted) {
    void work.then(abandon, () => undefined);
    return Promise.reject(new NodeStartStopped());
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => {
      void work.then(abandon, () => undefined);
      reject(new NodeStartStopped());
    };
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e as Error);
      },
    );
  });
}
