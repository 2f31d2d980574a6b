// The development marketplace's errors: every refusal is an HTTP status, a stable code and a
// message that is safe to send (it names the field or the check that failed, never a stack).

export class MarketError extends Error {
  override name = 'MarketError';
  readonly status: number;
  readonly code: string;
  constructor(status: number, code: string, message: string) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export interface ErrorBody {
  error: { code: string; message: string };
}

export function errorBody(code: string, message: string): ErrorBody {
  return { error: { code, message } };
}
