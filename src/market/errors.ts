// The development marketplace's errors: every refusal is an HTTP status, a stable code and a
// message that is safe to send (it names the field or the check that failed, never a stack).
import { errorBody, ServiceError, type ErrorBody } from '../service-error.ts';

export { errorBody, type ErrorBody };

export class MarketError extends ServiceError {
  override name = 'MarketError';
}
