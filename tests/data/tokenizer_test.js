// Loom's C++ GPT-2 BPE (loom-preprocess --encode) must produce exactly the ids of the
// reference JavaScript encoder of the npm package gpt-3-encoder, and decode them back.
// usage: node tokenizer_test.js LOOM_PREPROCESS GPT3_ENCODER_DIR CASES.json
const { execFileSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const [preprocess, encoderDir, casesFile] = process.argv.slice(2);
const { encode } = require(path.resolve(encoderDir));
const cases = JSON.parse(fs.readFileSync(casesFile, 'utf8'));
const common = ['--vocab', path.join(encoderDir, 'encoder.json'), '--merges', path.join(encoderDir, 'vocab.bpe')];
let failures = 0;
for (const text of cases) {
  const want = encode(text).join(' ');
  const got = execFileSync(preprocess, [...common, '--encode', text], { encoding: 'utf8' }).trim();
  const back = execFileSync(preprocess, [...common, '--decode', got], { encoding: 'utf8' });
  const ok = got === want && back === text;
  if (!ok) failures++;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${JSON.stringify(text).slice(0, 60)}${ok ? '' : `\n  want ${want}\n  got  ${got}\n  decoded ${JSON.stringify(back)}`}`);
}
console.log(failures ? `${failures} of ${cases.length} cases differ` : `all ${cases.length} cases byte-exact`);
process.exit(failures ? 1 : 0);
