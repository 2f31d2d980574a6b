// Runs a runtime's token generator ahead of its consumer, at most `depth` chunks. Pulled one chunk
// at a time, a generator only computes the next token after the node has relayed the last one, so
// each token would cost the runtime's time plus the relay's. Read ahead, the runtime works on token
// n+1 while token n is being framed and written: the stream runs at the slower of the two rates.
//
// The source runs from the first next(). Once started it is always closed: when it ends, when it
// throws, and when the consumer stops early (return() or a throw into the loop), after its current
// step; its own finally (a runtime slot going back to the pool) therefore runs exactly once. A
// reader closed before its first next() never starts the source. As with any async generator, a
// return() waits behind a next() already pending.

export function readAhead<T, R>(source: AsyncGenerator<T, R, void>, depth: number): AsyncGenerator<T, R, void> {
  if (!Number.isInteger(depth) || depth < 1) throw new RangeError('readAhead: depth must be a positive integer');
  const queue: IteratorResult<T, R>[] = [];
  let failure: { error: unknown } | undefined;
  let stopped = false;
  let wakeConsumer: (() => void) | undefined;
  let wakeProducer: (() => void) | undefined;
  const signalConsumer = () => {
    wakeConsumer?.();
    wakeConsumer = undefined;
  };
  const signalProducer = () => {
    wakeProducer?.();
    wakeProducer = undefined;
  };

  const run = async (): Promise<void> => {
    try {
      for (;;) {
        const r = await source.next();
        queue.push(r);
        signalConsumer();
        if (r.done) return;
        while (queue.length >= depth && !stopped) await new Promise<void>((resolve) => (wakeProducer = resolve));
        if (stopped) return;
      }
    } catch (e) {
      failure = { error: e };
      signalConsumer();
    }
  };

  async function* consume(): AsyncGenerator<T, R, void> {
    // Started by the first next(): a reader closed before it ever read starts nothing.
    const pump = run();
    try {
      for (;;) {
        while (queue.length === 0 && !failure) await new Promise<void>((resolve) => (wakeConsumer = resolve));
        const r = queue.shift();
        if (!r) throw failure!.error;
        signalProducer();
        if (r.done) return r.value;
        yield r.value;
      }
    } finally {
      stopped = true;
      signalProducer();
      await pump;
      // Ends the source if it has not ended: runs its finally (a no-op on a finished generator).
      await source.return(undefined as R);
    }
  }
  return consume();
}
