// Type-checks deploy/grafana/dashboard.json against Grafana's own dashboard schema types
// (npm @grafana/schema, generated from Grafana's CUE kinds) with the TypeScript compiler.
// The JSON is pasted into a .ts file as object literals, so TypeScript's excess-property
// check rejects unknown keys as well as wrong types: the dashboard model as a whole
// against `Dashboard`, and each panel's options / custom field config against the
// panel plugin's own `Options` / `FieldConfig` (timeseries, stat, heatmap).
// Usage: NODE_PATH=<node_modules with @grafana/schema and typescript> node typecheck.mjs dashboard.json
import { readFileSync, writeFileSync, mkdtempSync, symlinkSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { execFileSync } from "node:child_process";

const modules = resolve(process.env.NODE_PATH ?? "node_modules");
const file = process.argv[2] ?? join(dirname(new URL(import.meta.url).pathname), "dashboard.json");
const dash = JSON.parse(readFileSync(file, "utf8"));

const cfg = "@grafana/schema/dist/esm/raw/composable";
// Panel plugin -> [module, has a custom FieldConfig type]
const plugins = {
  timeseries: [`${cfg}/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen`, true],
  stat: [`${cfg}/stat/panelcfg/x/StatPanelCfg_types.gen`, false],
  heatmap: [`${cfg}/heatmap/panelcfg/x/HeatmapPanelCfg_types.gen`, true],
};

const lit = (v) => JSON.stringify(v, null, 2);
let ts = `import type { Dashboard } from "@grafana/schema";\n`;
for (const [name, [spec, custom]] of Object.entries(plugins)) {
  ts += `import type { Options as ${name}Options${custom ? `, FieldConfig as ${name}FieldConfig` : ""} } from "${spec}";\n`;
  if (!custom) ts += `type ${name}FieldConfig = Record<string, never>;\n`;
}
// The schema's string enums (ThresholdsMode, VizOrientation, ...) are TypeScript enums,
// which JSON string literals cannot be assigned to; Loose<T> swaps each for the union of
// its values (`${E}`), keeping every other constraint, optional keys included.
ts += `type Loose<T> = T extends string ? \`\${T}\` : T extends number | boolean | null | undefined ? T
  : T extends (infer U)[] ? Loose<U>[] : T extends object ? { [K in keyof T]: Loose<T[K]> } : T;\n`;
ts += `\nexport const dashboard: Loose<Dashboard> = ${lit(dash)};\n`;
let unknown = [];
for (const p of dash.panels ?? []) {
  if (p.type === "row") continue;
  if (!plugins[p.type]) {
    unknown.push(`${p.id} ${p.type}`);
    continue;
  }
  ts += `export const options_${p.id}: Loose<${p.type}Options> = ${lit(p.options ?? {})};\n`;
  ts += `export const custom_${p.id}: Loose<${p.type}FieldConfig> = ${lit(p.fieldConfig?.defaults?.custom ?? {})};\n`;
}
if (unknown.length) {
  console.log(`grafana-typecheck: no plugin types for panels ${unknown.join(", ")}`);
  process.exit(1);
}

const dir = mkdtempSync(join(tmpdir(), "dash-ts-"));
try {
  symlinkSync(modules, join(dir, "node_modules"), "dir");
  writeFileSync(join(dir, "dashboard.check.ts"), ts);
  writeFileSync(
    join(dir, "tsconfig.json"),
    lit({
      compilerOptions: {
        strict: true,
        noEmit: true,
        target: "ES2022",
        module: "ESNext",
        moduleResolution: "Bundler",
        skipLibCheck: true,
        types: [],
      },
      files: ["dashboard.check.ts"],
    }),
  );
  const tsc = join(modules, "typescript", "bin", "tsc");
  try {
    execFileSync(process.execPath, [tsc, "-p", dir], { stdio: "pipe" });
  } catch (e) {
    console.log(String(e.stdout) + String(e.stderr));
    console.log("grafana-typecheck: FAILED");
    process.exit(1);
  }
  const panels = (dash.panels ?? []).filter((p) => p.type !== "row").length;
  console.log(`grafana-typecheck: dashboard and ${panels} panels match @grafana/schema (schemaVersion ${dash.schemaVersion})`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
