// One step of a shutdown: run to the end, reported by name if it is slow, logged (not thrown) if it
// fails so that the steps after it still run.

export interface StopStepLogger {
  error(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
}

/** A shutdown step that takes longer than this is reported (error log) by name while it runs on. */
const SLOW_STOP_STEP_MS = 10_000;

export async function stopStep(logger: StopStepLogger, step: string, work: () => Promise<void> | void, slowMs = SLOW_STOP_STEP_MS): Promise<void> {
  const slow = setTimeout(() => logger.error({ step, after_ms: slowMs }, 'shutdown step still running'), slowMs);
  slow.unref();
  try {
    await work();
  } catch (e) {
    logger.warn({ step, err: e instanceof Error ? e.message : String(e) }, 'shutdown step failed');
  } finally {
    clearTimeout(slow);
  }
}
