// Training a byte-level BPE on a corpus (Sennrich et al. 2016, "Neural Machine Translation of
// Rare Words with Subword Units", section 3.2; byte-level as GPT-2, Radford et al. 2019,
// section 2.2): start from the 256 byte symbols, then repeatedly merge the most frequent
// adjacent pair within GPT-2's pre-tokenized pieces. The result is written as GPT-2's
// encoder.json and vocab.bpe, so BpeTokenizer, loom-generate and Hugging Face's GPT2Tokenizer
// read it like GPT-2's own files.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "support/Status.h"

namespace loom {

struct TrainedBpe {
  // id -> token in the byte-level alphabet: the 256 bytes (by code point, as GPT-2's first 256
  // ids), one token per merge in merge order, then <|endoftext|> last.
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
};

// `vocabSize` counts every token, <|endoftext|> included (so vocabSize - 257 merges, fewer if
// the corpus runs out of pairs). Ties in frequency go to the pair whose two tokens compare
// smallest as byte strings, so the result depends only on the documents.
Status trainByteLevelBpe(const std::vector<std::string> &documents, int64_t vocabSize, TrainedBpe *out);

// encoder.json (token -> id) and vocab.bpe ("#version: 0.2", then one "a b" line per merge),
// each written atomically.
Status writeBpeFiles(const TrainedBpe &bpe, const std::string &encoderJson, const std::string &vocabBpe);

}  // namespace loom
