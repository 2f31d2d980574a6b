// The gateway's market client against answers that are not the market's API: too large (declared
// or endless), a redirect, a status the API does not use. Each is 502 bad_market_response, named;
// the API's own refusals are relayed with the market's code.
import { describe, expect, test } from 'vitest';
import { MarketClient } from '../src/gateway/market-client.ts';

/** A client whose every call is answered by `answer`; `calls` counts them. */
function clientAnswering(answer: () => Response): { client: MarketClient; calls: () => number } {
  let n = 0;
  const fetchFn = (async () => {
    n++;
    return answer();
  }) as typeof fetch;
  return { client: new MarketClient('http://market.invalid', { fetch: fetchFn }), calls: () => n };
}

const json = (status: number, body: unknown, headers: Record<string, string> = {}) => new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });

describe('MarketClient reads the market\'s answers with bounds', () => {
  test('an answer declared larger than 64 MiB is not read', async () => {
    const { client } = clientAnswering(() => new Response('{}', { status: 200, headers: { 'content-length': String(65 * 1024 * 1024) } }));
    await expect(client.marketKey()).rejects.toMatchObject({ status: 502, code: 'bad_market_response', message: expect.stringMatching(/larger than 67108864 bytes/) });
  });

  test('an endless answer is cut off at 64 MiB, not read into memory', async () => {
    let sent = 0;
    const chunk = new Uint8Array(1024 * 1024).fill(0x20);
    const { client } = clientAnswering(
      () =>
        new Response(
          new ReadableStream<Uint8Array>({
            pull(c) {
              sent += chunk.length;
              c.enqueue(chunk);
            },
          }),
          { status: 200 },
        ),
    );
    await expect(client.marketKey()).rejects.toMatchObject({ status: 502, code: 'bad_market_response', message: expect.stringMatching(/larger than/) });
    expect(sent).toBeLessThan(68 * 1024 * 1024);
  });

  test('an answer cut off mid-body is market_unreachable, named, not a malformed answer', async () => {
    const { client } = clientAnswering(
      () =>
        new Response(
          new ReadableStream<Uint8Array>({
            start(c) {
              c.enqueue(new TextEncoder().encode('{"public_key":"ab'));
              c.error(new Error('connection reset'));
            },
          }),
          { status: 200 },
        ),
    );
    await expect(client.marketKey()).rejects.toMatchObject({ status: 502, code: 'market_unreachable', message: expect.stringMatching(/was cut off \(connection reset\)/) });
  });

  test('a redirect is not followed, and a status the API does not answer with is not relayed to the buyer', async () => {
    for (const answer of [new Response(null, { status: 307, headers: { location: 'http://elsewhere.invalid/v1/market' } }), json(401, { error: { code: 'unauthorized', message: 'proxy login' } }), json(399, { error: { code: 'odd', message: 'odd' } })]) {
      const status = answer.status;
      const { client } = clientAnswering(() => answer);
      await expect(client.marketKey(), String(status)).rejects.toMatchObject({ status: 502, code: 'bad_market_response', message: expect.stringContaining(`HTTP ${status}`) });
    }
  });

  test("the API's own refusals are relayed with the market's code", async () => {
    for (const [status, code] of [[429, 'rate_limited'], [503, 'no_provider'], [404, 'model_not_found']] as const) {
      const { client } = clientAnswering(() => json(status, { error: { code, message: 'scripted' } }));
      await expect(client.marketKey()).rejects.toMatchObject({ status, code });
    }
  });
});

describe('MarketClient.close', () => {
  test('a call under way ends at once, and later calls fail without asking the market', async () => {
    let asked = 0;
    let started!: () => void;
    const asking = new Promise<void>((r) => (started = r));
    const client = new MarketClient('http://market.invalid', {
      timeoutMs: 600_000,
      fetch: ((_url: string, init: RequestInit) => {
        asked++;
        started();
        return new Promise((_resolve, reject) => init.signal!.addEventListener('abort', () => reject(init.signal!.reason), { once: true }));
      }) as unknown as typeof fetch,
    });
    const key = client.marketKey();
    await asking;
    client.close();
    await expect(key).rejects.toMatchObject({ status: 503, code: 'market_unreachable', message: expect.stringMatching(/had not answered when the gateway stopped/) });
    await expect(client.providers()).rejects.toMatchObject({ code: 'market_unreachable', message: expect.stringMatching(/the gateway is stopping/) });
    expect(asked).toBe(1);
  });
});
