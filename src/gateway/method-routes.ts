// 405 for a path the gateway serves under other methods (RFC 9110: with an Allow header), instead
// of a 404 that says the route does not exist. The routes are recorded as fastify registers them.
import type { FastifyInstance } from 'fastify';

interface RouteShape {
  method: string;
  pattern: RegExp;
}

/** Records every route `app` registers from now on; `allowed(path)` lists the methods one serves. */
export function recordRoutes(app: FastifyInstance): { allowed(path: string): string[] } {
  const routes: RouteShape[] = [];
  app.addHook('onRoute', (opts) => {
    const methods = Array.isArray(opts.method) ? opts.method : [opts.method];
    // "/v1/requests/:id" → one segment; "/v1/models/*" → the rest of the path.
    const source = opts.url
      .split('/')
      .map((seg) => (seg === '*' ? '.*' : seg.startsWith(':') ? '[^/]+' : seg.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')))
      .join('/');
    for (const method of methods) routes.push({ method, pattern: new RegExp(`^${source}$`) });
  });
  return {
    allowed: (path) => [...new Set(routes.filter((r) => r.pattern.test(path)).map((r) => r.method))].sort(),
  };
}
