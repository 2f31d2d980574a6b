// The API keys file, watched: the spec has revocation take effect immediately, so a changed file
// (a key removed, a limit changed) is read again within `intervalMs` and its keys replace the
// gateway's. A file that cannot be read or used changes nothing: the keys before it stay, and the
// operator is told (once a change).
import { fileIdentity } from '../../adapters/model-file.ts';
import { readApiKeysFile, type ApiKeySpec } from './api-keys.ts';

export interface KeysFileLog {
  info(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

/** What identifies a version of the file: a rewrite, a rename over it, or an edit in place changes it. */
const identity = (file: string): string => JSON.stringify(fileIdentity(file) ?? null);

/** Watches `file` (stat every `intervalMs`); `apply` is given its keys each time it changes. */
export function watchApiKeysFile(file: string, apply: (keys: ApiKeySpec[]) => void, log: KeysFileLog, intervalMs = 2000): { check(): void; stop(): void } {
  let seen = identity(file);
  const check = (): void => {
    const now = identity(file);
    if (now === seen) return;
    seen = now;
    try {
      const keys = readApiKeysFile(file);
      apply(keys);
      log.info({ file, keys: keys.length }, `API keys file changed: ${keys.length} key${keys.length === 1 ? '' : 's'} accepted from now on`);
    } catch (e) {
      log.error({ file, err: (e as Error).message }, 'API keys file changed but cannot be used: the keys accepted before stay in force until it is fixed');
    }
  };
  const timer = setInterval(check, intervalMs);
  timer.unref();
  return { check, stop: () => clearInterval(timer) };
}
