// Builder parameter counts and FLOPs for every example config, against closed forms written
// here independently of the builder (and against published numbers where they exist).
#include <gtest/gtest.h>

#include "config/ConfigLoader.h"
#include "compiler/ModelBuilder.h"
#include "compiler/ModelStats.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "passes/Passes.h"

namespace loom {
namespace {

config::ModelConfig load(const std::string &name) {
  auto cfg = loadModelConfig("examples/models/" + name + ".pbtxt");
  if (!cfg) {
    ADD_FAILURE() << llvm::toString(cfg.takeError());
    return {};
  }
  return *cfg;
}

// GPT: word + position embeddings, per layer 4h^2 + 4h (attention) + 2 h f + f + h (MLP)
// + 4h (two layer norms), final layer norm 2h; the output embedding is tied.
int64_t gptParameters(const config::ModelConfig &m, int64_t vocab) {
  int64_t h = m.hidden_size(), f = m.ffn_hidden_size(), l = m.num_layers();
  int64_t layer = (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h;
  return vocab * h + m.max_position_embeddings() * h + l * layer + 2 * h;
}

// BERT: the same trunk plus segment embeddings 2h, the masked-LM head (dense h*h + h, layer
// norm 2h, output bias V) and the sentence-order head (pooler h*h + h, classifier 2h + 2).
int64_t bertParameters(const config::ModelConfig &m, int64_t vocab) {
  int64_t h = m.hidden_size();
  return gptParameters(m, vocab) + 2 * h + (h * h + h + 2 * h + vocab) + (h * h + h + 2 * h + 2);
}

// LLaMA: embedding V h (+ V h untied output), per layer q and o h^2 each, k and v h * kv * hd
// each, gate, up and down 3 h f, two RMSNorm weights 2h; the final RMSNorm h. No biases.
int64_t llamaParameters(const config::ModelConfig &m, int64_t vocab) {
  int64_t h = m.hidden_size(), f = m.ffn_hidden_size(), l = m.num_layers();
  int64_t kv = m.num_key_value_heads() * (h / m.num_attention_heads());
  int64_t layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h;
  return vocab * h * (m.tie_word_embeddings() ? 1 : 2) + l * layer + h;
}

int64_t closedFormParameters(const config::ModelConfig &m, int64_t vocab) {
  switch (m.architecture()) {
    case config::BERT: return bertParameters(m, vocab);
    case config::LLAMA: return llamaParameters(m, vocab);
    default: return gptParameters(m, vocab);
  }
}

struct Case {
  const char *name;
  int64_t publishedParameters;  // 0 where no exact published figure exists
};

class ExampleModels : public ::testing::TestWithParam<Case> {};

// The built IR has the tokenizer's vocabulary; loom-pad-vocab pads it as loomc compile does
// for t (to a multiple of 128 t), adding only padding rows.
TEST_P(ExampleModels, ParameterCountsMatchClosedForm) {
  config::ModelConfig cfg = load(GetParam().name);
  int64_t unpadded = closedFormParameters(cfg, cfg.vocab_size());
  mlir::MLIRContext ctx;
  {
    mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(ctx, cfg, {});
    ASSERT_TRUE(succeeded(mlir::verify(*module))) << GetParam().name;
    ModelStats stats = computeModelStats(*module);
    EXPECT_EQ(stats.parameters, unpadded) << GetParam().name;
    EXPECT_EQ(stats.vocabPaddingParameters, 0);
    if (GetParam().publishedParameters) EXPECT_EQ(stats.parameters, GetParam().publishedParameters);
  }
  for (int64_t t : {1, 2, 4, 8}) {
    mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(ctx, cfg, {});
    auto pm = mlir::PassManager::on<mlir::ModuleOp>(&ctx);
    pm.addPass(createLoomPadVocab(LoomPadVocabOptions{.multiple = 128 * t}));
    ASSERT_TRUE(succeeded(pm.run(*module)));
    ModelStats stats = computeModelStats(*module);
    int64_t padded = paddedVocabSize(cfg, t);
    EXPECT_EQ(padded % (128 * t), 0);
    EXPECT_GE(padded, cfg.vocab_size());
    EXPECT_LT(padded - cfg.vocab_size(), 128 * t);
    EXPECT_EQ(stats.parameters, closedFormParameters(cfg, padded)) << GetParam().name << " t=" << t;
    EXPECT_EQ(stats.parametersWithoutPadding(), unpadded) << GetParam().name << " t=" << t;
  }
}

// FLOPs from the IR (the vocabulary it computes) equal the PTD-P closed form.
TEST_P(ExampleModels, FlopsMatchPtdpFormula) {
  config::ModelConfig cfg = load(GetParam().name);
  if (cfg.architecture() != config::GPT) GTEST_SKIP() << "the PTD-P formula is for GPT models";
  mlir::MLIRContext ctx;
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(ctx, cfg, {});
  ModelStats stats = computeModelStats(*module);
  int64_t V = cfg.vocab_size();
  double formula = ptdpFlopsPerToken(cfg.num_layers(), cfg.hidden_size(), cfg.seq_length(), V);
  EXPECT_NEAR(stats.trainingFlopsPerTokenFullRecompute() / formula, 1.0, 1e-12);
  // Forward only: 24 l h^2 (1 + s / 6h) + 2 h V per token.
  double h = cfg.hidden_size(), l = cfg.num_layers(), s = cfg.seq_length();
  EXPECT_NEAR(stats.forwardFlopsPerToken() / (24 * l * h * h * (1 + s / (6 * h)) + 2 * h * V), 1.0, 1e-12);
}

// BERT: the layers, the masked-LM head (dense h x h and the tied decoder) at every position,
// and the sentence-order head (pooler h x h, classifier h x 2) once per sample: its loss reads
// the [CLS] position only, though the IR computes it everywhere.
TEST_P(ExampleModels, BertCountsTheSentenceHeadOncePerSample) {
  config::ModelConfig cfg = load(GetParam().name);
  if (cfg.architecture() != config::BERT) GTEST_SKIP() << "a BERT count";
  mlir::MLIRContext ctx;
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(ctx, cfg, {});
  ModelStats stats = computeModelStats(*module);
  double h = cfg.hidden_size(), l = cfg.num_layers(), s = cfg.seq_length(), V = cfg.vocab_size();
  double perToken = 24 * l * h * h * (1 + s / (6 * h)) + 2 * h * h + 2 * h * V + (2 * h * h + 2 * h * 2) / s;
  EXPECT_NEAR(stats.forwardFlopsPerToken() / perToken, 1.0, 1e-12);
}

INSTANTIATE_TEST_SUITE_P(
    All, ExampleModels,
    ::testing::Values(Case{"gpt-tiny", 0}, Case{"gpt2-small", 124439808},
                      Case{"gpt2-medium", 354823168}, Case{"megatron-2.5b", 0},
                      // 12 l h^2 + 13 l h + (V + s) h + 2 h with l 24, h 2048, V 50304, s 2048
                      Case{"gpt-1.3b", 1315819520},
                      Case{"megatron-8.3b", 0}, Case{"gpt3-175b", 0}, Case{"gpt-1t", 0},
                      Case{"bert-tiny", 0}, Case{"bert-large", 0}, Case{"llama-tiny", 0},
                      // Published counts (Hugging Face configs of Meta's releases).
                      Case{"llama-3.2-1b", 1235814400}, Case{"llama-2-7b", 6738415616},
                      Case{"llama-3-8b", 8030261248}, Case{"llama-3-70b", 70553706496}),
    [](const auto &info) {
      std::string n = info.param.name;
      for (char &c : n)
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      return n;
    });

TEST(ModelBuilder, LargeModelsHaveTheirNominalSize) {
  // The papers' headline sizes, to 1%: 2.5B, 8.3B, 175B, 1008B.
  mlir::MLIRContext ctx;
  for (auto [name, billions] : {std::pair{"megatron-2.5b", 2.5}, std::pair{"megatron-8.3b", 8.3},
                                std::pair{"gpt3-175b", 175.0}, std::pair{"gpt-1t", 1008.0}}) {
    mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(ctx, load(name), {});
    double got = computeModelStats(*module).parameters / 1e9;
    EXPECT_NEAR(got / billions, 1.0, 0.01) << name << ": " << got << "B";
  }
}

TEST(ModelBuilder, BatchIsDynamicUnlessGiven) {
  config::ModelConfig cfg = load("gpt-tiny");
  mlir::MLIRContext ctx;
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(ctx, cfg, {});
  ASSERT_TRUE(succeeded(mlir::verify(*module)));
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  EXPECT_NE(text.find("tensor<?x32xi32>"), std::string::npos);
  EXPECT_NE(text.find("tensor<1000x64xf32>"), std::string::npos);  // the tokenizer's vocabulary
  EXPECT_EQ(text.find("loom.tensor_parallel_size"), std::string::npos);
  // Per-token figures do not depend on the batch.
  EXPECT_EQ(computeModelStats(*module).tokensPerStep, cfg.seq_length());
}

TEST(ModelBuilder, BatchAndDtypeFollowOptions) {
  config::ModelConfig cfg = load("gpt-tiny");
  cfg.set_params_dtype(config::BF16);
  mlir::MLIRContext ctx;
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(ctx, cfg, {.microBatch = 3});
  ASSERT_TRUE(succeeded(mlir::verify(*module)));
  EXPECT_EQ(computeModelStats(*module).tokensPerStep, 3 * cfg.seq_length());
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  // The model stays fp32; params_dtype is the module's precision policy, which
  // loom-mixed-precision applies after partitioning.
  EXPECT_NE(text.find("tensor<1000x64xf32>"), std::string::npos);
  EXPECT_EQ(text.find("bf16>"), std::string::npos);
  EXPECT_NE(text.find("loom.params_dtype = \"bf16\""), std::string::npos);
  EXPECT_NE(text.find("tensor<3x32xi32>"), std::string::npos);
}

}  // namespace
}  // namespace loom
