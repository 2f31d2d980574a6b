// Reading an HTTP answer from another party (the marketplace) with a bound on its size: a body is
// otherwise read whole, however large (or endless) it is, into this process's memory.

/** The answer's body was larger than allowed (the read was cancelled there). */
export class BodyTooLargeError extends Error {
  readonly maxBytes: number;
  constructor(maxBytes: number) {
    super(`the answer is larger than ${maxBytes} bytes`);
    this.name = 'BodyTooLargeError';
    this.maxBytes = maxBytes;
  }
}

/**
 * The body of `res` as UTF-8 text, at most `maxBytes` of it: a larger one (by Content-Length, or
 * as it arrives) cancels the read and rejects with BodyTooLargeError.
 */
export async function readBoundedText(res: Response, maxBytes: number): Promise<string> {
  const declared = Number(res.headers.get('content-length') ?? NaN);
  if (declared > maxBytes) {
    await res.body?.cancel().catch(() => undefined);
    throw new BodyTooLargeError(maxBytes);
  }
  if (!res.body) return '';
  const reader = res.body.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => undefined);
      throw new BodyTooLargeError(maxBytes);
    }
    parts.push(value);
  }
  return Buffer.concat(parts, size).toString('utf8');
}
