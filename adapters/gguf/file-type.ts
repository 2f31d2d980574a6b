// The quantization bucket a GGUF file says it is (`general.file_type`, llama.cpp's llama_ftype):
// ALL_F32 → "f32", MOSTLY_Q4_K_M → "q4-k-m", as buyers route on it (lowercase, "_" written "-").
import { GgufFileType } from 'node-llama-cpp';

/** The bucket of a `general.file_type` value, or undefined for a value llama.cpp does not name. */
export function quantizationOfFileType(fileType: number | undefined): string | undefined {
  if (fileType === undefined) return undefined;
  const name = (GgufFileType as unknown as Record<number, string | undefined>)[fileType];
  return typeof name === 'string' ? name.replace(/^(ALL|MOSTLY)_/, '').toLowerCase().replaceAll('_', '-') : undefined;
}
