// closeHttp: a fastify server closes within its bound, whatever its keep-alive clients do.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { fastify, type FastifyInstance } from 'fastify';
import { describe, expect, test } from 'vitest';
import { closeHttp } from '../src/http-close.ts';

async function serve(handler: () => Promise<string>): Promise<{ app: FastifyInstance; port: number; entered: Promise<void> }> {
  const app = fastify({ logger: false, return503OnClosing: true }); // keepAliveTimeout: fastify's 72 s
  let enter!: () => void;
  const entered = new Promise<void>((r) => (enter = r));
  app.get('/', async () => {
    enter();
    return handler();
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  return { app, port: (app.server.address() as AddressInfo).port, entered };
}

function get(port: number, agent: http.Agent): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: '/', agent }, (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (body += c));
        res.on('end', () => resolve({ status: res.statusCode!, body }));
      })
      .on('error', reject);
  });
}

describe('closeHttp', () => {
  test('a keep-alive request under way when the close starts is answered, and its connection then closed: close does not wait out the keep-alive timeout', async () => {
    const { app, port, entered } = await serve(() => new Promise((r) => setTimeout(() => r('done'), 200)));
    const agent = new http.Agent({ keepAlive: true });
    const answer = get(port, agent);
    await entered;
    const closed = closeHttp(app, 60_000);
    expect(await answer).toEqual({ status: 200, body: 'done' });
    await closed; // with app.close() alone: the idle keep-alive connection holds it for 72 s (the test times out)
    expect(app.server.listening).toBe(false);
    agent.destroy();
  }, 20_000);

  test('a request that never ends is cut after the grace period', async () => {
    const { app, port, entered } = await serve(() => new Promise<string>(() => undefined));
    const agent = new http.Agent({ keepAlive: true });
    const answer = get(port, agent).then(
      () => 'answered',
      (e: NodeJS.ErrnoException) => e.code,
    );
    await entered;
    await closeHttp(app, 200);
    expect(await answer).toBe('ECONNRESET');
    agent.destroy();
  }, 20_000);
});
