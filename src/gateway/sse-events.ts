// Server-sent events cut at their boundaries. A relayed stream is cut into whole SSE events (each
// ends with a blank line) so that its closing event (`data: [DONE]`, or the responses protocol's
// last event: it has no [DONE]) can be held until the receipt verifies.
import { concatBytes } from '../../attestation/bytes.ts';

/** The largest SSE event held back whole; a larger one is relayed as it arrives. */
export const MAX_HELD_EVENT = 4 << 20;

const DONE_LINE = 'data: [DONE]';
// The closing markers are ASCII: matching them needs no UTF-8 decoding (and no decoder per event).
const LATIN1 = new TextDecoder('latin1');
const RESPONSES_END_EVENT = /^event: response\.(?:completed|incomplete|failed)\r?\n/;

/** Where the last blank line of `bytes` ends (SSE allows LF and CRLF line ends), or 0. */
export function blankLineEnd(bytes: Uint8Array): number {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const end = (sep: string): number => {
    const i = b.lastIndexOf(sep);
    return i < 0 ? 0 : i + sep.length;
  };
  return Math.max(end('\n\n'), end('\r\n\r\n'), end('\r\r'));
}

export function endsWithBlankLine(b: Uint8Array): boolean {
  const tail = b.subarray(Math.max(0, b.length - 4));
  return tail.length > 0 && blankLineEnd(tail) === tail.length;
}

/**
 * Where the last complete event ends in `next` (just after its blank line), counting a blank line
 * that starts in the bytes before it (`before`: the chunks still pending, however many and however
 * short); 0 when `next` completes no event. Only `next` and the last 3 bytes before it are searched,
 * so a long event costs linear time.
 */
export function eventsEndAcross(before: readonly Uint8Array[], next: Uint8Array): number {
  const inNext = blankLineEnd(next);
  if (inNext > 0) return inNext;
  const tail = lastBytes(before, 3);
  if (tail.length === 0) return 0;
  const joint = blankLineEnd(concatBytes(tail, next.subarray(0, 3)));
  return joint > tail.length ? joint - tail.length : 0;
}

/** The last `n` bytes of chunks laid end to end (fewer if they hold fewer). */
function lastBytes(chunks: readonly Uint8Array[], n: number): Uint8Array {
  const parts: Uint8Array[] = [];
  let have = 0;
  for (let i = chunks.length - 1; i >= 0 && have < n; i--) {
    const c = chunks[i]!;
    const take = Math.min(c.length, n - have);
    if (take === 0) continue;
    parts.unshift(c.subarray(c.length - take));
    have += take;
  }
  return parts.length === 1 ? parts[0]! : concatBytes(...parts);
}

/** Where the last event of complete events starts (trailing extra line ends belong to it). */
export function lastEventAt(events: Uint8Array): number {
  let e = events.length;
  while (e > 0 && (events[e - 1] === 10 || events[e - 1] === 13)) e--;
  return blankLineEnd(events.subarray(0, e));
}

/** Whether one whole SSE event closes the stream: `data: [DONE]`, or the responses protocol's last event. */
export function isTerminalEvent(event: Uint8Array): boolean {
  let e = event.length;
  while (e > 0 && (event[e - 1] === 10 || event[e - 1] === 13)) e--;
  const head = LATIN1.decode(event.subarray(0, Math.min(e, 64)));
  return (e === DONE_LINE.length && head === DONE_LINE) || RESPONSES_END_EVENT.test(head);
}
