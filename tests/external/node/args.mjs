// The command line the frontend scripts share (ag-ui-client.mjs, ai-sdk-client.mjs, mock-frontend-server.mjs):
// `--name value` options, `--name` flags, and the JSON script named by `--script`.
import fs from 'node:fs';

const argv = process.argv.slice(2);

// The value after `--name`, or `dflt`.
export function opt(name, dflt = undefined) {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
}

// Whether `--name` is on the command line.
export function flag(name) {
  return argv.includes(name);
}

// `--url` and the parsed `--script` file; with either missing, or `valid` false, prints `usage` and exits 2.
export function urlAndScript(usage, valid = true) {
  const url = opt('--url');
  const scriptFile = opt('--script');
  if (!valid || !url || !scriptFile) {
    console.error(`usage: ${usage}`);
    process.exit(2);
  }
  return { url, script: JSON.parse(fs.readFileSync(scriptFile, 'utf8')) };
}
