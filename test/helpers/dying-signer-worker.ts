// A signer worker that dies on its first task, as a thread killed by the OS would.
// piscina loads a task file with require() first, and Node 24's require() of an ES module aborted
// the whole process now and then (an assertion in CreateRequiredModuleFacade, seen in session 21's
// test runs). A module with a top-level await cannot be required: piscina imports it instead.
await Promise.resolve();
export default function run(): never {
  process.exit(1);
}
