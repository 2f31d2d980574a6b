// A request whose headers arrive and whose body stops short: what a server answers, and when.
import net from 'node:net';

/** Sends headers declaring `declared` body bytes and only `sent` of them; resolves with the answer and how long it took (or '' after `giveUpMs`). */
export function stalledRequest(port: number, host: string, path: string, opts: { declared?: number; sent?: string; giveUpMs?: number } = {}): Promise<{ answer: string; ms: number }> {
  const started = Date.now();
  return new Promise((resolve) => {
    const socket = net.connect(port, host);
    let answer = '';
    const done = (): void => {
      socket.destroy();
      resolve({ answer, ms: Date.now() - started });
    };
    socket.write(`POST ${path} HTTP/1.1\r\nHost: ${host}\r\nContent-Type: application/json\r\nContent-Length: ${opts.declared ?? 1000}\r\n\r\n${opts.sent ?? '{"a'}`);
    socket.on('data', (c) => (answer += c.toString('latin1')));
    socket.on('close', done);
    socket.on('error', done);
    setTimeout(done, opts.giveUpMs ?? 15_000);
  });
}
