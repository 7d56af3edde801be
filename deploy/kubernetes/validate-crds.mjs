// Validates the prometheus-operator custom resources in the given YAML files against the
// schemas generated from prometheus-operator's Go API types (npm package
// @kubernetes-models/prometheus-operator). Core kinds are checked by kubernetes-validate
// (Python) instead; this script fails on any custom kind it has no schema for, so a new
// CRD in deploy/kubernetes cannot slip through unvalidated.
// Usage: NODE_PATH=<dir with node_modules> node validate-crds.mjs FILE...
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

// ESM ignores NODE_PATH, so resolve the packages' files from it by hand.
const modulesDir = process.env.NODE_PATH ?? "node_modules";
const require = createRequire(join(modulesDir, "noop.js"));
const yaml = require("js-yaml");
const load = async (spec) => import(pathToFileURL(join(modulesDir, `${spec}.js`)).href);

const models = {
  "monitoring.coreos.com/v1/ServiceMonitor": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
  "monitoring.coreos.com/v1/PodMonitor": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor",
  "monitoring.coreos.com/v1/PrometheusRule": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule",
};
// Kinds kubernetes-validate covers (built-in API groups) or that are not cluster objects.
const skipped = (apiVersion) =>
  !apiVersion.includes(".") || /\.k8s\.io\//.test(apiVersion) || apiVersion.startsWith("kustomize.config.k8s.io/");

let failed = 0;
let checked = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of yaml.loadAll(readFileSync(file, "utf8"))) {
    if (!doc) continue;
    const key = `${doc.apiVersion}/${doc.kind}`;
    if (skipped(doc.apiVersion ?? "")) continue;
    const spec = models[key];
    if (!spec) {
      console.log(`FAIL ${file}: no schema for ${key}`);
      failed++;
      continue;
    }
    const mod = await load(spec);
    try {
      new mod[doc.kind](doc).validate();
      console.log(`ok   ${file}: ${key} ${doc.metadata?.name}`);
      checked++;
    } catch (e) {
      console.log(`FAIL ${file}: ${key} ${doc.metadata?.name}: ${e.message}`);
      failed++;
    }
  }
}
console.log(`crd-validate: ${checked} valid, ${failed} failed`);
process.exit(failed ? 1 : 0);
