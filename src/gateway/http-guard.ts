// What the gateway checks of a request before any route sees it. The gateway has no authentication
// of its own (it spends its buyer's money for whoever reaches it), so:
//
//   - A request from a web page is refused. Browsers send `Origin` with every POST (and with any
//     cross-origin request), so a page the buyer visits could otherwise POST a "simple" text/plain
//     body that needs no CORS preflight: the page cannot read the answer, but the request is run
//     and billed. Programs (the openai client, curl) send no `Origin`.
//   - On a loopback address, the `Host` must name the loopback too: a page whose own name resolves to
//     127.0.0.1 (DNS rebinding) is same-origin with the gateway and sends its own name as `Host`.
//   - Request bodies being received share a byte budget: each holds up to 8 MiB until it is whole,
//     and clients that send a body and stall must not take the process's memory with them.
//   - A body whose Transfer-Encoding is anything but chunked is refused: it would be read as plain JSON.
import type { FastifyReply, FastifyRequest } from 'fastify';
import { isLoopbackHost, isLoopbackHostHeader } from '../host-port.ts';

export { isLoopbackHostHeader };
import { GatewayError } from './errors.ts';

/** How many bytes of request bodies the gateway holds at once while they arrive (default 256 MiB). */
export const BODY_BUDGET_DEFAULT_BYTES = 256 << 20;

export interface HttpGuardOptions {
  /** The address the gateway listens on: on a loopback one, `Host` must be a loopback name. */
  listenHost: string;
  /** The largest body a route takes: what a body without Content-Length is counted as. */
  maxBodyBytes: number;
  budgetBytes?: number;
}

/** The onRequest hook that applies the rules above. */
export function httpGuard(opts: HttpGuardOptions): { onRequest: (req: FastifyRequest, reply: FastifyReply) => Promise<void> } {
  const budget = opts.budgetBytes ?? BODY_BUDGET_DEFAULT_BYTES;
  const loopbackOnly = isLoopbackHost(opts.listenHost);
  let reserved = 0;
  const onRequest = async (req: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const origin = req.headers.origin;
    if (origin !== undefined) {
      throw new GatewayError(403, 'origin_not_allowed', `a request from a web page (Origin ${JSON.stringify(origin.slice(0, 100))}) is refused: the gateway spends its buyer's money, and a page the buyer visits could send one; call it from a program`);
    }
    const host = req.headers.host ?? '';
    if (loopbackOnly && !isLoopbackHostHeader(host)) {
      throw new GatewayError(403, 'host_not_allowed', `Host ${JSON.stringify(host.slice(0, 100))} is not this machine's loopback, which is all the gateway listens on (a name that resolves here is not enough: DNS rebinding)`);
    }
    const te = req.headers['transfer-encoding'];
    if (te !== undefined && te.trim().toLowerCase() !== 'chunked') {
      throw new GatewayError(400, 'invalid_request', `Transfer-Encoding: ${JSON.stringify(te.slice(0, 40))} is not accepted: send the JSON body as it is (chunked or with a Content-Length)`);
    }
    const declared = req.headers['content-length'];
    const bodyExpected = declared !== undefined ? Number(declared) > 0 : te !== undefined;
    if (!bodyExpected) return;
    const need = declared !== undefined ? Math.min(Number(declared) || 0, opts.maxBodyBytes + 1) : opts.maxBodyBytes + 1;
    if (reserved + need > budget) {
      void reply.header('retry-after', '1');
      throw new GatewayError(503, 'gateway_busy', 'the gateway is receiving as many request bodies as it holds at once; try again shortly');
    }
    reserved += need;
    let released = false;
    const release = (): void => {
      if (released) return;
      released = true;
      reserved -= need;
    };
    // Held until the body is whole (the route has it) or the exchange ends, whichever is first.
    req.raw.once('end', release);
    reply.raw.once('close', release);
  };
  return { onRequest };
}
