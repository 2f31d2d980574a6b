// A signer worker that dies on its first task, as a thread killed by the OS would.
export default function run(): never {
  process.exit(1);
}
