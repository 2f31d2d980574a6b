// Errors the gateway answers with: the marketplace API's envelope {error: {code, message}} and an
// HTTP status. A GatewayError's message is safe to show the buyer.

import { errorBody, ServiceError, type ErrorBody } from '../service-error.ts';

export { errorBody, type ErrorBody };

export class GatewayError extends ServiceError {
  override name = 'GatewayError';
}

/** 400 invalid_request naming the header or field at fault. */
export function invalid(field: string, message: string): GatewayError {
  return new GatewayError(400, 'invalid_request', `${field}: ${message}`);
}

/** An error envelope as some other party sent it, or undefined when it is not one. */
export function readErrorBody(value: unknown): ErrorBody['error'] | undefined {
  if (value === null || typeof value !== 'object') return undefined;
  const e = (value as { error?: unknown }).error;
  if (e === null || typeof e !== 'object') return undefined;
  const { code, message } = e as { code?: unknown; message?: unknown };
  if (typeof code !== 'string' || code.length === 0 || code.length > 128) return undefined;
  return { code, message: typeof message === 'string' ? message.slice(0, 2000) : code };
}

/** The HTTP status of a provider's HEAD frame (0 when it names none). */
export function headStatus(head: { status?: unknown }): number {
  return typeof head.status === 'number' ? head.status : 0;
}

/**
 * A provider's answer other than 200, as the buyer's error: its own error envelope (a refusal,
 * `refused`), or 502 bad_provider_response when it sent none or a status that is no error.
 */
export function providerRefusal(status: number, trailer: unknown): { error: GatewayError; refused: boolean } {
  const err = readErrorBody(trailer);
  if (!err || status < 400 || status > 599) return { error: new GatewayError(502, 'bad_provider_response', `the provider answered HTTP ${status} without an error`), refused: false };
  // The gateway checked the ticket before it sent it: a provider that refuses it disagrees with the
  // marketplace (its key, a clock, a used id), which is no fault of the buyer's: never their 401 (an
  // OpenAI client reads that as its own key refused), but 502 with the provider's code.
  if (err.code.startsWith('ticket_')) return { error: new GatewayError(502, err.code, `the provider refused the marketplace's ticket: ${err.message}`), refused: true };
  return { error: new GatewayError(status, err.code, err.message), refused: true };
}
