// Why a fetch threw, in a word where there is one: undici's "fetch failed" hides ECONNREFUSED,
// ENOTFOUND, "bad port"… in its cause.

export function fetchFailure(e: unknown): string {
  const cause = (e as { cause?: { code?: unknown; message?: unknown } } | null)?.cause;
  if (typeof cause?.code === 'string') return cause.code;
  if ((e as Error | null)?.name === 'TimeoutError') return 'no answer in time';
  if (typeof cause?.message === 'string' && cause.message !== '') return cause.message;
  return (e as Error | null)?.message || 'no answer';
}
