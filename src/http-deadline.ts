// A deadline for a whole HTTP request (headers and body) that Node really enforces. Two things
// stand in the way of fastify's `requestTimeout` alone: Node looks at request deadlines only every
// `connectionsCheckingInterval` (30 s by default, so a 10 s deadline could run 40 s), and it lets a
// request whose headers are in run past its deadline unless the headers' own deadline
// (`headersTimeout`, 60 s by default) is no later.
/** How long a whole request (headers and body) may take to arrive, for the gateway and the dev market alike. */
export const REQUEST_TIMEOUT_DEFAULT_MS = 60_000;
/** Connections an HTTP server of this project keeps at once: more are closed as they arrive, before the process runs out of descriptors. */
export const MAX_CONNECTIONS_DEFAULT = 1024;

/**
 * Fastify options that set the deadline, bring the headers' deadline (Node's default 60 s) within
 * it, and have Node check it every quarter of it (at most 30 s).
 */
export function requestDeadlineOptions(ms: number): { requestTimeout: number; http: { headersTimeout: number; connectionsCheckingInterval: number; requireHostHeader: false } } {
  // (requireHostHeader off: Node's own answer to a request without Host has no body; the servers refuse it themselves, with their error body: see answerBareRefusals in http-errors.ts.)
  return { requestTimeout: ms, http: { headersTimeout: Math.min(60_000, ms), connectionsCheckingInterval: Math.min(30_000, Math.max(100, Math.floor(ms / 4))), requireHostHeader: false } };
}
