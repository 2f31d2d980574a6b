// The one error shape every HTTP-ish surface of seller-node answers with (the marketplace API's
// envelope): an HTTP status, a stable code, and a message that is safe to show (it names the field
// or the check that failed, never a stack).

/** The content type of every JSON answer. */
export const JSON_TYPE = 'application/json; charset=utf-8';

export interface ErrorBody {
  error: { code: string; message: string };
}

export function errorBody(code: string, message: string): ErrorBody {
  return { error: { code, message } };
}

export class ServiceError extends Error {
  override name = 'ServiceError';
  readonly status: number;
  readonly code: string;
  constructor(status: number, code: string, message: string) {
    super(message);
    this.status = status;
    this.code = code;
  }

  body(): ErrorBody {
    return errorBody(this.code, this.message);
  }
}
