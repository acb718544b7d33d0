// chat_ref.mjs — render chat templates with @huggingface/jinja (the engine transformers.js uses)
// for clrt's chat tests.
//   node chat_ref.mjs IN.json OUT.json
//   IN: {template, bos_token, eos_token, cases: [{messages, add_generation_prompt, enable_thinking?, tools?, tools_in_user_message?}]}
//   OUT: a JSON list of rendered strings, one per case
import { Template } from "@huggingface/jinja";
import { readFileSync, writeFileSync } from "node:fs";

const [inPath, outPath] = process.argv.slice(2);
const spec = JSON.parse(readFileSync(inPath, "utf8"));
const tpl = new Template(spec.template);
const out = spec.cases.map((c) => {
  // as transformers.js's apply_chat_template: tools and documents are null unless given
  const ctx = { messages: c.messages, add_generation_prompt: !!c.add_generation_prompt,
    tools: null, documents: null, bos_token: spec.bos_token ?? "", eos_token: spec.eos_token ?? "" };
  if (c.enable_thinking !== undefined) ctx.enable_thinking = c.enable_thinking;
  if (c.date_string !== undefined) ctx.date_string = c.date_string;
  if (c.tools !== undefined) ctx.tools = c.tools;
  if (c.tools_in_user_message !== undefined) ctx.tools_in_user_message = c.tools_in_user_message;
  return tpl.render(ctx);
});
writeFileSync(outPath, JSON.stringify(out));
