// Waiting for work with a bound: shutdowns and lookups that must not hang on a peer.

/** Whether `work` settled (fulfilled or rejected) within `ms`; the timer is cleared either way. */
export async function settledWithin(work: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const settled = await Promise.race([
    work.then(
      () => true,
      () => true,
    ),
    new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), ms);
    }),
  ]);
  clearTimeout(timer);
  return settled;
}
