// The model probe's child process, found and stopped (SIGSTOP) as soon as it appears: a probe that
// never finishes, so a test sees what a load slower than its timeout does. The probe's timeout
// kills it (SIGKILL ends a stopped process).
import fs from 'node:fs';
import { waitFor } from './wait.ts';

/** Stops the probe child run on `modelPath` (whichever process started it); resolves with its pid. */
export function stopProbeChild(modelPath: string, ms = 20_000): Promise<number> {
  return waitFor(
    `the probe child of ${modelPath}`,
    () => {
      for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
        let args: string[];
        try {
          args = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
        } catch {
          continue; // (gone meanwhile)
        }
        if (args.some((a) => /model-probe-child\.[jt]s$/.test(a)) && args.includes(modelPath)) {
          process.kill(Number(pid), 'SIGSTOP');
          return Number(pid);
        }
      }
      return undefined;
    },
    ms,
    2,
  );
}
