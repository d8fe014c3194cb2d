// Documents from the inputs loom-preprocess accepts: plain text files (one document each),
// JSON lines ({"text": ...} per line), and the Brown corpus's tagged files ("word/tag"
// tokens, one sentence per line), which are turned back into plain text.
#pragma once

#include <string>
#include <vector>

#include "support/Status.h"

namespace loom {

// Regular files under `paths` (directories walked in sorted order).
Status listInputs(const std::vector<std::string> &paths, const std::string &format, std::vector<std::string> *files);
// Appends the documents of one file.
Status readDocuments(const std::string &path, const std::string &format, const std::string &jsonKey,
                     std::vector<std::string> *docs);
// "The/at jury/nn said/vbd ``/`` no/at ''/'' ./." -> "The jury said \"no\"."
std::string detokenizeBrown(const std::string &taggedText);

}  // namespace loom
