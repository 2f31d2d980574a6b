// Server-sent events cut at their boundaries. A relayed stream is cut into whole SSE events (each
// ends with a blank line) so that its closing event (`data: [DONE]`, or the responses protocol's
// last event: it has no [DONE]) can be held until the receipt verifies.
import { concatBytes } from '../../attestation/bytes.ts';

/** The largest SSE event held back whole; a larger one is relayed as it arrives. */
export const MAX_HELD_EVENT = 4 << 20;

// The closing markers are ASCII: matching them needs no UTF-8 decoding (and no decoder per event).
const LATIN1 = new TextDecoder('latin1');
const RESPONSES_END = /^response\.(?:completed|incomplete|failed)$/;
/** How much of an event is read for its fields when judging whether it closes the stream. */
const TERMINAL_SCAN = 4096;

/**
 * Where the last blank line of `bytes` ends, or 0. SSE ends a line with CRLF, LF or CR, so a blank
 * line is any two line ends in a row: LF LF, CR CR, LF CRLF (and so CRLF CRLF), and LF or CRLF
 * followed by a lone CR. A CR as the very last byte may be the start of a CRLF: it ends nothing yet.
 */
export function blankLineEnd(bytes: Uint8Array): number {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const end = (sep: string): number => {
    const i = b.lastIndexOf(sep);
    return i < 0 ? 0 : i + sep.length;
  };
  // LF then a lone CR (one not followed by LF, and not the last byte).
  let lfCr = b.lastIndexOf('\n\r');
  while (lfCr >= 0 && (lfCr + 2 >= b.length || b[lfCr + 2] === 10)) lfCr = lfCr > 0 ? b.lastIndexOf('\n\r', lfCr - 1) : -1;
  return Math.max(end('\n\n'), end('\n\r\n'), end('\r\r'), lfCr < 0 ? 0 : lfCr + 2);
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

/**
 * Whether one whole SSE event closes the stream: data `[DONE]`, or the responses protocol's last
 * event (`event: response.completed`, `.incomplete` or `.failed`), whatever the line ends, the
 * space after the colon, comments or the order of the fields.
 */
export function isTerminalEvent(event: Uint8Array): boolean {
  const data: string[] = [];
  for (const line of LATIN1.decode(event.subarray(0, TERMINAL_SCAN)).split(/\r\n|\r|\n/)) {
    const colon = line.indexOf(':');
    if (colon === 0 || line.length === 0) continue; // a comment, or the blank line
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? '' : line.slice(line[colon + 1] === ' ' ? colon + 2 : colon + 1);
    if (field === 'event' && RESPONSES_END.test(value)) return true;
    if (field === 'data') data.push(value);
  }
  return data.join('\n') === '[DONE]';
}

// Markers a batch of events must contain before it is searched for a closing event: a finish
// chunk (a finish_reason that is a string: in JSON text a quote inside a string is escaped, so
// generated text cannot produce this), a usage chunk, [DONE], or the responses protocol's end.
const CLOSING_MARKERS = ['"finish_reason":"', '"finish_reason": "', '"usage"', '[DONE]', 'response.completed', 'response.incomplete', 'response.failed'];
const UTF8 = new TextDecoder();

/** Where each event ends (just after its blank line), in order; an unterminated last event ends at the end. */
export function eventEnds(events: Uint8Array): number[] {
  const ends: number[] = [];
  let lineStart = 0;
  for (let i = 0; i < events.length; ) {
    const c = events[i];
    if (c !== 10 && c !== 13) {
      i++;
      continue;
    }
    const next = c === 13 && events[i + 1] === 10 ? i + 2 : i + 1;
    if (i === lineStart) ends.push(next); // an empty line ends the event
    lineStart = next;
    i = next;
  }
  if ((ends.at(-1) ?? 0) < events.length) ends.push(events.length);
  return ends;
}

/** The event's data lines joined, as SSE defines it; undefined for an event without data. */
function eventData(event: Uint8Array): { data: string; other: string[] } | undefined {
  const data: string[] = [];
  const other: string[] = [];
  for (const line of UTF8.decode(event).split(/\r\n|\r|\n/)) {
    if (line.length === 0) continue;
    if (line.startsWith('data')) {
      const colon = line.indexOf(':');
      if (colon === 4) {
        data.push(line.slice(line[5] === ' ' ? 6 : 5));
        continue;
      }
      if (colon < 0 && line.length === 4) {
        data.push('');
        continue;
      }
    }
    other.push(line);
  }
  return data.length ? { data: data.join('\n'), other } : undefined;
}

function eventJson(event: Uint8Array): { value: Record<string, unknown>; other: string[] } | undefined {
  const d = eventData(event);
  if (!d) return undefined;
  try {
    const value = JSON.parse(d.data) as unknown;
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? { value: value as Record<string, unknown>, other: d.other } : undefined;
  } catch {
    return undefined;
  }
}

/** A chat or completions chunk that closes its stream: one with a finish_reason, or the usage chunk. */
function isClosingChunk(event: Uint8Array): boolean {
  const v = eventJson(event)?.value;
  const choices = v?.choices;
  if (!Array.isArray(choices)) return false;
  if (choices.length === 0) return v!.usage !== null && typeof v!.usage === 'object';
  return choices.some((c: unknown) => c !== null && typeof c === 'object' && typeof (c as { finish_reason?: unknown }).finish_reason === 'string');
}

/**
 * Where the closing part of a batch of whole events starts: its first finish chunk, usage chunk,
 * [DONE] or closing responses event; `events.length` when it has none. The closing part is held
 * until the receipt verifies, so that the receipt can join it (withService). Tokens never wait:
 * nothing but the closing chunks follows a finish chunk.
 */
export function closingStart(events: Uint8Array): number {
  const b = Buffer.from(events.buffer, events.byteOffset, events.byteLength);
  if (!CLOSING_MARKERS.some((m) => b.includes(m))) return events.length;
  let start = 0;
  for (const end of eventEnds(events)) {
    const ev = events.subarray(start, end);
    if (isTerminalEvent(ev) || isClosingChunk(ev)) return start;
    start = end;
  }
  return events.length;
}

/**
 * The held closing events with `service` joined to their last JSON event: for chat and
 * completions the last chunk before [DONE], for responses the closing event's `response`. The
 * fields are added as the last members of the `service` object there (the node's closing chunks
 * end with `service: {request_id}`), so removing `,"receipt":…` gives back the node's bytes, which
 * the receipt's response_sha256 covers. Events that cannot take it are returned as they are.
 */
export function withService(held: Uint8Array, service: { request_id: string; receipt: unknown }): Uint8Array {
  let start = 0;
  let last: { start: number; end: number; json: NonNullable<ReturnType<typeof eventJson>> } | undefined;
  for (const end of eventEnds(held)) {
    const json = eventJson(held.subarray(start, end));
    if (json) last = { start, end, json };
    start = end;
  }
  if (!last) return held;
  const { value, other } = last.json;
  const response = value.response;
  const target = typeof value.type === 'string' && value.type.startsWith('response.') && response !== null && typeof response === 'object' && !Array.isArray(response) ? (response as Record<string, unknown>) : value;
  const own = target.service;
  target.service = { ...(own !== null && typeof own === 'object' && !Array.isArray(own) ? own : {}), request_id: service.request_id, receipt: service.receipt };
  const event = Buffer.from(`${other.map((l) => `${l}\n`).join('')}data: ${JSON.stringify(value)}\n\n`);
  return concatBytes(held.subarray(0, last.start), event, held.subarray(last.end));
}
