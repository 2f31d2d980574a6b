// How a provider's refusal reaches the buyer: its own status and code, except a ticket refusal (the
// gateway checked that ticket already: the provider disagrees with the market, not with the buyer),
// which is 502 with the provider's code, never 401 (a client reads that as its own key refused).
import { describe, expect, test } from 'vitest';
import { providerRefusal } from '../src/gateway/errors.ts';

const refusal = (code: string) => ({ error: { code, message: 'scripted' } });

describe('providerRefusal', () => {
  test('a refusal is relayed with its status and code', () => {
    expect(providerRefusal(503, refusal('no_capacity'))).toMatchObject({ refused: true, error: { status: 503, code: 'no_capacity', message: 'scripted' } });
    expect(providerRefusal(400, refusal('context_length_exceeded'))).toMatchObject({ refused: true, error: { status: 400, code: 'context_length_exceeded' } });
    expect(providerRefusal(409, refusal('idempotency_key_reused'))).toMatchObject({ refused: true, error: { status: 409, code: 'idempotency_key_reused' } });
  });

  test.each([
    [401, 'ticket_expired'],
    [401, 'ticket_invalid'],
    [409, 'ticket_replayed'],
    [409, 'ticket_price_version_mismatch'],
    [400, 'ticket_body_mismatch'],
  ])('a ticket refusal (%i %s) is 502 with the provider\'s code, the buyer told it is the ticket', (status, code) => {
    expect(providerRefusal(status, refusal(code))).toMatchObject({ refused: true, error: { status: 502, code, message: "the provider refused the marketplace's ticket: scripted" } });
  });

  test('an answer without an error envelope, or with a status that is no error, is bad_provider_response', () => {
    expect(providerRefusal(503, { nothing: 1 })).toMatchObject({ refused: false, error: { status: 502, code: 'bad_provider_response' } });
    expect(providerRefusal(302, refusal('moved'))).toMatchObject({ refused: false, error: { status: 502, code: 'bad_provider_response' } });
  });
});
