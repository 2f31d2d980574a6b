import { describe, expect, test } from 'vitest';
import { computeCost, formatUsd, maxOutputTokensWithin, parseMicro, parseUsd } from '../attestation/money.ts';

describe('USD decimals convert exactly', () => {
  test('parse', () => {
    expect(parseUsd('0')).toBe(0n);
    expect(parseUsd('1.25')).toBe(1_250_000n);
    expect(parseUsd('0.000001')).toBe(1n);
    expect(parseUsd('123456789012.123456')).toBe(123456789012123456n);
    // 0.1 + 0.2 is not 0.3 in floating point; here it is.
    expect(parseUsd('0.1')! + parseUsd('0.2')!).toBe(parseUsd('0.3'));
  });
  test('refuse anything but a plain decimal with at most six places', () => {
    for (const bad of ['', '-1', '+1', '1.', '.5', '1.0000001', '1e3', ' 1', '1 ', '01', '0x10', 'NaN', '1,5']) expect(parseUsd(bad)).toBeUndefined();
    expect(parseUsd(1 as unknown as string)).toBeUndefined();
  });
  test('format always shows six places', () => {
    expect(formatUsd(0n)).toBe('0.000000');
    expect(formatUsd(1n)).toBe('0.000001');
    expect(formatUsd(1_250_000n)).toBe('1.250000');
    expect(formatUsd(-5n)).toBe('-0.000005');
    for (const s of ['0.000001', '42.424242', '99999999.999999']) expect(formatUsd(parseUsd(s)!)).toBe(s);
  });
  test('micro strings are canonical integers', () => {
    expect(parseMicro('0')).toBe(0n);
    expect(parseMicro('90071992547409930000')).toBe(90071992547409930000n);
    for (const bad of ['01', '-1', '1.0', '', ' 1', 1]) expect(parseMicro(bad)).toBeUndefined();
  });
});

describe('cost = ceil((in × in_rate + out × out_rate) / 10^6) + units × unit_rate', () => {
  const rates = { input_per_mtok: 150_000n, output_per_mtok: 600_000n };
  test('rounds up to the next micro-USD, never down', () => {
    expect(computeCost({ input_tokens: 0, output_tokens: 0 }, rates)).toBe(0n);
    expect(computeCost({ input_tokens: 1, output_tokens: 0 }, rates)).toBe(1n); // 0.15 → 1
    expect(computeCost({ input_tokens: 20, output_tokens: 0 }, rates)).toBe(3n); // 3.0 exactly
    expect(computeCost({ input_tokens: 21, output_tokens: 0 }, rates)).toBe(4n); // 3.15 → 4
    expect(computeCost({ input_tokens: 1000, output_tokens: 500 }, rates)).toBe(450n);
  });
  test('is exact far beyond 2^53', () => {
    const big = { input_per_mtok: 10n ** 15n, output_per_mtok: 1n };
    expect(computeCost({ input_tokens: Number.MAX_SAFE_INTEGER, output_tokens: 1 }, big)).toBe((BigInt(Number.MAX_SAFE_INTEGER) * 10n ** 15n + 1n + 999_999n) / 10n ** 6n);
  });
  test('media units add per unit; a unit without a rate is refused', () => {
    const r = { ...rates, per_unit: { images: 40_000n } };
    expect(computeCost({ input_tokens: 10, output_tokens: 0, units: { images: 3 } }, r)).toBe(2n + 120_000n);
    expect(() => computeCost({ input_tokens: 0, output_tokens: 0, units: { seconds: 1 } }, r)).toThrow(/no rate/);
    for (const inherited of ['constructor', 'toString', '__proto__']) {
      expect(() => computeCost({ input_tokens: 0, output_tokens: 0, units: JSON.parse(`{"${inherited}": 1}`) }, r), inherited).toThrow(/no rate/);
    }
  });
  test('maxOutputTokensWithin keeps the worst case within the hold, and one more token would not', () => {
    for (const [hold, input] of [[1000n, 100], [451n, 1000], [1n, 0], [999_999n, 12345]] as const) {
      const n = maxOutputTokensWithin(hold, input, rates);
      expect(computeCost({ input_tokens: input, output_tokens: n }, rates) <= hold).toBe(true);
      expect(computeCost({ input_tokens: input, output_tokens: n + 1 }, rates) > hold).toBe(true);
    }
    expect(maxOutputTokensWithin(0n, 10, rates)).toBe(-1);
    expect(maxOutputTokensWithin(5n, 10, { input_per_mtok: 0n, output_per_mtok: 0n })).toBe(Number.MAX_SAFE_INTEGER);
  });
});
