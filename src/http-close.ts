// Closing a fastify server within a bound. app.close() alone waits for every connection: Node closes
// the idle ones once, when close starts, so a keep-alive connection whose request finishes after
// that stays open until its keep-alive timeout (fastify's default: 72 s). Here each connection is
// closed as soon as it falls idle, and whatever is still open after `graceMs` is cut.
import type { FastifyInstance } from 'fastify';

/** How often connections that fell idle during a close are closed. */
const IDLE_SWEEP_MS = 50;

export async function closeHttp(app: FastifyInstance, graceMs: number): Promise<void> {
  const sweep = setInterval(() => app.server.closeIdleConnections(), IDLE_SWEEP_MS);
  const force = setTimeout(() => app.server.closeAllConnections(), graceMs);
  try {
    await app.close();
  } finally {
    clearInterval(sweep);
    clearTimeout(force);
  }
}
