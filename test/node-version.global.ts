// vitest globalSetup: the suite needs what the program needs (Node.js 22+). Under an older Node the
// native addons, built for the Node that ran `npm ci`, can crash a test worker outright; say why first.
export default function checkNodeVersion(): void {
  const major = Number(process.versions.node.split('.')[0]);
  if (major < 22) {
    throw new Error(`the tests need Node.js 22 or newer (as seller-node does); this is Node.js ${process.versions.node} at ${process.execPath}. Put a newer node first on PATH (.ci/run installs one into .tools/node24).`);
  }
}
