// File descriptors running out. Past the process's limit the kernel refuses new sockets and files:
// libp2p's listener drops buyers' connections (its 'error' event reaches no log), the market and
// the receipt log cannot open what they need. Metrics have the figures (process_open_fds,
// process_max_fds); this says it in the log, once when the node nears the limit and once when it
// is clear again. Linux only (/proc); elsewhere it says nothing.
import fs from 'node:fs';

export interface DescriptorUse {
  open: number;
  limit: number;
}

/** The limit as last read: at the limit itself /proc cannot be opened (that needs a descriptor too). */
let knownLimit: number | undefined;

/**
 * Open descriptors and the soft limit, from /proc; undefined where /proc does not have them. At
 * the limit (reading /proc fails EMFILE or ENFILE), the limit as last read, all of it in use.
 */
export function descriptorUse(): DescriptorUse | undefined {
  try {
    const m = /^Max open files\s+(\d+|unlimited)/m.exec(fs.readFileSync('/proc/self/limits', 'utf8'));
    if (!m || m[1] === 'unlimited') return undefined;
    knownLimit = Number(m[1]);
    // (less the descriptor this read itself holds while it lists them)
    const open = fs.readdirSync('/proc/self/fd').length - 1;
    return { open, limit: knownLimit };
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    if ((code === 'EMFILE' || code === 'ENFILE') && knownLimit !== undefined) return { open: knownLimit, limit: knownLimit };
    return undefined;
  }
}

/** Said at 90 % of the limit, cleared below 80 % (no line a check for a node hovering at the edge). */
const NEAR = 0.9;
const CLEAR = 0.8;

export class DescriptorWatch {
  private near = false;
  private readonly read: () => DescriptorUse | undefined;
  private readonly say: { error(use: DescriptorUse): void; info(use: DescriptorUse): void };

  constructor(say: { error(use: DescriptorUse): void; info(use: DescriptorUse): void }, read: () => DescriptorUse | undefined = descriptorUse) {
    this.say = say;
    this.read = read;
  }

  check(): void {
    const use = this.read();
    if (!use) return;
    if (!this.near && use.open >= use.limit * NEAR) {
      this.near = true;
      this.say.error(use);
    } else if (this.near && use.open < use.limit * CLEAR) {
      this.near = false;
      this.say.info(use);
    }
  }
}
