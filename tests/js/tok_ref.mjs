// tok_ref.mjs — reference answers from Hugging Face tokenizers' JavaScript port
// (@lenml/tokenizers, a fork of transformers.js) for clrt's tokenizer tests.
//   node tok_ref.mjs encode DIR IN.json OUT.json   DIR holds tokenizer.json (+ tokenizer_config.json);
//       IN is a JSON list of strings; OUT gets {ids, ids_special, decoded, nfc}: ids without and with
//       special tokens, decode(ids) without clean-up, with the tokenizer's defaults, skipping
//       special tokens, and each text in NFC
//   node tok_ref.mjs decode DIR IN.json OUT.json   IN is a JSON list of id lists; OUT gets {plain, skip}
//   node tok_ref.mjs bench DIR FILE                 encode FILE line by line; prints MB/s
import { TokenizerLoader } from "@lenml/tokenizers";
import { readFileSync, writeFileSync, existsSync } from "node:fs";

function load(dir) {
  const tokenizerJSON = JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8"));
  const cfgPath = `${dir}/tokenizer_config.json`;
  const tokenizerConfig = existsSync(cfgPath) ? JSON.parse(readFileSync(cfgPath, "utf8")) : {};
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

const [mode, dir, a, b] = process.argv.slice(2);
const tok = load(dir);
if (mode === "encode") {
  const texts = JSON.parse(readFileSync(a, "utf8"));
  const ids = [], ids_special = [], decoded = [], decoded_default = [], decoded_skip = [];
  for (const t of texts) {
    const x = tok.encode(t, { add_special_tokens: false });
    ids.push(x);
    ids_special.push(tok.encode(t));
    decoded.push(x.length === 0 ? "" : tok.decode(x, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
    decoded_default.push(x.length === 0 ? "" : tok.decode(x));
    decoded_skip.push(x.length === 0 ? "" : tok.decode(x, { skip_special_tokens: true }));
  }
  const nfc = texts.map((t) => t.normalize("NFC"));
  writeFileSync(b, JSON.stringify({ ids, ids_special, decoded, decoded_default, decoded_skip, nfc }));
} else if (mode === "decode") {
  // IN is a JSON list of id lists; OUT gets {plain, skip}: decode without clean-up, and skipping
  // special tokens
  const lists = JSON.parse(readFileSync(a, "utf8"));
  const plain = [], skip = [];
  for (const ids of lists) {
    plain.push(ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
    skip.push(ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false }));
  }
  writeFileSync(b, JSON.stringify({ plain, skip }));
} else if (mode === "bench") {
  const text = readFileSync(a, "utf8");
  const lines = text.split("\n");
  const t0 = process.hrtime.bigint();
  let n = 0;
  for (const line of lines) n += tok.encode(line, { add_special_tokens: false }).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  const mb = Buffer.byteLength(text, "utf8") / 1e6;
  console.log(JSON.stringify({ seconds: s, mb, mb_per_s: mb / s, tokens: n }));
} else {
  console.error("usage: node tok_ref.mjs encode|decode|bench DIR ...");
  process.exit(2);
}
