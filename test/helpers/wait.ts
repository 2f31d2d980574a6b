// Polling for a condition in tests that drive real processes and servers.

/** Resolves with fn's first defined value; throws "timed out waiting for <what>" after `ms`. */
export async function waitFor<T>(what: string, fn: () => T | undefined | Promise<T | undefined>, ms = 15_000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** Resolves once check() holds; throws "timed out waiting for <what>" after `ms`. */
export async function until(what: string, check: () => boolean | Promise<boolean>, ms = 5000): Promise<void> {
  await waitFor(what, async () => ((await check()) ? true : undefined), ms, 20);
}

/** Resolves once the marketplace at `marketUrl` lists every provider id of `ids` (GET /v1/providers). */
export async function waitForListed(marketUrl: string, ids: readonly string[]): Promise<void> {
  await until(
    `the market to list ${ids.length === 1 ? 'the provider' : `all ${ids.length} providers`}`,
    async () => {
      const list = (await (await fetch(`${marketUrl}/v1/providers`)).json()) as { provider: string }[];
      return ids.every((id) => list.some((p) => p.provider === id));
    },
    15_000,
  );
}

/** Lets every pending promise callback run (a few turns of the event loop). */
export async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}

/** Tracks whether a promise has settled, without handling it for the caller. */
export function track<T>(p: Promise<T>): { settled: () => boolean; p: Promise<T> } {
  let done = false;
  p.then(
    () => (done = true),
    () => (done = true),
  );
  return { settled: () => done, p };
}
