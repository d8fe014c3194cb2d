// The vocabulary's rows between Hugging Face's files and Loom's parameters: Loom pads the
// vocabulary to a multiple (Megatron's make-vocab-size-divisible-by, times the tensor-parallel
// size), Hugging Face's tensors have the vocabulary's rows (embeddings, output layers, BERT's
// per-token output bias).
#pragma once

#include <string>

#include "runtime/Tensor.h"
#include "support/Status.h"

namespace loom {

// t's rows, then zero rows up to paddedVocab; more rows than paddedVocab (or a tensor without
// rows) is a one-line error naming `name`.
Status padVocabRows(const std::string &name, const HostTensor &t, int64_t paddedVocab, HostTensor *out);

// The first `vocab` rows of t (the padding cut off).
HostTensor vocabRows(const HostTensor &t, int64_t vocab);

}  // namespace loom
