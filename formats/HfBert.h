// Conversion between Loom's BERT parameters and Hugging Face's MegatronBertForPreTraining
// layout (the pre-LN BERT of the Megatron-LM paper: bert.embeddings.*, bert.encoder.layer.N.*
// with a layer norm before each branch, bert.encoder.ln, bert.pooler.dense, cls.predictions.*,
// cls.seq_relationship). What differs from Loom's own (GPT-style) names:
// - Loom stores linear weights [in, out], Hugging Face's nn.Linear [out, in];
// - Loom's fused QKV projection groups its columns per head, [heads, 3, head_dim]: Hugging
//   Face has separate query, key and value projections;
// - Loom pads the vocabulary (word embeddings, the masked-LM head's bias); the decoder is tied
//   to the word embeddings and not stored (save_pretrained drops tied weights).
// Pipeline-tied copies (NAME.stageK) are dropped on export.
#pragma once

#include <map>
#include <string>

#include "runtime/Tensor.h"
#include "support/Status.h"

namespace loom {

Status toHuggingFaceBert(const std::map<std::string, HostTensor> &loom, int64_t vocab, int64_t heads,
                         std::map<std::string, HostTensor> *hf);
Status fromHuggingFaceBert(const std::map<std::string, HostTensor> &hf, int64_t paddedVocab, int64_t heads,
                           std::map<std::string, HostTensor> *loom);

}  // namespace loom
