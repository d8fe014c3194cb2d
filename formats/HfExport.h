// A whole model as a Hugging Face checkpoint (save_pretrained's layout): MODEL.safetensors in
// GPT2LMHeadModel / LlamaForCausalLM / MixtralForCausalLM names with config.json beside it, or
// the IR's own names for a model the builder did not make. Optionally AdamW's moments beside it
// as optimizer.safetensors ("exp_avg/NAME", "exp_avg_sq/NAME": torch.optim.AdamW's state names,
// under the same Hugging Face parameter names and layouts). Used by --export and loom-ckpt.
#pragma once

#include <map>
#include <string>

#include "formats/HfConfig.h"
#include "protos/plan.pb.h"
#include "runtime/Tensor.h"
#include "support/Status.h"

namespace loom {

struct HfExport {
  HfModelClass cls = HfModelClass::kNone;
  size_t tensors = 0;
  std::string configPath, optimizerPath;  // "" when not written
  std::string className() const;
};

// `facts`: a rank plan's model facts (architecture, sizes, vocabulary); params and (optional)
// the two moments in Loom's names, whole, the vocabulary padding cut.
Status writeHuggingFace(const plan::RankPlan &facts, const std::map<std::string, HostTensor> &params,
                        const std::map<std::string, HostTensor> *adamM, const std::map<std::string, HostTensor> *adamV,
                        const std::string &path, HfExport *out);

// The other way: Hugging Face tensors of the plan's family into Loom's names and global shapes
// (the vocabulary padded to `facts`' padded size).
Status readHuggingFace(const plan::RankPlan &facts, const std::map<std::string, HostTensor> &hf,
                       std::map<std::string, HostTensor> *loom);

}  // namespace loom
