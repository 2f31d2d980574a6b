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

// Markers an event must contain to be looked at as a closing one: a finish chunk (a finish_reason
// that is a string: in JSON text a quote inside a string is escaped, so generated text cannot
// produce this), a usage chunk, [DONE], or the responses protocol's end.
const CLOSING_MARKERS = ['"finish_reason":"', '"choices":[]', '[DONE]', 'response.completed', 'response.incomplete', 'response.failed'];
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

/**
 * How many events of one stream may still be looked at as closing ones. Each costs a few
 * microseconds; an honest stream has a handful (its closing ones, and tokens whose text holds
 * "[DONE]"), and a provider sending nothing but markers must not make the gateway read them all.
 */
export class ClosingScan {
  left = 4096;
}

/** The node's closing chunks, by their bytes (no JSON is parsed): a finish chunk, or the usage chunk. */
function isClosingChunk(event: Buffer): boolean {
  return event.includes('"finish_reason":"') || (event.includes('"choices":[]') && event.includes('"usage":{'));
}

/**
 * Where the closing part of a batch of whole events starts: its first finish chunk, usage chunk,
 * [DONE] or closing responses event; `events.length` when it has none, or when `scan` has looked
 * at all it may. The closing part is held until the receipt verifies, so that the receipt can join
 * it (withService). Tokens never wait: nothing but the closing chunks follows a finish chunk.
 * Linear in the batch: each marker is searched for once from where the last was found.
 */
export function closingStart(events: Uint8Array, scan: ClosingScan = new ClosingScan()): number {
  if (scan.left <= 0) return events.length;
  const b = Buffer.from(events.buffer, events.byteOffset, events.byteLength);
  const next = CLOSING_MARKERS.map((m) => b.indexOf(m));
  if (next.every((at) => at < 0)) return events.length;
  let start = 0;
  for (const end of eventEnds(events)) {
    let marked = false;
    for (let k = 0; k < next.length; k++) {
      if (next[k]! >= 0 && next[k]! < start) next[k] = b.indexOf(CLOSING_MARKERS[k]!, start);
      if (next[k]! >= start && next[k]! < end) marked = true;
    }
    if (marked) {
      if (--scan.left < 0) return events.length;
      const ev = b.subarray(start, end);
      if (isClosingChunk(ev) || isTerminalEvent(ev)) return start;
    }
    start = end;
  }
  return events.length;
}

/** Events held back, kept as the parts they came in: joined once, when they are relayed. */
export class HeldEvents {
  private parts: Uint8Array[] = [];
  bytes = 0;

  get empty(): boolean {
    return this.parts.length === 0;
  }

  add(events: Uint8Array): void {
    if (!events.length) return;
    this.parts.push(events);
    this.bytes += events.length;
  }

  /** Everything held, joined, and the hold emptied; undefined when nothing is held. */
  take(): Uint8Array | undefined {
    const parts = this.parts;
    this.parts = [];
    this.bytes = 0;
    return parts.length === 0 ? undefined : parts.length === 1 ? parts[0] : concatBytes(...parts);
  }
}

/** The event's data lines joined, as SSE defines it, and its other lines; undefined for an event without data. */
function eventData(event: Uint8Array): { data: string; other: string[] } | undefined {
  const data: string[] = [];
  const other: string[] = [];
  for (const line of UTF8.decode(event).split(/\r\n|\r|\n/)) {
    if (line.length === 0) continue;
    if (line === 'data' || line.startsWith('data:')) data.push(line.slice(line[5] === ' ' ? 6 : 5));
    else other.push(line);
  }
  return data.length ? { data: data.join('\n'), other } : undefined;
}

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);

/**
 * The held closing events with the receipt added to the node's `service` in the last of them: for
 * chat and completions the last chunk before [DONE], for responses the closing event's
 * `response.service`. Only in the node's own form: the event exactly `data: <compact JSON>` (after
 * an `event:` line for responses) and a blank line, its `service` the last member on a path of
 * last members and naming the request; the receipt is then inserted as its last member, so that
 * taking `,"receipt":…` out gives back the node's bytes, which the receipt's response_sha256
 * covers. Anything else (another provider's format, one whose chunks carry no `service`) is
 * relayed as it came, the receipt left to GET /v1/requests/{id}.
 */
export function withService(held: Uint8Array, service: { request_id: string; receipt: unknown; hedged_with?: string }): Uint8Array {
  const last = dataEvents(held).at(-1);
  if (!last) return held;
  const inserted = insertReceipt(held.subarray(last.start, last.end), last.d, service);
  return inserted ? concatBytes(held.subarray(0, last.start), inserted, held.subarray(last.end)) : held;
}

/** The events of `held` that carry data other than [DONE], in order, with where each is. */
function dataEvents(held: Uint8Array): { start: number; end: number; d: { data: string; other: string[] } }[] {
  const ends = eventEnds(held);
  return ends.flatMap((end, e) => {
    const start = e > 0 ? ends[e - 1]! : 0;
    const d = eventData(held.subarray(start, end));
    return d && d.data !== '[DONE]' ? [{ start, end, d }] : [];
  });
}

/**
 * The usage the held closing events tell the buyer: a chat or completions stream's usage chunk
 * (`usage`), or the responses protocol's closing event (`response.usage`). Undefined when none
 * carries one (a stream without include_usage).
 */
export function usageOfEvents(held: Uint8Array): Record<string, unknown> | undefined {
  for (const { d } of dataEvents(held)) {
    let value: unknown;
    try {
      value = JSON.parse(d.data);
    } catch {
      continue;
    }
    if (!isObject(value)) continue;
    if (isObject(value.usage)) return value.usage;
    if (isObject(value.response) && isObject(value.response.usage)) return value.response.usage;
  }
  return undefined;
}

/** The event with the receipt inserted (withService), or undefined when it is not in the node's form. */
function insertReceipt(event: Uint8Array, d: { data: string; other: string[] }, service: { request_id: string; receipt: unknown; hedged_with?: string }): Uint8Array | undefined {
  let value: unknown;
  try {
    value = JSON.parse(d.data);
  } catch {
    return undefined;
  }
  if (!isObject(value)) return undefined;
  const data = JSON.stringify(value);
  const head = d.other.map((l) => `${l}\n`).join('');
  if (!Buffer.from(`${head}data: ${data}\n\n`).equals(event)) return undefined;
  const path = typeof value.type === 'string' && value.type.startsWith('response.') ? ['response', 'service'] : ['service'];
  let at: Record<string, unknown> = value;
  for (const k of path) {
    const inner = at[k];
    if (Object.keys(at).at(-1) !== k || !isObject(inner)) return undefined;
    at = inner;
  }
  if (at.request_id !== service.request_id || Object.hasOwn(at, 'receipt')) return undefined;
  // The data ends with the closing braces of `service` and of each object around it.
  const cut = data.length - (path.length + 1);
  const hedge = service.hedged_with === undefined ? '' : `,"hedged_with":${JSON.stringify(service.hedged_with)}`;
  return Buffer.from(`${head}data: ${data.slice(0, cut)},"receipt":${JSON.stringify(service.receipt)}${hedge}${data.slice(cut)}\n\n`);
}
