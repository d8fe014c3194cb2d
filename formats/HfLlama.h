// Loom's LLaMA parameters and the Hugging Face LlamaForCausalLM layout. Loom's builder already
// uses Hugging Face's names (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight,
// ..., lm_head.weight) and nn.Linear's [out, in] layout, and implements rotary embeddings in
// the rotate-half convention of Hugging Face's modeling code, so the weights map one to one;
// only the vocabulary padding differs (Loom pads the embedding and lm_head rows), and a Mixtral's
// experts, which Loom stacks per layer.
#pragma once

#include <map>
#include <string>

#include "support/Status.h"
#include "runtime/Tensor.h"

namespace loom {

// Hugging Face tensors -> Loom's global parameters: embed_tokens and lm_head padded to
// `paddedVocab` rows with zeros; rotary inv_freq buffers skipped; with tied embeddings a stored
// lm_head.weight is skipped (the model reads embed_tokens).
// Mixtral (MixtralForCausalLM) too: each MoE layer's per-expert w1, w2, w3
// (model.layers.N.block_sparse_moe.experts.E.wK.weight) are stacked into Loom's
// model.layers.N.block_sparse_moe.experts.wK.weight [experts, out, in]; a missing or
// mis-shaped expert is an error naming it.
Status fromHuggingFaceLlama(const std::map<std::string, HostTensor> &hf, int64_t paddedVocab, bool tiedEmbeddings,
                            std::map<std::string, HostTensor> *loom);

// Loom's LLaMA-family parameters (vocabulary padding already cut) in Hugging Face's names: a
// Mixtral's stacked experts split into MixtralForCausalLM's per-expert tensors; the rest as
// they are.
std::map<std::string, HostTensor> toHuggingFaceLlama(std::map<std::string, HostTensor> loom);

}  // namespace loom
