// Whether the node's key file still holds the key the node runs with. The node keeps its key in
// memory and serves on whatever happens to the file; but a node whose key file was deleted, or
// overwritten with another key, will not start again (its receipt log is bound to its provider id),
// and an operator who finds out only then may have no backup left. So it is said at once, once,
// with what to do, and once more when the file is right again.
import { IdentityError, loadKeyFile } from './identity.ts';

export type KeyFileEvent = { kind: 'wrong'; message: string } | { kind: 'right'; message: string };

export class KeyFileWatch {
  private readonly file: string;
  private readonly providerId: string;
  private wrong = false;

  constructor(file: string, providerId: string) {
    this.file = file;
    this.providerId = providerId;
  }

  /** Reads the file (a few hundred bytes) and says what changed since the last check, if anything. */
  check(): KeyFileEvent | undefined {
    const problem = this.problem();
    if (problem && !this.wrong) {
      this.wrong = true;
      return {
        kind: 'wrong',
        message: `${problem}. The node runs on with the key it loaded (provider ${this.providerId}), but will not start with the file as it is: its receipt log is signed by that key. Put the key file back (from a backup if it is gone, mode 0600) now; do not run seller-node init over it, which makes a new provider`,
      };
    }
    if (!problem && this.wrong) {
      this.wrong = false;
      return { kind: 'right', message: `key file ${this.file} holds this node's key again` };
    }
    return undefined;
  }

  private problem(): string | undefined {
    try {
      const id = loadKeyFile(this.file);
      if (id.providerId !== this.providerId) return `key file ${this.file} now holds another key (provider ${id.providerId})`;
      return undefined;
    } catch (e) {
      if (e instanceof IdentityError) return e.message.replace(/ \(create one with: [^)]*\)$/, ' any more');
      return `key file ${this.file}: ${(e as Error).message}`;
    }
  }
}
