// hf_encode.js: the independent tokenizer.json encoder that Trident's (data/hf_tokenizer.h) is
// checked against — Hugging Face's tokenizers library through its official Node binding (the
// npm package `tokenizers`, fetched by scripts/fetch_hf_tokenizers.sh), run by node.
//
//   node hf_encode.js LIB JSON --strings FILE [--special]
//       FILE is a JSON array of strings: one JSON array of ids per string, one per line
//   node hf_encode.js LIB JSON --ids FILE [--special]
//       the ids of FILE (UTF-8) as one JSON array
//   node hf_encode.js LIB JSON --make-gpt2 DIR
//       writes JSON: GPT-2's tokenizer as the library builds it from DIR/encoder.json and
//       DIR/vocab.bpe (ByteLevel pre-tokenizer and post-processor, <|endoftext|> special; the
//       binding offers no ByteLevel decoder, so none)
//
// LIB is the directory that holds the package. --special: with the post-processor's tokens
// (encode's addSpecialTokens), else without.
'use strict';
const fs = require('fs');
const path = require('path');

const [lib, json, mode, file, flag] = process.argv.slice(2);
if (!lib || !json || !['--strings', '--ids', '--make-gpt2'].includes(mode) || !file) {
  console.error('usage: node hf_encode.js LIB JSON --strings|--ids FILE [--special] | ' +
                '--make-gpt2 DIR');
  process.exit(2);
}
const tk = require(path.resolve(lib));

async function make_gpt2(dir) {
  const model = await tk.BPE.fromFile(path.join(dir, 'encoder.json'), path.join(dir, 'vocab.bpe'));
  const tokenizer = new tk.Tokenizer(model);
  tokenizer.setPreTokenizer(tk.byteLevelPreTokenizer(false, true));
  tokenizer.setPostProcessor(tk.byteLevelProcessing(true));
  tokenizer.addSpecialTokens(['<|endoftext|>']);
  tokenizer.save(json);
}

async function main() {
  if (mode === '--make-gpt2') return make_gpt2(file);
  const tokenizer = tk.Tokenizer.fromFile(json);
  const options = {addSpecialTokens: flag === '--special'};
  const ids = async (text) => (await tokenizer.encode(text, null, options)).getIds();
  const text = fs.readFileSync(file, 'utf8');
  if (mode === '--ids') {
    process.stdout.write(JSON.stringify(await ids(text)) + '\n');
    return;
  }
  const lines = [];
  for (const s of JSON.parse(text)) lines.push(JSON.stringify(await ids(s)));
  process.stdout.write(lines.join('\n') + '\n');
}

main().catch((e) => {
  console.error(String(e && e.stack || e));
  process.exit(1);
});
