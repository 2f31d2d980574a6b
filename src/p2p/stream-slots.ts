// How many streams this process has open for one protocol on one connection, with a wait for a
// free one. A node refuses streams beyond its per-protocol limit by resetting them (libp2p's
// maxInboundStreams), and libp2p's own outbound check counts only streams already negotiated, so a
// burst of requests over the limit lost its tail to resets. Requests beyond the limit now wait here
// until one of the connection's streams for that protocol closes.

interface Slots {
  open: number;
  waiting: (() => void)[];
}

const byConnection = new WeakMap<object, Map<string, Slots>>();

/**
 * Takes one of `max` stream slots for `protocol` on `connection`, waiting (until `signal` aborts)
 * while all are taken. Resolves with the release, to call once the stream is closed (or was never
 * opened); calling it again does nothing.
 */
export async function takeStreamSlot(connection: object, protocol: string, max: number, signal?: AbortSignal): Promise<() => void> {
  let protocols = byConnection.get(connection);
  if (!protocols) byConnection.set(connection, (protocols = new Map()));
  let slots = protocols.get(protocol);
  if (!slots) protocols.set(protocol, (slots = { open: 0, waiting: [] }));
  const s = slots;
  while (s.open >= max) {
    signal?.throwIfAborted();
    await new Promise<void>((resolve, reject) => {
      const wake = (): void => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = (): void => {
        const i = s.waiting.indexOf(wake);
        if (i >= 0) s.waiting.splice(i, 1);
        reject(signal!.reason);
      };
      s.waiting.push(wake);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }
  s.open++;
  let released = false;
  return () => {
    if (released) return;
    released = true;
    s.open--;
    s.waiting.shift()?.();
  };
}
