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
// One line of a Brown file (one sentence), detokenized as above.
std::string detokenizeBrownSentence(const std::string &taggedLine);

// The sentences of each document (BERT's datasets store one sequence per sentence): a Brown
// file's lines (its sentences, detokenized); plain text and JSON lines split by splitSentences.
Status readDocumentSentences(const std::string &path, const std::string &format, const std::string &jsonKey,
                             std::vector<std::vector<std::string>> *docs);
// A simple sentence splitter: paragraphs end at blank lines (inside one, a line break is a
// space); a sentence ends after a run of '.', '!' or '?' and any closing quotes or brackets,
// followed by whitespace, unless the next word starts with a lower-case ASCII letter or the
// run is one '.' after an initial ("J.") or a common abbreviation ("Mr.", "e.g.", "etc.");
// and after an ideographic full stop or a full-width '!' or '?', spaces or not. Sentences are
// trimmed of surrounding whitespace; empty ones are left out.
std::vector<std::string> splitSentences(const std::string &text);

}  // namespace loom
