// /service/infer/1.0.0: the serving core on a libp2p stream. One request per stream: the buyer's
// side sends a HEAD (endpoint, ticket, optional idempotency key) and the exact body; the node
// answers HEAD, DATA (the body or the SSE events exactly as a buyer sees them) and a TRAILER with
// the receipt or an error. Closing the stream early cancels the request.
import type { InferService } from '../serve/infer-service.ts';
import type { Host } from './host.ts';
import { handleRequests, type RequestServer, type HandleRequestsOptions } from './request-stream.ts';

export const INFER_PROTOCOL = '/service/infer/1.0.0';

export function serveInfer(host: Host, service: InferService, opts: HandleRequestsOptions = {}): Promise<RequestServer> {
  return handleRequests(
    host,
    INFER_PROTOCOL,
    (req, res) => service.handle(req, res),
    { screen: (head) => service.screen(head), ...opts },
  );
}
