import { describe, expect, test } from 'vitest';
import { register as globalRegistry } from 'prom-client';
import { createMetrics, MAX_EXACT_MICRO_USD, REQUEST_DURATION_BUCKETS, TTFT_BUCKETS } from '../src/ops/metrics.ts';

/** The exposition line for `series` (name plus label set, exactly as prom-client prints it). */
function line(text: string, series: string): string | undefined {
  return text.split('\n').find((l) => l.startsWith(`${series} `));
}

describe('createMetrics', () => {
  test('uses a registry of its own, so two instances do not clash and the global one stays empty', async () => {
    const a = createMetrics({ defaultMetrics: false });
    const b = createMetrics({ defaultMetrics: false });
    expect(a.registry).not.toBe(globalRegistry);
    a.requests.inc({ endpoint: 'chat/completions', status: '200' });
    expect(line(await a.registry.metrics(), 'seller_requests_total{endpoint="chat/completions",status="200"}')).toBe(
      'seller_requests_total{endpoint="chat/completions",status="200"} 1',
    );
    expect(line(await b.registry.metrics(), 'seller_requests_total{endpoint="chat/completions",status="200"}')).toBeUndefined();
    expect(await globalRegistry.metrics()).not.toContain('seller_');
  });

  test('exposes every seller metric with its labels', async () => {
    const m = createMetrics({ defaultMetrics: false });
    m.requests.inc({ endpoint: 'chat/completions', status: '200' });
    m.requests.inc({ endpoint: 'chat/completions', status: '200' });
    m.requests.inc({ endpoint: 'completions', status: 429 });
    m.tokens.inc({ direction: 'in', model: 'llama' }, 120);
    m.tokens.inc({ direction: 'out', model: 'llama' }, 30);
    m.receiptsSigned.inc({ status: 'completed' });
    m.receiptsSigned.inc({ status: 'completed' }, 2);
    m.receiptsSigned.inc({ status: 'cancelled' });
    m.earnings.add('llama', 293n);
    m.queueDepth.set({ model: 'llama' }, 4);
    m.slotsInUse.set({ model: 'llama' }, 2);
    m.slotsInUse.dec({ model: 'llama' });
    m.requestDuration.observe({ endpoint: 'chat/completions', model: 'llama' }, 0.7);
    m.timeToFirstToken.observe({ model: 'llama' }, 0.12);
    m.ticketRefusals.inc({ reason: 'expired' });

    const text = await m.registry.metrics();
    const expected = [
      'seller_requests_total{endpoint="chat/completions",status="200"} 2',
      'seller_requests_total{endpoint="completions",status="429"} 1',
      'seller_tokens_total{direction="in",model="llama"} 120',
      'seller_tokens_total{direction="out",model="llama"} 30',
      'seller_receipts_signed_total{status="completed"} 3',
      'seller_receipts_signed_total{status="cancelled"} 1',
      'seller_earnings_micro_usd_total{model="llama"} 293',
      'seller_queue_depth{model="llama"} 4',
      'seller_slots_in_use{model="llama"} 1',
      'seller_request_duration_seconds_bucket{le="0.5",endpoint="chat/completions",model="llama"} 0',
      'seller_request_duration_seconds_bucket{le="1",endpoint="chat/completions",model="llama"} 1',
      'seller_request_duration_seconds_count{endpoint="chat/completions",model="llama"} 1',
      'seller_request_duration_seconds_sum{endpoint="chat/completions",model="llama"} 0.7',
      'seller_time_to_first_token_seconds_bucket{le="0.1",model="llama"} 0',
      'seller_time_to_first_token_seconds_bucket{le="0.25",model="llama"} 1',
      'seller_time_to_first_token_seconds_count{model="llama"} 1',
      'seller_ticket_refusals_total{reason="expired"} 1',
    ];
    for (const l of expected) expect(text.split('\n')).toContain(l);
    for (const name of ['seller_requests_total', 'seller_tokens_total', 'seller_receipts_signed_total', 'seller_earnings_micro_usd_total', 'seller_ticket_refusals_total']) {
      expect(text).toContain(`# TYPE ${name} counter`);
    }
    for (const name of ['seller_queue_depth', 'seller_slots_in_use']) expect(text).toContain(`# TYPE ${name} gauge`);
    for (const name of ['seller_request_duration_seconds', 'seller_time_to_first_token_seconds']) expect(text).toContain(`# TYPE ${name} histogram`);
  });

  test('histogram buckets suit LLM serving: increasing, sub-second to minutes', () => {
    for (const buckets of [REQUEST_DURATION_BUCKETS, TTFT_BUCKETS]) {
      for (let i = 1; i < buckets.length; i++) expect(buckets[i]!).toBeGreaterThan(buckets[i - 1]!);
      expect(buckets[0]!).toBeLessThanOrEqual(0.05);
      expect(buckets[buckets.length - 1]!).toBeGreaterThanOrEqual(60);
    }
  });

  test('collects the default process metrics on its registry unless told not to', async () => {
    const text = await createMetrics().registry.metrics();
    expect(text).toContain('# TYPE process_cpu_user_seconds_total counter');
    expect(text).toContain('nodejs_eventloop_lag_seconds');
    expect(text).toContain('process_resident_memory_bytes');
    expect(await createMetrics({ defaultMetrics: false }).registry.metrics()).not.toContain('process_cpu_user_seconds_total');
  });
});

describe('earnings counter is exact', () => {
  test('totals up to 2^53 - 1 are shown exactly', async () => {
    const m = createMetrics({ defaultMetrics: false });
    expect(MAX_EXACT_MICRO_USD).toBe(2n ** 53n - 1n);
    m.earnings.add('big', 4_503_599_627_370_496n); // 2^52
    m.earnings.add('big', 4_503_599_627_370_494n);
    m.earnings.add('big', 1n);
    expect(m.earnings.total('big')).toBe(9_007_199_254_740_991n);
    m.earnings.add('odd', 9_007_199_254_740_989n); // odd, just below the limit
    m.earnings.add('odd', 0n);
    m.earnings.add('zero', 0n);
    const text = await m.registry.metrics();
    expect(line(text, 'seller_earnings_micro_usd_total{model="big"}')).toBe('seller_earnings_micro_usd_total{model="big"} 9007199254740991');
    expect(line(text, 'seller_earnings_micro_usd_total{model="odd"}')).toBe('seller_earnings_micro_usd_total{model="odd"} 9007199254740989');
    expect(line(text, 'seller_earnings_micro_usd_total{model="zero"}')).toBe('seller_earnings_micro_usd_total{model="zero"} 0');
    expect(m.earnings.total('none')).toBe(0n);
  });

  test('many small additions stay exact', async () => {
    const m = createMetrics({ defaultMetrics: false });
    m.earnings.add('m', 9_007_199_254_000_000n);
    for (let i = 0; i < 1000; i++) m.earnings.add('m', 293n);
    const expected = 9_007_199_254_000_000n + 293_000n;
    expect(m.earnings.total('m')).toBe(expected);
    expect(line(await m.registry.metrics(), 'seller_earnings_micro_usd_total{model="m"}')).toBe(`seller_earnings_micro_usd_total{model="m"} ${expected}`);
  });

  test('refuses amounts or totals above 2^53 - 1, negatives and non-bigints, changing nothing', async () => {
    const m = createMetrics({ defaultMetrics: false });
    expect(() => m.earnings.add('m', 2n ** 53n)).toThrow(RangeError);
    expect(() => m.earnings.add('m', 2n ** 64n)).toThrow(/above 2\^53 - 1/);
    expect(() => m.earnings.add('m', -1n)).toThrow(RangeError);
    expect(() => m.earnings.add('m', -1n)).toThrow(/negative/);
    expect(() => m.earnings.add('m', 5 as unknown as bigint)).toThrow(TypeError);
    expect(() => m.earnings.add('m', '5' as unknown as bigint)).toThrow(TypeError);
    expect(m.earnings.total('m')).toBe(0n);

    m.earnings.add('m', MAX_EXACT_MICRO_USD - 10n);
    expect(() => m.earnings.add('m', 11n)).toThrow(RangeError);
    expect(m.earnings.total('m')).toBe(MAX_EXACT_MICRO_USD - 10n);
    m.earnings.add('m', 10n);
    expect(() => m.earnings.add('m', 1n)).toThrow(RangeError);
    m.earnings.add('other', 1n); // per model
    const text = await m.registry.metrics();
    expect(line(text, 'seller_earnings_micro_usd_total{model="m"}')).toBe('seller_earnings_micro_usd_total{model="m"} 9007199254740991');
    expect(line(text, 'seller_earnings_micro_usd_total{model="other"}')).toBe('seller_earnings_micro_usd_total{model="other"} 1');
  });

  test('a registry reset does not lose or corrupt the exact totals', async () => {
    const m = createMetrics({ defaultMetrics: false });
    m.earnings.add('m', 12_345n);
    m.registry.resetMetrics();
    m.earnings.add('m', 5n);
    expect(line(await m.registry.metrics(), 'seller_earnings_micro_usd_total{model="m"}')).toBe('seller_earnings_micro_usd_total{model="m"} 12350');
  });

  test('slots in use and queue depth are read live from admission at every scrape', async () => {
    const live = { inUse: 1, queued: 0 };
    const m = createMetrics({ defaultMetrics: false, admission: () => [{ model: 'tiny/llama', ...live }] });
    expect(await m.registry.metrics()).toContain('seller_slots_in_use{model="tiny/llama"} 1');
    expect(await m.registry.metrics()).toContain('seller_queue_depth{model="tiny/llama"} 0');
    live.inUse = 2;
    live.queued = 3; // mid-request: nothing has finished, the scrape still sees it
    const text = await m.registry.metrics();
    expect(text).toContain('seller_slots_in_use{model="tiny/llama"} 2');
    expect(text).toContain('seller_queue_depth{model="tiny/llama"} 3');
  });

  test('seller_receipt_log_stopped is read at every scrape: 0 while the log takes receipts, 1 once it has stopped', async () => {
    let stopped = false;
    const m = createMetrics({ defaultMetrics: false, receiptLogStopped: () => stopped });
    const text = await m.registry.metrics();
    expect(text).toContain('# TYPE seller_receipt_log_stopped gauge');
    expect(line(text, 'seller_receipt_log_stopped')).toBe('seller_receipt_log_stopped 0');
    stopped = true;
    expect(line(await m.registry.metrics(), 'seller_receipt_log_stopped')).toBe('seller_receipt_log_stopped 1');
  });
});
