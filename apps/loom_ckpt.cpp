// loom-ckpt: a person's view of Loom's layout-independent checkpoints, and their conversion to
// and from Hugging Face checkpoints.
//   loom-ckpt inspect SAVE_DIR [--iteration N] [--json]
//   loom-ckpt convert SAVE_DIR --to-hf OUT/model.safetensors [--iteration N] [--keep-optimizer]
//   loom-ckpt convert HF/model.safetensors --from-hf --model CONFIG.pbtxt --out SAVE_DIR
//             [--optimizer HF/optimizer.safetensors]
// To Hugging Face: the weights in the model class's names with config.json beside them, and with
// --keep-optimizer AdamW's moments as optimizer.safetensors, else dropped. From Hugging Face:
// a checkpoint at iteration 0 that `loom-rank --resume` starts from in any layout, its moments
// from --optimizer or zero.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "config/ConfigLoader.h"
#include "formats/Checkpoint.h"
#include "formats/HfExport.h"
#include "formats/Safetensors.h"
#include "google/protobuf/text_format.h"
#include "support/Checksum.h"
#include "support/CommandLine.h"

namespace cl = llvm::cl;

namespace {

cl::OptionCategory category("loom-ckpt options");
cl::list<std::string> positional(cl::Positional, cl::desc("inspect SAVE_DIR | convert INPUT"), cl::OneOrMore,
                                 cl::cat(category));
cl::opt<int64_t> iterationOpt("iteration", cl::desc("the checkpoint's iteration (default: the latest)"), cl::init(-1),
                              cl::cat(category));
cl::opt<bool> jsonOpt("json", cl::desc("inspect: the tensors, pieces and state as JSON"), cl::cat(category));
cl::opt<std::string> toHf("to-hf", cl::desc("convert: write the weights as a Hugging Face MODEL.safetensors"),
                          cl::value_desc("MODEL.safetensors"), cl::cat(category));
cl::opt<bool> fromHf("from-hf", cl::desc("convert: the input is a Hugging Face model.safetensors"), cl::cat(category));
cl::opt<bool> keepOptimizer("keep-optimizer",
                            cl::desc("--to-hf: also write AdamW's moments (optimizer.safetensors beside the model; "
                                     "without it they are dropped)"),
                            cl::cat(category));
cl::opt<std::string> optimizerOpt("optimizer",
                                  cl::desc("--from-hf: AdamW's moments from this optimizer.safetensors (default: zero)"),
                                  cl::value_desc("FILE"), cl::cat(category));
cl::opt<std::string> modelOpt("model", cl::desc("--from-hf: the model config the weights belong to"),
                              cl::value_desc("CONFIG.pbtxt"), cl::cat(category));
cl::opt<std::string> outOpt("out", cl::desc("--from-hf: the checkpoint directory to write (a --save directory)"),
                            cl::value_desc("SAVE_DIR"), cl::cat(category));

const char *kOverview =
    "loom-ckpt: inspect a layout-independent checkpoint, or convert it to or from Hugging Face.\n"
    "  loom-ckpt inspect SAVE_DIR [--iteration N] [--json]\n"
    "  loom-ckpt convert SAVE_DIR --to-hf OUT/model.safetensors [--iteration N] [--keep-optimizer]\n"
    "  loom-ckpt convert HF/model.safetensors --from-hf --model CONFIG.pbtxt --out SAVE_DIR [--optimizer FILE]\n";

int fail(const std::string &message) {
  std::fprintf(stderr, "loom-ckpt: error: %s\n", message.c_str());
  return 1;
}

// The checkpoint to read: --iteration, else the one `latest` names.
loom::Status chosenIteration(const std::string &root, int64_t *iteration) {
  if (iterationOpt >= 0) {
    *iteration = iterationOpt;
    return loom::Status::ok();
  }
  LOOM_RETURN_IF_ERROR(loom::latestIteration(root, iteration));
  if (*iteration < 0) return loom::Status::error(root + ": no checkpoint (no latest_checkpointed_iteration.txt)");
  return loom::Status::ok();
}

// The chosen checkpoint's iteration and its metadata, checked against its manifest.
loom::Status openCheckpoint(const std::string &root, int64_t *iteration, loom::CheckpointIndex *index) {
  LOOM_RETURN_IF_ERROR(chosenIteration(root, iteration));
  return loom::readVerifiedCheckpointIndex(root, *iteration, index);
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s.empty() ? "scalar" : s;
}

int inspect(const std::string &root) {
  int64_t it;
  loom::CheckpointIndex index;
  if (loom::Status s = openCheckpoint(root, &it, &index); !s.isOk()) return fail(s.message());
  std::string dir = loom::resolvedCheckpointDir(root, it);
  int64_t values = 0, pieces = 0, bytes = 0;
  for (const auto &[name, t] : index.tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    values += n, pieces += int64_t(t.pieces.size());
  }
  for (const auto &[file, size] : index.fileBytes) bytes += size;
  if (jsonOpt) {
    nlohmann::ordered_json out = {{"directory", dir},     {"iteration", it},        {"world_size", index.worldSize},
                                  {"state", index.state}, {"values", values},       {"pieces", pieces},
                                  {"file_bytes", bytes},  {"tensors", nlohmann::json::object()}};
    for (const auto &[name, t] : index.tensors) {
      nlohmann::json list = nlohmann::json::array();
      for (const loom::CheckpointIndex::Piece &p : t.pieces)
        list.push_back({{"file", p.file}, {"key", p.key}, {"block", loom::encodePiece(p.piece)}, {"xxh3", p.xxh3}});
      out["tensors"][name] = {{"shape", t.shape}, {"pieces", list}};
    }
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }
  auto state = [&](const char *key) {
    auto f = index.state.find(key);
    return f == index.state.end() ? std::string("?") : f->second;
  };
  std::printf("checkpoint %s (%s): iteration %lld, written by %d ranks in layout (t,p,d,v) = (%s), model '%s' (%s)\n",
              dir.c_str(), loom::kCheckpointFormat, (long long)it, index.worldSize, state("layout").c_str(),
              state("model").c_str(), state("architecture").c_str());
  std::printf("training state: consumed samples %s, global batch %s, learning rate %s (max %s, min %s, warm-up %s, "
              "decay %s iterations), skipped steps %s%s\n",
              state("consumed_samples").c_str(), state("global_batch_size").c_str(), state("learning_rate").c_str(),
              state("lr").c_str(), state("min_lr").c_str(), state("warmup_iters").c_str(), state("decay_iters").c_str(),
              state("skipped_steps").c_str(),
              index.state.count("fp16_loss_scale") ? (", fp16 loss scale " + state("fp16_loss_scale")).c_str() : "");
  std::printf("%zu tensors, %lld values (fp32), %lld pieces in %d files of %.1f MiB\n", index.tensors.size(),
              (long long)values, (long long)pieces, index.worldSize, double(bytes) / (1 << 20));
  for (const auto &[name, t] : index.tensors) {
    std::map<std::string, int> perFile;
    for (const loom::CheckpointIndex::Piece &p : t.pieces) ++perFile[p.file];
    std::string files;
    for (const auto &[file, n] : perFile) files += (files.empty() ? "" : " ") + std::to_string(std::stoi(file.substr(5, 5)));
    std::printf("  %-60s %-14s %3zu piece%s (ranks %s)\n", name.c_str(), shapeText(t.shape).c_str(), t.pieces.size(),
                t.pieces.size() == 1 ? " " : "s", files.c_str());
  }
  return 0;
}

int toHuggingFace(const std::string &root) {
  int64_t it;
  loom::CheckpointIndex index;
  if (loom::Status s = openCheckpoint(root, &it, &index); !s.isOk()) return fail(s.message());
  loom::plan::RankPlan facts;
  auto text = index.state.find("model_facts");
  if (text == index.state.end() || !google::protobuf::TextFormat::ParseFromString(text->second, &facts))
    return fail(loom::resolvedCheckpointDir(root, it) + "/metadata.json: no readable model_facts in its state");
  std::map<std::string, loom::HostTensor> params, m, v;
  loom::Status s = loom::readWholeTensors(root, it, "param/", &params);
  bool keep = keepOptimizer;
  std::filesystem::path parent = std::filesystem::path(std::string(toHf)).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return fail(parent.string() + ": cannot create: " + ec.message());
  if (s.isOk() && keep) s = loom::readWholeTensors(root, it, "adam_m/", &m);
  if (s.isOk() && keep) s = loom::readWholeTensors(root, it, "adam_v/", &v);
  loom::HfExport written;
  if (s.isOk()) s = loom::writeHuggingFace(facts, params, keep ? &m : nullptr, keep ? &v : nullptr, toHf, &written);
  if (!s.isOk()) return fail(s.message());
  std::printf("wrote %zu tensors (%s) of iteration %lld to %s%s%s\n", written.tensors, written.className().c_str(),
              (long long)it, toHf.c_str(), written.configPath.empty() ? "" : (", " + written.configPath).c_str(),
              keep ? (", AdamW's moments to " + written.optimizerPath).c_str() : " (AdamW's moments dropped)");
  return 0;
}

// One whole-tensor piece of each tensor into rank 0's file of a one-rank checkpoint.
void addWhole(loom::SafetensorsFile *f, const std::string &tensor, const loom::HostTensor &t) {
  loom::TensorPiece piece = loom::shardPiece(t.shape, -1, 1, 0);
  f->metadata["piece:" + tensor] =
      loom::pieceFact(tensor, t.shape, loom::encodePiece(piece),
                      loom::checksumHex(loom::checksum64(t.data.data(), t.data.size() * sizeof(float))));
  f->tensors[tensor] = loom::HostTensor{{t.numel()}};
  f->tensors[tensor].data = t.data;
}

int fromHuggingFace(const std::string &input) {
  if (!modelOpt.getNumOccurrences() || !outOpt.getNumOccurrences())
    return fail("--from-hf needs --model CONFIG.pbtxt and --out SAVE_DIR");
  llvm::Expected<loom::config::ModelConfig> model = loom::loadModelConfig(modelOpt);
  if (!model) return fail(llvm::toString(model.takeError()));
  if (model->architecture() != loom::config::GPT && model->architecture() != loom::config::LLAMA)
    return fail(modelOpt + ": Hugging Face conversion covers GPT and LLaMA (and Mixtral) models");
  // The model facts a compiled plan would hold (the compiler reads them from the IR the config
  // builds): for the conversion and for the checkpoint's state.
  const loom::config::ModelConfig &c = *model;
  bool gpt = c.architecture() == loom::config::GPT;
  loom::plan::RankPlan facts;
  facts.set_model(c.name());
  facts.set_architecture(gpt ? "gpt" : "llama");
  facts.set_vocab_size(c.vocab_size()), facts.set_padded_vocab_size(c.vocab_size());  // no padding
  facts.set_num_layers(c.num_layers()), facts.set_hidden_size(c.hidden_size());
  facts.set_num_attention_heads(c.num_attention_heads());
  facts.set_num_key_value_heads(c.num_key_value_heads() ? c.num_key_value_heads() : c.num_attention_heads());
  facts.set_ffn_hidden_size(c.ffn_hidden_size()), facts.set_seq_length(c.seq_length());
  facts.set_max_position_embeddings(gpt ? (c.max_position_embeddings() ? c.max_position_embeddings() : c.seq_length()) : 0);
  facts.set_norm_epsilon(gpt ? c.layernorm_epsilon() : c.rms_norm_eps());
  facts.set_rope_theta(gpt ? 0.0 : c.rope_theta());
  facts.set_tie_word_embeddings(gpt || c.tie_word_embeddings());
  facts.set_num_experts(int32_t(c.num_experts())), facts.set_num_experts_per_tok(int32_t(c.num_experts_per_tok()));
  facts.set_moe_layer_freq(int32_t(c.moe_layer_freq())), facts.set_router_aux_loss_coef(c.router_aux_loss_coef());
  facts.set_capacity_factor(c.capacity_factor());
  loom::SafetensorsFile hf;
  std::map<std::string, loom::HostTensor> params, m, v;
  loom::Status s = loom::readSafetensors(input, &hf);
  if (s.isOk()) s = loom::readHuggingFace(facts, hf.tensors, &params);
  if (!s.isOk()) return fail(input + ": " + s.message());
  if (!optimizerOpt.empty()) {
    loom::SafetensorsFile opt;
    std::map<std::string, loom::HostTensor> hm, hv;
    s = loom::readSafetensors(optimizerOpt, &opt);
    for (auto &[key, t] : opt.tensors) {
      if (key.rfind("exp_avg_sq/", 0) == 0)
        hv[key.substr(11)] = t;
      else if (key.rfind("exp_avg/", 0) == 0)
        hm[key.substr(8)] = t;
      else if (s.isOk())
        s = loom::Status::error("tensor '" + key + "' is neither exp_avg/NAME nor exp_avg_sq/NAME");
    }
    if (s.isOk()) s = loom::readHuggingFace(facts, hm, &m);
    if (s.isOk()) s = loom::readHuggingFace(facts, hv, &v);
    if (!s.isOk()) return fail(optimizerOpt + ": " + s.message());
  }
  loom::SafetensorsFile file;
  file.metadata = {{"iteration", "0"}, {"rank", "0"}, {"world_size", "1"}, {"model", model->name()}};
  for (const auto &[name, t] : params) {
    addWhole(&file, "param/" + name, t);
    for (auto [prefix, moments] : {std::pair{"adam_m/", &m}, std::pair{"adam_v/", &v}}) {
      auto found = moments->find(name);
      if (!optimizerOpt.empty() && found == moments->end())
        return fail(optimizerOpt + ": no moments of '" + name + "'");
      loom::HostTensor zeros{t.shape};
      zeros.data.assign(t.data.size(), 0.0f);
      addWhole(&file, prefix + name, found == moments->end() ? zeros : found->second);
    }
  }
  std::string root = outOpt, partial = loom::checkpointDir(root, 0, true);
  std::error_code ec;
  std::filesystem::create_directories(partial, ec);
  if (ec) return fail(partial + ": cannot create: " + ec.message());
  std::string facts_;
  google::protobuf::TextFormat::PrintToString(facts, &facts_);
  std::map<std::string, std::string> state = {
      {"iteration", "0"},         {"model", model->name()}, {"architecture", facts.architecture()},
      {"layout", "Hugging Face"}, {"consumed_samples", "0"}, {"skipped_steps", "0"},
      {"model_facts", facts_}};
  s = loom::writeSafetensors(loom::checkpointFile(partial, 0), file);
  if (s.isOk()) s = loom::publishCheckpoint(root, 0, 1, state);
  if (!s.isOk()) return fail(s.message());
  std::printf("wrote %zu parameters of '%s' from %s as a checkpoint at iteration 0 in %s (AdamW's moments %s)\n",
              params.size(), model->name().c_str(), input.c_str(), root.c_str(),
              optimizerOpt.empty() ? "zero" : ("from " + optimizerOpt).c_str());
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv, kOverview, {&category})) return 2;
  auto usage = [](const std::string &why) {
    std::fprintf(stderr, "loom-ckpt: error: %s (see --help)\n", why.c_str());
    return 2;
  };
  if (positional.size() != 2) return usage("expected a command and one path: inspect SAVE_DIR | convert INPUT");
  const std::string &command = positional[0], &input = positional[1];
  if (command == "inspect") return inspect(input);
  if (command != "convert") return usage("unknown command '" + command + "' (inspect or convert)");
  bool to = toHf.getNumOccurrences() > 0;
  if (bool(fromHf) == to) return usage("convert needs exactly one of --to-hf FILE and --from-hf");
  if (to && (optimizerOpt.getNumOccurrences() || modelOpt.getNumOccurrences() || outOpt.getNumOccurrences()))
    return usage("--optimizer, --model and --out are --from-hf's");
  if (fromHf && (keepOptimizer || iterationOpt.getNumOccurrences())) return usage("--keep-optimizer and --iteration are --to-hf's");
  return fromHf ? fromHuggingFace(input) : toHuggingFace(input);
}
