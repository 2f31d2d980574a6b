// npm run bench: every benchmark, each printed as a ratio to a baseline measured in this same run.
// Figures vary with the machine; the ratios are what the README records and the issues target.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { benchAudit } from './audit.ts';
import { figures } from './lib.ts';
import { benchSignLog } from './sign-log.ts';
import { benchVerify } from './verify.ts';
import { benchNode } from './node.ts';

const quick = process.argv.includes('--quick');
process.stdout.write(`seller-node benchmarks — node ${process.version}, ${os.cpus().length} cores${quick ? ' (quick)' : ''}\n\n`);
await benchSignLog(quick ? 5_000 : 40_000);
const rawVerify = await benchVerify(quick ? 2_000 : 10_000);
benchAudit(quick ? 10_000 : 100_000, rawVerify);
await benchNode(quick ? 200 : 1000);

const out = path.join(import.meta.dirname, 'out');
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, 'results.json'), JSON.stringify({ node: process.version, cores: os.cpus().length, at: new Date().toISOString(), figures }, null, 2));
const failed = figures.filter((f) => f.pass === false);
process.stdout.write(`\n${failed.length ? `${failed.length} below target: ${failed.map((f) => f.name.trim()).join('; ')}` : 'all targets met'}\n`);
