// This process's open descriptors, by what they name: to show a store released what it held.
import fs from 'node:fs';

/** The paths this process has open (its descriptors' targets) that begin with `prefix`. */
export function openFilesUnder(prefix: string): string[] {
  return fs.readdirSync('/proc/self/fd').flatMap((fd) => {
    try {
      const target = fs.readlinkSync(`/proc/self/fd/${fd}`);
      return target.startsWith(prefix) ? [target] : [];
    } catch {
      return [];
    }
  });
}
