#!/usr/bin/env node
// Entry point. Plain JavaScript that any Node.js can parse, so an old Node gets a clear message
// instead of a syntax error from deep inside a dependency.
const major = Number(process.versions.node.split('.')[0]);
if (major < 22) {
  process.stderr.write(`seller-node needs Node.js 22 or newer; this is Node.js ${process.versions.node}.\n`);
  process.exit(1);
}
// A terminal that closed (SIGHUP: the node then stops gracefully) or a reader that went away
// (EPIPE) makes writes to stdout/stderr fail: the output is dropped, the process carries on.
for (const s of [process.stdout, process.stderr]) s.on('error', () => {});
const { main } = await import('../dist/src/cli/main.js');
process.exitCode = await main(process.argv.slice(2));
