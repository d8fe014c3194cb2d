// Loom's C++ WordPiece tokenizer (loom-preprocess --tokenizer wordpiece --encode/--decode) against
// two independent implementations, on hand-made cases and sentences of the Brown corpus:
//  1. the reference of wordpiece_reference.py (BERT's published algorithm in Python): ids and
//     decoded text must be equal on every text;
//  2. the npm package bert-tokenizer's JavaScript WordPiece (dist/wordpiecetokenizer.js) on each
//     of the reference's basic-tokenizer words: equal pieces, except on a word the JavaScript
//     treats differently by design (it applies NFKC to each word; it has no 100-character limit);
//  3. bert-tokenizer's whole JavaScript pipeline (dist/index.js): it does not implement all of
//     BERT's basic tokenizer, so it may differ, but only on a text showing one of its known
//     deviations (listed in `deviations` below); a difference without one fails the test.
// usage: node wordpiece_test.js LOOM_PREPROCESS VOCAB_TXT BERT_TOKENIZER_DIR CASES.json BROWN_DIR REFERENCE.py
const { execFileSync, spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const [preprocess, vocabTxt, bertDir, casesFile, brownDir, referencePy] = process.argv.slice(2);
const WordPieceTokenizer = require(path.resolve(bertDir, 'dist/wordpiecetokenizer.js')).default;
const { BertTokenizer } = require(path.resolve(bertDir, 'dist/index.js'));
const vocabJson = path.resolve(bertDir, 'assets/vocab.json');

// Brown: from every 5th file (in name order), its first 3 sentences, tags dropped, quotes as ".
const brown = [];
const files = fs.readdirSync(brownDir).filter((f) => /^c[a-z]\d\d$/.test(f)).sort();
for (let i = 0; i < files.length; i += 5) {
  const lines = fs.readFileSync(path.join(brownDir, files[i]), 'utf8').split('\n').filter((l) => l.trim());
  for (const line of lines.slice(0, 3)) {
    brown.push(line.trim().split(/\s+/).map((t) => t.slice(0, t.lastIndexOf('/') >= 0 ? t.lastIndexOf('/') : t.length))
      .map((w) => (w === '``' || w === "''" ? '"' : w)).join(' '));
  }
}
const cases = JSON.parse(fs.readFileSync(casesFile, 'utf8'));
const texts = cases.concat(brown);

const ref = JSON.parse(execFileSync('python3', [referencePy, vocabTxt], { input: JSON.stringify(texts), encoding: 'utf8',
  maxBuffer: 1 << 26 }));
const wp = new WordPieceTokenizer();
wp.load(vocabJson);
const bert = new BertTokenizer(vocabJson, true, 512);

// Known deviations of bert-tokenizer's pipeline from BERT's basic tokenizer.
const cjk = /[\u4E00-\u9FFF\u3400-\u4DBF\uF900-\uFAFF]|[\u{20000}-\u{2A6DF}\u{2A700}-\u{2CEAF}\u{2F800}-\u{2FA1F}]/u;
const deviations = {
  'ASCII symbols $+<=>^`|~ are not punctuation to it': (t) => /[$+<=>^`|~]/.test(t),
  'no spaces around CJK ideographs': (t) => cjk.test(t),
  'strips only the first of repeated combining marks': (t) => {
    const marks = t.normalize('NFD').match(/\p{Mn}/gu) || [];
    return new Set(marks).size < marks.length;
  },
  'keeps format characters (category Cf)': (t) => /\p{Cf}/u.test(t),
  'NFKC on each word': (t, r) => r.basic.some((w) => w.normalize('NFKC') !== w),
  'no 100-character limit': (t, r) => r.basic.some((w) => [...w].length > 100),
};

const loom = (args) => execFileSync(preprocess, ['--tokenizer', 'wordpiece', '--vocab', vocabTxt, ...args],
  { encoding: 'utf8' }).replace(/\n$/, '');
let refAgree = 0, wpAgree = 0, words = 0, wordsExplained = 0, jsAgree = 0, failures = 0;
const explained = {};
texts.forEach((text, i) => {
  const r = ref[i];
  const got = loom(['--encode', text]);
  const decoded = loom(['--decode', got]);
  const want = r.ids.join(' ');
  const show = JSON.stringify(text).slice(0, 70);
  if (got === want && decoded === r.decoded) {
    refAgree++;
  } else {
    failures++;
    console.log(`FAIL reference ${show}\n  want ${want}\n  got  ${got}\n  want decoded ${JSON.stringify(r.decoded)}\n  got decoded  ${JSON.stringify(decoded)}`);
  }
  const hits = Object.keys(deviations).filter((k) => deviations[k](text, r));
  // Word by word (the reference's pieces are Loom's, checked above).
  let textAgrees = true;
  r.basic.forEach((w, j) => {
    const js = wp.tokenize(w).join(' '), want = r.word_ids[j].join(' ');
    if (js === want) {
      words++;
      return;
    }
    textAgrees = false;
    if (w.normalize('NFKC') !== w || [...w].length > 100) {
      wordsExplained++;
      return;
    }
    failures++;
    console.log(`FAIL wordpiecetokenizer.js on ${JSON.stringify(w)} of ${show}\n  js   ${js}\n  want ${want}`);
  });
  if (textAgrees) wpAgree++;
  // It turns an empty word (from a leading, trailing or double space, or a space it puts before
  // a leading punctuation mark) into [UNK]: it is given the text with its whitespace runs as
  // single spaces (which BERT's result does not depend on) after a word "a" (id 1037).
  const spaced = text.replace(/\s+/gu, ' ').trim();
  const js = bert.tokenize(spaced ? `a ${spaced}` : 'a').join(' ');
  const gotAfterA = ['1037'].concat(got ? got.split(' ') : []).join(' ');
  if (js === gotAfterA) {
    jsAgree++;
  } else if (hits.length) {
    for (const k of hits) explained[k] = (explained[k] || 0) + 1;
  } else {
    failures++;
    console.log(`FAIL bert-tokenizer (no known deviation) ${show}\n  js   ${js}\n  loom ${gotAfterA}`);
  }
});
const n = texts.length;
console.log(`${n} texts (${cases.length} hand-made, ${brown.length} Brown sentences)`);
console.log(`reference (BERT's algorithm in Python): ids and decoded text agree on ${refAgree} of ${n}`);
console.log(`wordpiecetokenizer.js on the reference's words: ${words} words agree, ${wordsExplained} differ, each one NFKC changes or over 100 characters; ${wpAgree} of ${n} texts agree throughout`);
console.log(`bert-tokenizer's whole pipeline: ${jsAgree} of ${n} agree; each of the other ${n - jsAgree} shows one or more of its known deviations:`);
for (const [k, v] of Object.entries(explained)) console.log(`  ${k}: ${v} texts`);
console.log(failures ? `${failures} unexplained differences` : 'no unexplained differences');
process.exit(failures ? 1 : 0);
