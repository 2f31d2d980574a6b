// The gateway's logger: pino-shaped. The gateway logs ids, codes and counts, never prompts or outputs.

export interface GatewayLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

export const noopLogger: GatewayLogger = { info: () => undefined, warn: () => undefined, error: () => undefined };
