// The SSE boundary helpers the gateway relays streams with: events are cut at blank lines (LF,
// CRLF or CR line ends), including a blank line split between two chunks.
import { describe, expect, test } from 'vitest';
import { blankLineEnd, endsWithBlankLine, eventsEndAcross, isTerminalEvent, lastEventAt } from '../src/gateway/sse-events.ts';

const b = (s: string): Uint8Array => new TextEncoder().encode(s);

describe('sse events', () => {
  test('blankLineEnd finds the end of the last blank line, whatever the line ends', () => {
    expect(blankLineEnd(b('data: a'))).toBe(0);
    expect(blankLineEnd(b('data: a\n'))).toBe(0);
    expect(blankLineEnd(b('data: a\n\n'))).toBe(9);
    expect(blankLineEnd(b('data: a\n\ndata: b\n\ndata: c'))).toBe(18);
    expect(blankLineEnd(b('data: a\r\n\r\ndata: b'))).toBe(11);
    expect(blankLineEnd(b('data: a\r\rdata: b'))).toBe(9);
  });

  test('blankLineEnd: any two line ends in a row (LF, CR or CRLF), a CR at the very end not yet', () => {
    expect(blankLineEnd(b('data: a\n\r\ndata: b'))).toBe(10); // LF then CRLF
    expect(blankLineEnd(b('data: a\n\rdata: b'))).toBe(9); // LF then a lone CR
    expect(blankLineEnd(b('data: a\r\n\rdata: b'))).toBe(10); // CRLF then a lone CR
    expect(blankLineEnd(b('data: a\n\r'))).toBe(0); // the CR may be the start of a CRLF
    expect(blankLineEnd(b('data: a\r\n'))).toBe(0);
  });

  test('endsWithBlankLine', () => {
    expect(endsWithBlankLine(b('data: a\n\n'))).toBe(true);
    expect(endsWithBlankLine(b('data: a\r\n\r\n'))).toBe(true);
    expect(endsWithBlankLine(b('data: a\n'))).toBe(false);
    expect(endsWithBlankLine(b('data: a\n\ndata: b'))).toBe(false);
    expect(endsWithBlankLine(new Uint8Array(0))).toBe(false);
  });

  test('eventsEndAcross: a blank line split between chunks ends the event in the next chunk', () => {
    // "\n" | "\n"
    expect(eventsEndAcross([b('data: a\n')], b('\ndata: b'))).toBe(1);
    // "\r\n" | "\r\n"
    expect(eventsEndAcross([b('data: a\r\n')], b('\r\ndata: b'))).toBe(2);
    // "\r\n\r" | "\n"
    expect(eventsEndAcross([b('data: a\r\n\r')], b('\ndata: b'))).toBe(1);
    // nothing before, or nothing that ends an event
    expect(eventsEndAcross([], b('\ndata: b'))).toBe(0);
    expect(eventsEndAcross([b('data: a')], b('\ndata: b'))).toBe(0);
    expect(eventsEndAcross([b('data: a\n')], b('data: b'))).toBe(0);
    // a blank line inside the next chunk wins: the last one counts
    expect(eventsEndAcross([b('data: a\n')], b('\ndata: b\n\ndata: c'))).toBe(10);
  });

  test('eventsEndAcross: a blank line spread over three chunks, or with empty chunks between, still ends the event', () => {
    // "\r\n" | "\r" | "\n"
    expect(eventsEndAcross([b('data: [DONE]\r\n'), b('\r')], b('\n'))).toBe(1);
    // "\r" | "\n\r" | "\n"
    expect(eventsEndAcross([b('data: [DONE]\r'), b('\n\r')], b('\ndata: x'))).toBe(1);
    // "\n" | "" | "\n"
    expect(eventsEndAcross([b('data: [DONE]\n'), new Uint8Array(0)], b('\n'))).toBe(1);
    // one byte a chunk
    expect(eventsEndAcross([b('d'), b('\r'), b('\n'), b('\r')], b('\n'))).toBe(1);
    expect(eventsEndAcross([b('d'), b('\r'), b('\n')], b('x'))).toBe(0);
  });

  test('lastEventAt: where the last of several whole events starts', () => {
    const two = b('data: a\n\ndata: [DONE]\n\n');
    expect(lastEventAt(two)).toBe(9);
    expect(new TextDecoder().decode(two.subarray(lastEventAt(two)))).toBe('data: [DONE]\n\n');
    expect(lastEventAt(b('data: only\n\n'))).toBe(0);
  });

  test('isTerminalEvent: [DONE] and the responses protocol\'s closing events, nothing else', () => {
    expect(isTerminalEvent(b('data: [DONE]\n\n'))).toBe(true);
    expect(isTerminalEvent(b('data: [DONE]\r\n\r\n'))).toBe(true);
    expect(isTerminalEvent(b('data: [DONE] \n\n'))).toBe(false);
    expect(isTerminalEvent(b('data: [DONE]x\n\n'))).toBe(false);
    for (const t of ['completed', 'incomplete', 'failed']) expect(isTerminalEvent(b(`event: response.${t}\ndata: {}\n\n`))).toBe(true);
    expect(isTerminalEvent(b('event: response.output_text.delta\ndata: {}\n\n'))).toBe(false);
    expect(isTerminalEvent(b('data: {"choices":[]}\n\n'))).toBe(false);
    // Written the other ways SSE allows: no space, other line ends, comments and fields first.
    expect(isTerminalEvent(b('data:[DONE]\n\n'))).toBe(true);
    expect(isTerminalEvent(b(': ping\nid: 7\ndata: [DONE]\r\r'))).toBe(true);
    expect(isTerminalEvent(b('data: [DONE]'))).toBe(true);
    expect(isTerminalEvent(b('data:  [DONE]\n\n'))).toBe(false); // two spaces: the value is " [DONE]"
    expect(isTerminalEvent(b('data: [DONE]\ndata: more\n\n'))).toBe(false);
    expect(isTerminalEvent(b(`data: ${JSON.stringify({ x: 1 })}\nevent:response.completed\n\n`))).toBe(true);
  });
});
