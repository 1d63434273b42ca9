'use strict';
// Builds the native module from the checkout with cargo, as `npm install`
// does (the package's install script): steadfast.node beside index.js.
// STEADFAST_NODE_PROFILE=debug builds without optimisation (faster to build,
// as CI does); the default is release.

const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');
const profile = process.env.STEADFAST_NODE_PROFILE === 'debug' ? 'debug' : 'release';
const args = ['build', '-p', 'steadfast-node', '--message-format=json-render-diagnostics'];
if (profile === 'release') args.push('--release');

let out;
try {
  out = execFileSync('cargo', args, { cwd: root, stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 256 << 20 });
} catch (e) {
  const why = e.code === 'ENOENT' ? 'cargo was not found: the package is built from source and needs the Rust toolchain (https://rustup.rs)' : 'cargo build failed (its messages are above)';
  console.error(`steadfast: ${why}`);
  process.exit(1);
}
// The library cargo made, as its own messages name it (wherever the target
// directory is).
let lib = null;
for (const line of out.toString().split('\n')) {
  if (!line.startsWith('{')) continue;
  const m = JSON.parse(line);
  if (m.reason === 'compiler-artifact' && m.target && m.target.name === 'steadfast_node') {
    lib = m.filenames.find((f) => /\.(so|dylib|dll)$/.test(f)) || lib;
  }
}
if (!lib) {
  console.error('steadfast: cargo built no steadfast_node library');
  process.exit(1);
}
const dest = path.join(__dirname, 'steadfast.node');
// Copied to a new file and renamed over the old one: a process that has the
// old module loaded keeps its mapping.
fs.copyFileSync(lib, `${dest}.tmp`);
fs.renameSync(`${dest}.tmp`, dest);
console.error(`steadfast: built ${path.relative(process.cwd(), dest)} (${profile})`);
