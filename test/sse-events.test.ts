// The SSE boundary helpers the gateway relays streams with: events are cut at blank lines (LF,
// CRLF or CR line ends), including a blank line split between two chunks.
import { describe, expect, test } from 'vitest';
import { blankLineEnd, closingStart, ClosingScan, endsWithBlankLine, eventEnds, eventsEndAcross, HeldEvents, isTerminalEvent, lastEventAt, withService } from '../src/gateway/sse-events.ts';
import { CompletionStream, ResponsesStream, usageOut } from '../src/serve/openai-format.ts';

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

  test('eventEnds: each event of a batch, whatever the line ends, and an unterminated last one', () => {
    expect(eventEnds(b('data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d'))).toEqual([9, 20, 29, 36]);
    expect(eventEnds(b('event: x\ndata: a\n\n'))).toEqual([18]);
    expect(eventEnds(b(''))).toEqual([]);
  });

  describe('the closing events of a stream, and the receipt joined to them', () => {
    const usage = usageOut(5, 3, '0.000002');
    const dec = (u: Uint8Array): string => new TextDecoder().decode(u);
    const chunks = (chat: boolean, withUsage: boolean): { deltas: Uint8Array; close: Uint8Array } => {
      const s = new CompletionStream(chat, 'req-1', 'm', 1);
      // Text that looks like the markers: inside a JSON string a quote is escaped.
      const deltas = b([s.start() ? dec(s.start()!) : '', dec(s.delta('a "finish_reason":"stop" [DONE] "usage"')), dec(s.delta(' b'))].join(''));
      return { deltas, close: s.close('stop', withUsage ? usage : undefined) };
    };

    test('closingStart: the finish chunk starts it, with or without the usage chunk; token chunks never do', () => {
      for (const chat of [true, false])
        for (const withUsage of [true, false]) {
          const { deltas, close } = chunks(chat, withUsage);
          expect(closingStart(deltas)).toBe(deltas.length);
          const all = b(dec(deltas) + dec(close));
          expect(closingStart(all)).toBe(deltas.length);
          expect(closingStart(close)).toBe(0);
        }
      expect(closingStart(b('data: [DONE]\n\n'))).toBe(0);
      const rest = b('data: {"choices":[],"usage":{"prompt_tokens":1}}\n\ndata: [DONE]\n\n');
      const token = 'data: {"choices":[{"delta":{}}]}\n\n';
      expect(closingStart(b(token + dec(rest)))).toBe(token.length);
      const noUsage = 'data: {"choices":[],"usage":null}\n\n';
      expect(closingStart(b(noUsage))).toBe(noUsage.length);
    });

    test('closingStart: the responses protocol closes only at its last event', () => {
      const r = new ResponsesStream('req-1', 'm', 1);
      const start = r.start();
      const delta = r.delta('response.completed');
      const finish = r.finish('stop', usage);
      const all = b(dec(start) + dec(delta) + dec(finish));
      const at = closingStart(all);
      expect(dec(all.subarray(at))).toMatch(/^event: response\.completed\n/);
      expect(closingStart(b(dec(start) + dec(delta)))).toBe(start.length + delta.length);
    });

    test('withService: the receipt is the last member of the last chunk\'s service; without it the bytes are the node\'s', () => {
      for (const chat of [true, false])
        for (const withUsage of [true, false]) {
          const { close } = chunks(chat, withUsage);
          const receipt = { payloadType: 't', payload: 'cA==', signatures: [{ keyid: 'k', sig: 'c2ln' }] };
          const out = dec(withService(close, { request_id: 'req-1', receipt }));
          const events = out.split('\n\n').filter(Boolean);
          expect(events.at(-1)).toBe('data: [DONE]');
          const last = JSON.parse(events.at(-2)!.slice(6)) as { usage?: unknown; service: unknown };
          expect(last.service).toEqual({ request_id: 'req-1', receipt });
          expect(last.usage !== undefined).toBe(withUsage);
          expect(out.replace(`,"receipt":${JSON.stringify(receipt)}`, '')).toBe(dec(close));
        }
    });

    test('withService: a responses stream carries it in the closing event\'s response.service', () => {
      const r = new ResponsesStream('req-1', 'm', 1);
      const finish = r.finish('stop', usage);
      const out = dec(withService(finish, { request_id: 'req-1', receipt: 'R' }));
      const last = out.split('\n\n').filter(Boolean).at(-1)!;
      expect(last.split('\n')[0]).toBe('event: response.completed');
      expect((JSON.parse(last.split('\n')[1]!.slice(6)) as { response: { service: unknown } }).response.service).toEqual({ request_id: 'req-1', receipt: 'R' });
      expect(out.replace(',"receipt":"R"', '')).toBe(dec(finish));
    });

    test('withService: only in the node\'s own form; anything else is relayed as it came (the byte claim never breaks)', () => {
      const svc = { request_id: 'x', receipt: 1 };
      const node = 'data: {"a":1,"service":{"request_id":"x"}}\n\ndata: [DONE]\n\n';
      expect(dec(withService(b(node), svc))).toBe('data: {"a":1,"service":{"request_id":"x","receipt":1}}\n\ndata: [DONE]\n\n');
      for (const other of [
        'data: {"a":1}\n\ndata: [DONE]\n\n', // no service (an earlier node's chunk)
        'data: {"a":1,"service":{"request_id":"x"}}\r\n\r\ndata: [DONE]\r\n\r\n', // CRLF
        'data:{"a":1,"service":{"request_id":"x"}}\n\ndata: [DONE]\n\n', // no space after the colon
        'data: {"a": 1, "service": {"request_id": "x"}}\n\ndata: [DONE]\n\n', // spaced JSON
        'data: {"service":{"request_id":"x"},"a":1}\n\ndata: [DONE]\n\n', // service not last
        'data: {"a":1,"service":{"request_id":"y"}}\n\ndata: [DONE]\n\n', // another request
        'data: {"a":1,"service":{"request_id":"x","receipt":0}}\n\ndata: [DONE]\n\n', // a receipt already
        'data: [DONE]\n\n',
        'data: {"a":\n\n',
      ]) expect(dec(withService(b(other), svc)), other).toBe(other);
    });

    test('closingStart looks at a bounded number of marked events a stream: a provider sending nothing but markers is relayed, not read', () => {
      const scan = new ClosingScan();
      const noise = b('data: [DONE]x\n\n'.repeat(5000));
      expect(closingStart(noise, scan)).toBe(noise.length);
      expect(scan.left).toBeLessThanOrEqual(0);
      // Once spent, even a real closing batch is relayed as it comes.
      expect(closingStart(b('data: [DONE]\n\n'), scan)).toBe(14);
      // An honest stream's token text naming the markers spends a little of it.
      const fresh = new ClosingScan();
      const { deltas } = chunks(true, false);
      expect(closingStart(deltas, fresh)).toBe(deltas.length);
      expect(fresh.left).toBe(4095);
    });

    test('HeldEvents: parts kept as they come, joined once', () => {
      const h = new HeldEvents();
      expect([h.empty, h.take()]).toEqual([true, undefined]);
      h.add(b('ab'));
      h.add(b(''));
      h.add(b('c'));
      expect([h.empty, h.bytes]).toEqual([false, 3]);
      expect(dec(h.take()!)).toBe('abc');
      expect([h.empty, h.bytes]).toEqual([true, 0]);
    });
  });
});
