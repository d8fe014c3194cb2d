#include "config/ConfigLoader.h"


#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "support/FileIO.h"

namespace loom {
namespace {

llvm::Error error(const llvm::Twine &msg) {
  return llvm::make_error<llvm::StringError>(msg, llvm::inconvertibleErrorCode());
}

// Collects the first parse error as "path:line:col: error: message" (protobuf's lines and
// columns are 0-based).
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit FirstErrorCollector(std::string path) : path_(std::move(path)) {}
  void AddError(int line, int column, const std::string &message) override {
    if (first_.empty())
      first_ = llvm::formatv("{0}:{1}:{2}: error: {3}", path_, line + 1, column + 1, message).str();
  }
  const std::string &first() const { return first_; }

 private:
  std::string path_;
  std::string first_;
};

llvm::Error parseTextProto(const std::string &path, google::protobuf::Message &msg) {
  std::string text;
  std::string what = "the " + msg.GetDescriptor()->name();
  if (Status s = readWholeFile(path, what.c_str(), &text); !s.isOk())  // "PATH: cannot read ..."
    return error(path + ": error: " + s.message().substr(path.size() + 2));
  FirstErrorCollector errors(path);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &msg))
    return error(errors.first().empty() ? path + ": error: cannot parse " + msg.GetTypeName()
                                        : errors.first());
  return llvm::Error::success();
}

llvm::Error fieldError(const std::string &path, const llvm::Twine &field, const llvm::Twine &what) {
  return error(path + ": error: field '" + field + "' " + what);
}

// Mixture of experts (LLAMA with num_experts > 0).
llvm::Error validateMoe(const config::ModelConfig &m, const std::string &path) {
  if (m.num_experts() < 0) return fieldError(path, "num_experts", llvm::formatv("must be >= 0, got {0}", m.num_experts()));
  if (m.num_experts() == 0) {
    for (auto [name, set] : {std::pair{"num_experts_per_tok", m.num_experts_per_tok() != 0},
                             std::pair{"moe_layer_freq", m.moe_layer_freq() != 0},
                             std::pair{"router_aux_loss_coef", m.router_aux_loss_coef() != 0},
                             std::pair{"capacity_factor", m.capacity_factor() != 0}})
      if (set) return fieldError(path, name, "applies to mixture-of-experts models only (set num_experts)");
    return llvm::Error::success();
  }
  if (m.num_experts_per_tok() < 1 || m.num_experts_per_tok() > m.num_experts())
    return fieldError(path, "num_experts_per_tok",
                      llvm::formatv("(top-k) must be in 1..num_experts = {0}, got {1}", m.num_experts(),
                                    m.num_experts_per_tok()));
  if (m.moe_layer_freq() < 1 || m.moe_layer_freq() > m.num_layers())
    return fieldError(path, "moe_layer_freq",
                      llvm::formatv("must be in 1..num_layers = {0}, got {1}", m.num_layers(), m.moe_layer_freq()));
  if (!(m.router_aux_loss_coef() >= 0))
    return fieldError(path, "router_aux_loss_coef", llvm::formatv("must be >= 0, got {0}", m.router_aux_loss_coef()));
  if (!(m.capacity_factor() >= 0))
    return fieldError(path, "capacity_factor",
                      llvm::formatv("must be >= 0 (0: dropless), got {0}", m.capacity_factor()));
  return llvm::Error::success();
}

}  // namespace

void applyModelDefaults(config::ModelConfig &m) {
  if (m.ffn_hidden_size() == 0) m.set_ffn_hidden_size(4 * m.hidden_size());
  if (m.max_position_embeddings() == 0) m.set_max_position_embeddings(m.seq_length());
  if (m.make_vocab_size_divisible_by() == 0) m.set_make_vocab_size_divisible_by(128);
  if (m.params_dtype() == config::DTYPE_UNSPECIFIED) m.set_params_dtype(config::FP32);
  if (m.layernorm_epsilon() == 0) m.set_layernorm_epsilon(1e-5f);
  if (m.init_method_std() == 0) m.set_init_method_std(0.02f);
  if (m.num_key_value_heads() == 0) m.set_num_key_value_heads(m.num_attention_heads());
  if (m.rope_theta() == 0) m.set_rope_theta(10000.0f);
  if (m.rms_norm_eps() == 0) m.set_rms_norm_eps(1e-5f);
  if (m.num_experts() > 0 && m.num_experts_per_tok() == 0) m.set_num_experts_per_tok(2);
  if (m.num_experts() > 0 && m.moe_layer_freq() == 0) m.set_moe_layer_freq(1);
}

llvm::Error validateModelConfig(const config::ModelConfig &m, const std::string &path) {
  if (m.architecture() == config::ARCHITECTURE_UNSPECIFIED)
    return fieldError(path, "architecture", "must be GPT, BERT or LLAMA");
  struct Positive { const char *name; int64_t value; };
  for (Positive f : {Positive{"num_layers", m.num_layers()}, {"hidden_size", m.hidden_size()},
                     {"num_attention_heads", m.num_attention_heads()},
                     {"ffn_hidden_size", m.ffn_hidden_size()}, {"seq_length", m.seq_length()},
                     {"vocab_size", m.vocab_size()},
                     {"make_vocab_size_divisible_by", m.make_vocab_size_divisible_by()}})
    if (f.value <= 0) return fieldError(path, f.name, llvm::formatv("must be > 0, got {0}", f.value));
  if (m.micro_batch_size() < 0)
    return fieldError(path, "micro_batch_size", llvm::formatv("must be >= 0 (0: dynamic), got {0}", m.micro_batch_size()));
  if (m.hidden_size() % m.num_attention_heads() != 0)
    return fieldError(path, "num_attention_heads",
                      llvm::formatv("({0}) must divide hidden_size ({1})", m.num_attention_heads(),
                                    m.hidden_size()));
  if (m.max_position_embeddings() < m.seq_length())
    return fieldError(path, "max_position_embeddings",
                      llvm::formatv("({0}) must be >= seq_length ({1})",
                                    m.max_position_embeddings(), m.seq_length()));
  for (auto [name, p] : {std::pair{"hidden_dropout", m.hidden_dropout()},
                         std::pair{"attention_dropout", m.attention_dropout()}})
    if (!(p >= 0 && p < 1)) return fieldError(path, name, llvm::formatv("must be in [0, 1), got {0}", p));
  if (!(m.layernorm_epsilon() > 0)) return fieldError(path, "layernorm_epsilon", "must be > 0");
  if (m.architecture() == config::LLAMA) {
    if (m.num_key_value_heads() < 1 || m.num_attention_heads() % m.num_key_value_heads() != 0)
      return fieldError(path, "num_key_value_heads",
                        llvm::formatv("({0}) must divide num_attention_heads ({1})", m.num_key_value_heads(),
                                      m.num_attention_heads()));
    if (!(m.rope_theta() > 0))
      return fieldError(path, "rope_theta", llvm::formatv("must be > 0, got {0}", m.rope_theta()));
    int64_t headDim = m.hidden_size() / m.num_attention_heads();
    if (headDim % 2 != 0)
      return fieldError(path, "num_attention_heads",
                        llvm::formatv("gives an odd head dimension hidden_size / num_attention_heads = {0} / {1} = {2} "
                                      "(rotary embeddings rotate pairs of dimensions)",
                                      m.hidden_size(), m.num_attention_heads(), headDim));
    if (!(m.rms_norm_eps() > 0)) return fieldError(path, "rms_norm_eps", "must be > 0");
    if (llvm::Error e = validateMoe(m, path)) return e;
  } else if (m.num_experts() != 0) {
    return fieldError(path, "num_experts", "applies to architecture LLAMA only (Mixtral-style MoE MLPs)");
  } else if (m.tie_word_embeddings() || m.num_key_value_heads() != m.num_attention_heads()) {
    return fieldError(path, m.tie_word_embeddings() ? "tie_word_embeddings" : "num_key_value_heads",
                      "applies to architecture LLAMA only (GPT and BERT tie their embeddings and use all heads)");
  }
  if (!(m.init_method_std() > 0)) return fieldError(path, "init_method_std", "must be > 0");
  return llvm::Error::success();
}

llvm::Expected<config::ModelConfig> loadModelConfig(const std::string &path) {
  config::ModelConfig m;
  if (llvm::Error e = parseTextProto(path, m)) return std::move(e);
  applyModelDefaults(m);
  if (llvm::Error e = validateModelConfig(m, path)) return std::move(e);
  return m;
}

llvm::Expected<config::DeviceFile> loadDeviceFile(const std::string &path) {
  config::DeviceFile f;
  if (llvm::Error e = parseTextProto(path, f)) return std::move(e);
  const config::Device &d = f.device();
  for (auto [name, v] : {std::pair{"device.peak_flops", d.peak_flops()},
                         std::pair{"device.memory_bandwidth_bytes_per_s", d.memory_bandwidth_bytes_per_s()},
                         std::pair{"device.fp32_peak_flops", d.fp32_peak_flops()},
                         std::pair{"device.bf16_peak_flops", d.bf16_peak_flops()},
                         std::pair{"device.launch_overhead_s", d.launch_overhead_s()},
                         std::pair{"intra_node.bandwidth_bytes_per_s", f.intra_node().bandwidth_bytes_per_s()},
                         std::pair{"inter_node.bandwidth_bytes_per_s", f.inter_node().bandwidth_bytes_per_s()}})
    if (v < 0) return fieldError(path, name, llvm::formatv("must be >= 0, got {0}", v));
  for (auto *points : {&d.gemm_efficiency(), &d.attention_efficiency(), &d.attention_dropout_efficiency()})
    for (const config::EfficiencyPoint &pt : *points)
      if (pt.flops() <= 0 || pt.efficiency() <= 0 || pt.efficiency() > 1)
        return fieldError(path, "device.gemm_efficiency",
                          llvm::formatv("points need flops > 0 and 0 < efficiency <= 1, got ({0}, {1})", pt.flops(),
                                        pt.efficiency()));
  for (const config::OpRate &r : d.op_rates())
    if (r.op().empty() || r.bytes_per_s() <= 0 || r.overhead_s() < 0)
      return fieldError(path, "device.op_rates",
                        llvm::formatv("'{0}': needs an op, bytes_per_s > 0 and overhead_s >= 0", r.op()));
  return f;
}

llvm::Expected<config::ClusterSpec> loadClusterSpec(const std::string &path) {
  config::ClusterSpec c;
  if (llvm::Error e = parseTextProto(path, c)) return std::move(e);
  if (!c.device_file().empty()) {  // the file's fields under the spec's own
    llvm::SmallString<256> file(c.device_file());
    if (!llvm::sys::path::is_absolute(file)) {
      file = llvm::sys::path::parent_path(path);
      llvm::sys::path::append(file, c.device_file());
    }
    llvm::Expected<config::DeviceFile> device = loadDeviceFile(std::string(file));
    if (!device) return fieldError(path, "device_file", "names a device file that fails: " + llvm::toString(device.takeError()));
    config::Device merged = device->device();
    merged.MergeFrom(c.device());
    *c.mutable_device() = merged;
    if (!c.has_intra_node()) *c.mutable_intra_node() = device->intra_node();
    if (!c.has_inter_node()) *c.mutable_inter_node() = device->inter_node();
  }
  if (llvm::Error e = finishClusterSpec(c, path)) return std::move(e);
  return c;
}

llvm::Error finishClusterSpec(config::ClusterSpec &c, const std::string &path) {
  if (c.nodes() <= 0) return fieldError(path, "nodes", llvm::formatv("must be > 0, got {0}", c.nodes()));
  if (c.devices_per_node() <= 0)
    return fieldError(path, "devices_per_node", llvm::formatv("must be > 0, got {0}", c.devices_per_node()));
  if (c.device().kind() == config::DEVICE_KIND_UNSPECIFIED)
    return fieldError(path, "device.kind", "must be CPU or CUDA");
  config::ParallelConfig &p = *c.mutable_parallel();
  int64_t world = c.nodes() * c.devices_per_node();
  if (p.tensor_parallel_size() == 0) p.set_tensor_parallel_size(1);
  if (p.pipeline_parallel_size() == 0) p.set_pipeline_parallel_size(1);
  if (p.virtual_pipeline_size() == 0) p.set_virtual_pipeline_size(1);
  if (p.micro_batch_size() == 0) p.set_micro_batch_size(1);
  if (p.context_parallel_size() == 0) p.set_context_parallel_size(1);
  if (p.dp_bucket_size_bytes() == 0) p.set_dp_bucket_size_bytes(25 * 1000 * 1000);
  for (auto [name, v] : {std::pair{"parallel.tensor_parallel_size", p.tensor_parallel_size()},
                         std::pair{"parallel.pipeline_parallel_size", p.pipeline_parallel_size()},
                         std::pair{"parallel.virtual_pipeline_size", p.virtual_pipeline_size()},
                         std::pair{"parallel.micro_batch_size", p.micro_batch_size()},
                         std::pair{"parallel.data_parallel_size", p.data_parallel_size()},
                         std::pair{"parallel.context_parallel_size", p.context_parallel_size()},
                         std::pair{"parallel.global_batch_size", p.global_batch_size()}})
    if (v < 0) return fieldError(path, name, llvm::formatv("must be >= 0, got {0}", v));
  int64_t cp = p.context_parallel_size();
  int64_t tp = p.tensor_parallel_size() * p.pipeline_parallel_size() * cp;
  // "t * p" or, with context parallelism, "t * p * c", and their values.
  std::string names = cp > 1 ? "t * p * c" : "t * p";
  std::string values = llvm::formatv("{0} * {1}", p.tensor_parallel_size(), p.pipeline_parallel_size()).str() +
                       (cp > 1 ? " * " + std::to_string(cp) : "");
  if (p.data_parallel_size() == 0) {
    if (world % tp != 0)
      return fieldError(path, "parallel",
                        llvm::formatv("{0} = {1} = {2} does not divide the world size {3} "
                                      "(nodes {4} * devices_per_node {5})",
                                      names, values, tp, world, c.nodes(), c.devices_per_node()));
    p.set_data_parallel_size(world / tp);
  }
  if (tp * p.data_parallel_size() != world)
    return fieldError(path, "parallel",
                      llvm::formatv("{0} * d = {1} * {2} = {3} but the world size is {4} "
                                    "(nodes {5} * devices_per_node {6})",
                                    names, values, p.data_parallel_size(), tp * p.data_parallel_size(), world,
                                    c.nodes(), c.devices_per_node()));
  if (!p.cp_comm_type().empty() && p.cp_comm_type() != "p2p" && p.cp_comm_type() != "all_gather")
    return fieldError(path, "parallel.cp_comm_type",
                      llvm::formatv("must be \"p2p\" (the ring) or \"all_gather\", got \"{0}\"", p.cp_comm_type()));
  if (p.expert_parallel_size() == 0) p.set_expert_parallel_size(1);
  if (p.expert_parallel_size() < 0 || p.data_parallel_size() % p.expert_parallel_size() != 0)
    return fieldError(path, "parallel.expert_parallel_size",
                      llvm::formatv("({0}) must divide data_parallel_size ({1}): the ep groups are carved out of the "
                                    "data-parallel ranks",
                                    p.expert_parallel_size(), p.data_parallel_size()));
  if (cp > 1 && c.device().kind() == config::CUDA)
    return fieldError(path, "parallel.context_parallel_size",
                      "context parallelism runs on the CPU backend only so far (its CUDA kernels are not written); "
                      "set it to 1 for a CUDA cluster");
  int64_t perStep = p.micro_batch_size() * p.data_parallel_size();
  if (p.global_batch_size() == 0) p.set_global_batch_size(perStep);
  if (p.global_batch_size() % perStep != 0)
    return fieldError(path, "parallel.global_batch_size",
                      llvm::formatv("({0}) must be a multiple of micro_batch_size * d = {1} * {2}",
                                    p.global_batch_size(), p.micro_batch_size(),
                                    p.data_parallel_size()));
  if (p.recompute() == config::RECOMPUTE_SELECTIVE)
    return fieldError(path, "parallel.recompute",
                      "RECOMPUTE_SELECTIVE would change nothing: Loom's attention backward always recomputes the "
                      "softmax probabilities (they are never stored), which is what selective recomputation saves; "
                      "use RECOMPUTE_NONE, or RECOMPUTE_FULL to recompute whole layers");
  if (p.schedule() == config::INTERLEAVED_ONE_F_ONE_B && p.virtual_pipeline_size() < 2)
    return fieldError(path, "parallel.schedule",
                      "INTERLEAVED_ONE_F_ONE_B needs virtual_pipeline_size >= 2");
  for (int64_t n : p.layers_per_stage())
    if (n < 1) return fieldError(path, "parallel.layers_per_stage", llvm::formatv("every stage needs a layer, got {0}", n));
  if (p.layers_per_stage_size() > 0 && p.balance_stages())
    return fieldError(path, "parallel.balance_stages", "give layers_per_stage or balance_stages, not both");
  if (p.virtual_pipeline_size() > 1 && p.pipeline_parallel_size() < 2)
    return fieldError(path, "parallel.virtual_pipeline_size",
                      "virtual chunks need pipeline_parallel_size >= 2");
  return llvm::Error::success();
}

llvm::Error checkModelFitsCluster(const config::ModelConfig &m, const config::ClusterSpec &c,
                                  const std::string &clusterPath) {
  const config::ParallelConfig &p = c.parallel();
  int64_t t = p.tensor_parallel_size();
  if (m.num_attention_heads() % t != 0)
    return fieldError(clusterPath, "parallel.tensor_parallel_size",
                      llvm::formatv("t = {0} does not divide num_attention_heads = {1} of model '{2}'",
                                    t, m.num_attention_heads(), m.name()));
  if (m.architecture() == config::LLAMA && m.num_key_value_heads() % t != 0 && t % m.num_key_value_heads() != 0)
    return fieldError(clusterPath, "parallel.tensor_parallel_size",
                      llvm::formatv("t = {0} neither divides num_key_value_heads = {1} of model '{2}' nor is a "
                                    "multiple of it",
                                    t, m.num_key_value_heads(), m.name()));
  if (m.ffn_hidden_size() % t != 0)
    return fieldError(clusterPath, "parallel.tensor_parallel_size",
                      llvm::formatv("t = {0} does not divide ffn_hidden_size = {1} of model '{2}'", t,
                                    m.ffn_hidden_size(), m.name()));
  int64_t cp = std::max<int64_t>(1, p.context_parallel_size());
  if (cp > 1 && m.seq_length() % (2 * cp) != 0)
    return fieldError(clusterPath, "parallel.context_parallel_size",
                      llvm::formatv("2 * c = {0} does not divide seq_length = {1} of model '{2}' (context parallelism "
                                    "cuts the sequence into 2c equal chunks); pick c dividing {3}",
                                    2 * cp, m.seq_length(), m.name(), m.seq_length() / 2));
  if (cp > 1 && m.architecture() == config::BERT)
    return fieldError(clusterPath, "parallel.context_parallel_size",
                      llvm::formatv("context parallelism is not supported for model '{0}' (BERT: its attention masks "
                                    "padded keys, which the chunked attention does not take); set it to 1",
                                    m.name()));
  if (p.sequence_parallel() && (m.seq_length() / cp) % t != 0)
    return fieldError(clusterPath, "parallel.sequence_parallel",
                      cp > 1 ? llvm::formatv("t = {0} does not divide seq_length / c = {1} / {2}", t, m.seq_length(), cp).str()
                             : llvm::formatv("t = {0} does not divide seq_length = {1}", t, m.seq_length()).str());
  int64_t ep = std::max<int64_t>(1, p.expert_parallel_size());
  if (ep > 1 && m.num_experts() == 0)
    return fieldError(clusterPath, "parallel.expert_parallel_size",
                      llvm::formatv("model '{0}' has no mixture-of-experts layers to split; set it to 1", m.name()));
  if (ep > 1 && m.num_experts() % ep != 0)
    return fieldError(clusterPath, "parallel.expert_parallel_size",
                      llvm::formatv("({0}) does not divide num_experts = {1} of model '{2}'", ep, m.num_experts(),
                                    m.name()));
  if (m.num_experts() > 0 && p.sequence_parallel() && t > 1 && m.capacity_factor() > 0)
    return fieldError(clusterPath, "parallel.sequence_parallel",
                      llvm::formatv("model '{0}' has capacity_factor {1}: an expert's capacity counts the whole "
                                    "sequence's assignments, which sequence parallelism splits over the tp ranks; use "
                                    "capacity_factor 0 (dropless) or sequence_parallel false",
                                    m.name(), m.capacity_factor()));
  if (m.num_experts() > 0) {
    // What the MoE layers do not run with yet: one line naming the field to change.
    const char *field = cp > 1 ? "parallel.context_parallel_size"
                        : c.device().kind() == config::CUDA ? "device.kind"
                                                            : nullptr;
    if (field)
      return fieldError(clusterPath, field,
                        llvm::formatv("model '{0}' has mixture-of-experts layers, which run so far on the CPU backend, "
                                      "without context parallelism",
                                      m.name()));
  }
  int64_t chunks = p.pipeline_parallel_size() * p.virtual_pipeline_size();
  if (p.layers_per_stage_size() > 0) {
    int64_t sum = 0;
    for (int64_t n : p.layers_per_stage()) sum += n;
    if (p.layers_per_stage_size() != chunks)
      return fieldError(clusterPath, "parallel.layers_per_stage",
                        llvm::formatv("has {0} entries but p * v = {1}", p.layers_per_stage_size(), chunks));
    if (sum != m.num_layers())
      return fieldError(clusterPath, "parallel.layers_per_stage",
                        llvm::formatv("sums to {0} layers but model '{1}' has {2}", sum, m.name(), m.num_layers()));
    return llvm::Error::success();
  }
  if (p.balance_stages()) {
    if (m.num_layers() < chunks)
      return fieldError(clusterPath, "parallel.balance_stages",
                        llvm::formatv("p * v = {0} stages need at least as many layers; model '{1}' has {2}", chunks,
                                      m.name(), m.num_layers()));
    return llvm::Error::success();
  }
  if (m.num_layers() % chunks != 0)
    return fieldError(clusterPath, "parallel.pipeline_parallel_size",
                      llvm::formatv("p * v = {0} * {1} = {2} does not divide num_layers = {3}",
                                    p.pipeline_parallel_size(), p.virtual_pipeline_size(), chunks,
                                    m.num_layers()));
  return llvm::Error::success();
}

int64_t paddedVocabSize(const config::ModelConfig &m, int64_t tensorParallel) {
  int64_t multiple = m.make_vocab_size_divisible_by() * tensorParallel;
  return (m.vocab_size() + multiple - 1) / multiple * multiple;
}

}  // namespace loom
