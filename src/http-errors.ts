// Errors before routing, answered with the project's error body ({error: {code, message}}).
// Shared by the three HTTP servers (the ops server, the development market and the buyer
// gateway), each passing its own 400 code.
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyBaseLogger, FastifyError, FastifyInstance, FastifyReply, FastifyServerOptions } from 'fastify';
import { errorBody, JSON_TYPE } from './service-error.ts';

/**
 * Requests no route ever sees get the server's own error body too. Fastify answers a URL it cannot
 * decode (`/x/%ZZ`: FST_ERR_BAD_URL; a path parameter over its length limit: 414) through
 * `frameworkErrors`, bypassing setErrorHandler; without it the body is fastify's own
 * `{"error":"Bad Request","code":"FST_ERR_BAD_URL",...}`.
 */
export function frameworkErrorReply(err: FastifyError, reply: FastifyReply, badRequestCode: string): FastifyReply {
  const status = typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500 ? err.statusCode : 500;
  if (status === 500) return reply.code(500).type(JSON_TYPE).send(errorBody('internal_error', 'internal error'));
  // Fastify's messages quote the whole path (the client's, of any length): ours name the fault.
  const what =
    err.code === 'FST_ERR_BAD_URL' ? 'url: not a valid URL (a "%" must start a percent-encoded UTF-8 byte, e.g. %2F)'
    : err.code === 'FST_ERR_MAX_PARAM_LENGTH' ? 'url: a path parameter is longer than this server accepts'
    : err.message.slice(0, 200);
  return reply.code(status).type(JSON_TYPE).send(errorBody(status === 414 ? 'url_too_long' : badRequestCode, what));
}

/** A client error's status, code and message (the request did not parse, so no route answers it). */
function clientErrorAnswer(err: NodeJS.ErrnoException & { reason?: unknown }, badRequestCode: string): { status: number; code: string; message: string } {
  switch (err.code) {
    case 'HPE_HEADER_OVERFLOW':
      return { status: 431, code: 'headers_too_large', message: 'the request headers are larger than this server accepts' };
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return { status: 413, code: 'request_too_large', message: 'the chunk extensions are larger than this server accepts' };
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return { status: 408, code: 'request_timeout', message: 'the request did not arrive in time' };
    default: {
      // llhttp's reason names the fault ("Content-Length can't be present with Transfer-Encoding"),
      // never the request's bytes.
      const reason = typeof err.reason === 'string' ? err.reason : err.message.replace(/^Parse Error: /, '');
      return { status: 400, code: badRequestCode, message: `the request is not valid HTTP/1.1 (${err.code ?? 'parse error'}: ${reason.slice(0, 200)})` };
    }
  }
}

/**
 * The X-RateLimit-* headers a route's hooks already set on the response this answer replaces (a
 * request whose body did not arrive in time was authenticated first: spec, "every authenticated
 * response carries" them), as header lines.
 */
function rateLimitLines(res: ServerResponse | null | undefined): string {
  if (!res) return '';
  let out = '';
  for (const [name, value] of Object.entries(res.getHeaders())) {
    const v = String(value);
    if (name.startsWith('x-ratelimit-') && !/[\r\n]/.test(v)) out += `${name}: ${v}\r\n`;
  }
  return out;
}

/** How long an answered bad connection may take to read its answer before it is cut. */
const CLIENT_ERROR_LINGER_MS = 5_000;

/**
 * Node's HTTP server answers bytes its parser refuses (transfer-encoding with content-length, a bad
 * content-length, headers over the limit) itself, through the server's `clientError`; fastify's
 * default handler writes `{"error":"Bad Request","message":"Client Error"}`. This handler (fastify's
 * `clientErrorHandler`) writes the server's own error body with 400 (431 headers too large, 413
 * chunk extensions too large, 408 request timeout) and `Connection: close`, then closes the
 * connection once the answer is flushed (nothing after a request that did not parse can be framed).
 * As Node does, it writes nothing when the connection was reset, or when a response on it has
 * already started (a pipelined request's): a second status line would corrupt it.
 */
export function clientErrorHandler(badRequestCode: string, log?: () => FastifyBaseLogger): NonNullable<FastifyServerOptions['clientErrorHandler']> {
  return (err, socket: Socket) => {
    if (err.code === 'ECONNRESET' || socket.destroyed) return;
    // A later chunk of the same refused request: the answer is already on its way, then the close.
    if (socket.writableEnded) return;
    const inFlight = (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage;
    if (!socket.writable || inFlight?.headersSent) {
      socket.destroy();
      return;
    }
    const a = clientErrorAnswer(err, badRequestCode);
    // The code only: the error object carries the raw request bytes (rawPacket).
    log?.().debug({ code: err.code, status: a.status }, 'http: request refused before routing');
    const text = JSON.stringify(errorBody(a.code, a.message));
    const head = `HTTP/1.1 ${a.status} ${STATUS_CODES[a.status] ?? 'Error'}\r\nContent-Type: ${JSON_TYPE}\r\nContent-Length: ${Buffer.byteLength(text)}\r\n${rateLimitLines(inFlight)}Connection: close\r\n\r\n`;
    socket.setTimeout(CLIENT_ERROR_LINGER_MS, () => socket.destroy());
    socket.end(head + text, () => socket.destroy());
  };
}

/**
 * What every HTTP server of the project adds before it listens (its deadline is in its options:
 * requestDeadlineOptions): its error body for the two requests Node would answer bare, with no body: an `Expect` other than 100-continue (417) and an HTTP/1.1 request without `Host` (400;
 * requestDeadlineOptions turns Node's own check off so that this one answers).
 */
export function answerBareRefusals(app: FastifyInstance, badRequestCode: string): void {
  app.server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => {
    const text = JSON.stringify(errorBody('expectation_failed', `Expect: ${JSON.stringify(String(req.headers.expect).slice(0, 40))} is not supported (only 100-continue)`));
    res.writeHead(417, { 'content-type': JSON_TYPE, 'content-length': Buffer.byteLength(text), connection: 'close' }).end(text);
  });
  app.addHook('onRequest', async (req, reply) => {
    if (req.raw.httpVersion === '1.1' && req.headers.host === undefined) return reply.code(400).type(JSON_TYPE).send(errorBody(badRequestCode, 'an HTTP/1.1 request needs a Host header'));
  });
}
