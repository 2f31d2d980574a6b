// SHA-256 of a file, streamed (models are gigabytes). Its own module: the CLI's dev-model and the
// audit's replay need it without loading node-llama-cpp.
import crypto from 'node:crypto';
import fs from 'node:fs';

export async function fileSha256(file: string): Promise<string> {
  const hash = crypto.createHash('sha256');
  for await (const chunk of fs.createReadStream(file, { highWaterMark: 1 << 22 })) hash.update(chunk as Buffer);
  return hash.digest('hex');
}
