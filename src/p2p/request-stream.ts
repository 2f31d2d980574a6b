// The HTTP-shaped request exchange over libp2p streams (design.md, "Wire protocol"): one stream per
// request, HEAD + DATA* from the client, HEAD + DATA* + TRAILER back. Server and client live in their
// own modules; this is the entry point for both.
export { handleRequests } from './request-server.ts';
export type { HandleRequestsOptions, IncomingRequest, RequestHandler, RequestServer } from './request-server.ts';
export type { ResponseWriter } from './response-writer.ts';
export { request, readResponse, isUnsupportedProtocol } from './request-client.ts';
export type { CollectedResponse, RequestBody, RequestOptions, RequestTarget, Response, ResponseFrame } from './request-client.ts';
export { StreamError, type StreamErrorCode } from './frame-io.ts';
export { FrameError, type FrameErrorCode, type FrameLimits, type JsonObject } from './frames.ts';
