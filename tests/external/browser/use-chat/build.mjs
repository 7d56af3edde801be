// Bundles index.jsx (React, @ai-sdk/react, ai from tests/external/node/node_modules) with esbuild into one
// self-contained page: dist/index.html, the script inline, no external asset.
// Usage: node tests/external/browser/use-chat/build.mjs [out file]   (prints the written path)
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeModules = path.resolve(here, '../../node/node_modules');
const require = createRequire(path.join(nodeModules, 'x.js'));
const esbuild = require('esbuild');

const result = await esbuild.build({
  entryPoints: [path.join(here, 'index.jsx')],
  bundle: true,
  write: false,
  format: 'iife',
  platform: 'browser',
  target: 'es2022',
  minify: true,
  jsx: 'automatic',
  nodePaths: [nodeModules],
  define: { 'process.env.NODE_ENV': '"production"' },
  logLevel: 'warning',
});
// Inline: no `</script` may appear inside the element.
const js = result.outputFiles[0].text.replace(/<\/script/gi, '<\\/script');
const html = `<!doctype html>
<html><head><meta charset="utf-8"><title>useChat via sse-gateway</title></head>
<body><div id="root"></div><script>${js}</script></body></html>
`;
const out = process.argv[2] ? path.resolve(process.argv[2]) : path.join(here, 'dist', 'index.html');
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, html);
process.stdout.write(out + '\n');
