// The node's 5 s watch (model files, state.db, free disk, descriptors), taken from setInterval so a
// test runs it when it wants (no 5 s wait). Call before startNode; restore with vi.restoreAllMocks().
import { vi } from 'vitest';

/** The captured watches (one a node started after this call), each the interval's own function. */
export function captureNodeWatches(): (() => void)[] {
  const realSetInterval = globalThis.setInterval;
  const watches: (() => void)[] = [];
  vi.spyOn(globalThis, 'setInterval').mockImplementation(((fn: () => void, ms?: number, ...args: unknown[]) => {
    if (ms === 5000 && String(fn).includes('watchDisk')) watches.push(fn);
    return realSetInterval(fn, ms, ...args);
  }) as typeof setInterval);
  return watches;
}
