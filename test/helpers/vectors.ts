// Where the shared public test vectors live: ../shared/vectors beside the repository (never copied in).
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import fs from 'node:fs';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const VECTORS = path.resolve(REPO_ROOT, '..', 'shared', 'vectors');

export function vectorPath(...parts: string[]): string {
  return path.join(VECTORS, ...parts);
}

export function readVectorJson<T = unknown>(...parts: string[]): T {
  return JSON.parse(fs.readFileSync(vectorPath(...parts), 'utf8')) as T;
}
