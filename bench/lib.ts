// Small helpers shared by the benchmarks: timing, worker-thread baselines, and the report.
import { Worker } from 'node:worker_threads';

export interface Figure {
  name: string;
  value: number;
  unit: string;
  baseline?: number;
  ratio?: number;
  target?: string;
  pass?: boolean;
}

export const figures: Figure[] = [];

export function record(f: Figure): Figure {
  figures.push(f);
  const r = f.ratio !== undefined ? `  ratio ${f.ratio.toFixed(3)}` : '';
  const b = f.baseline !== undefined ? `  baseline ${fmt(f.baseline)} ${f.unit}` : '';
  const t = f.target ? `  target ${f.target} ${f.pass ? 'PASS' : 'FAIL'}` : '';
  process.stdout.write(`${f.name.padEnd(48)} ${fmt(f.value).padStart(12)} ${f.unit}${b}${r}${t}\n`);
  return f;
}

/** Runs `count` calls of `one`, `concurrency` at a time; resolves with the wall time in ms. */
export async function timed(one: () => Promise<void>, count: number, concurrency = 1): Promise<number> {
  let left = count;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: Math.min(concurrency, count) }, async () => {
      while (left-- > 0) await one();
    }),
  );
  return performance.now() - t0;
}

/** The middle value (the upper one of an even count). */
export function median(xs: number[]): number {
  return [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
}

export function fmt(n: number): string {
  return n >= 100 ? Math.round(n).toLocaleString('en-US') : n.toFixed(3);
}

/** Runs `code` (an ES module body, receiving workerData) in `threads` workers at once; returns their results. */
export async function inWorkers<T>(code: string, workerData: unknown[], threads: number): Promise<T[]> {
  const url = new URL(`data:text/javascript,${encodeURIComponent(code)}`);
  return Promise.all(
    Array.from({ length: threads }, (_, i) =>
      new Promise<T>((resolve, reject) => {
        const w = new Worker(url, { workerData: workerData[i] });
        w.once('message', (m: T) => {
          resolve(m);
          void w.terminate();
        });
        w.once('error', reject);
      }),
    ),
  );
}
