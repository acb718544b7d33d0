// jinja_ref.mjs — render templates with @huggingface/jinja (what transformers.js and the Hub
// run) for clrt's Jinja tests: any context, and errors reported instead of thrown.
//   node jinja_ref.mjs IN.json OUT.json
//   IN: {templates: [source, ...], cases: [{t: index into templates (0-based), ctx: {...}}]}
//   OUT: a JSON list, one per case: {text} or {error}
import { Template } from "@huggingface/jinja";
import { readFileSync, writeFileSync } from "node:fs";

const [inPath, outPath] = process.argv.slice(2);
const spec = JSON.parse(readFileSync(inPath, "utf8"));
const compiled = spec.templates.map((src) => {
  try { return new Template(src); } catch (e) { return e; }
});
const out = spec.cases.map((c) => {
  const t = compiled[c.t];
  if (t instanceof Error) return { error: String(t.message) };
  try { return { text: t.render(c.ctx) }; } catch (e) { return { error: String(e.message) }; }
});
writeFileSync(outPath, JSON.stringify(out));
