// Loom's LLaMA parameters and the Hugging Face LlamaForCausalLM layout. Loom's builder already
// uses Hugging Face's names (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight,
// ..., lm_head.weight) and nn.Linear's [out, in] layout, and implements rotary embeddings in
// the rotate-half convention of Hugging Face's modeling code, so the weights map one to one;
// only the vocabulary padding differs (Loom pads the embedding and lm_head rows).
#pragma once

#include <map>
#include <string>

#include "support/Status.h"
#include "runtime/Tensor.h"

namespace loom {

// Hugging Face tensors -> Loom's global parameters: embed_tokens and lm_head padded to
// `paddedVocab` rows with zeros; rotary inv_freq buffers skipped; with tied embeddings a stored
// lm_head.weight is skipped (the model reads embed_tokens).
Status fromHuggingFaceLlama(const std::map<std::string, HostTensor> &hf, int64_t paddedVocab, bool tiedEmbeddings,
                            std::map<std::string, HostTensor> *loom);

}  // namespace loom
