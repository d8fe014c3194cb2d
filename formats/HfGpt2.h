// Conversion between Loom's GPT parameters and the Hugging Face GPT-2 layout
// (transformer.wte.weight, transformer.h.N.attn.c_attn.weight in Conv1D [in, out] layout, ...).
// Loom already stores weights [in, out] under the same names; two things differ:
// - QKV columns: Loom groups them per head, [heads, 3, head_dim] (so a column-parallel split
//   gives whole heads), Hugging Face as [3, heads, head_dim];
// - the word embedding: Loom pads the vocabulary (to a multiple of 128 t), GPT-2 has 50257 rows.
// Pipeline-tied copies (NAME.stageK) are dropped on export.
#pragma once

#include <map>
#include <string>

#include "support/Status.h"
#include "runtime/Tensor.h"

namespace loom {

// Column permutation of a fused QKV projection (a [in, 3H] weight or a [3H] bias) between Loom's
// per-head grouping [heads, 3, hd] and Hugging Face's [3, heads, hd] (toHf, or back).
HostTensor permuteQkvColumns(const HostTensor &t, int64_t heads, bool toHf);

std::map<std::string, HostTensor> toHuggingFaceGpt2(const std::map<std::string, HostTensor> &loom, int64_t vocab,
                                                    int64_t heads);
Status fromHuggingFaceGpt2(const std::map<std::string, HostTensor> &hf, int64_t paddedVocab, int64_t heads,
                           std::map<std::string, HostTensor> *loom);

}  // namespace loom
