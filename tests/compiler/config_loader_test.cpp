// Config loading: Megatron defaults, cluster validation, the numbers named in errors.
#include <gtest/gtest.h>

#include <fstream>

#include "config/ConfigLoader.h"

namespace loom {
namespace {

std::string writeTemp(const std::string &name, const std::string &text) {
  std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string errorOf(llvm::Error e) { return llvm::toString(std::move(e)); }

TEST(ConfigLoader, FillsMegatronDefaults) {
  auto m = loadModelConfig("examples/models/gpt2-small.pbtxt");
  ASSERT_TRUE(bool(m)) << errorOf(m.takeError());
  EXPECT_EQ(m->ffn_hidden_size(), 4 * 768);
  EXPECT_EQ(m->max_position_embeddings(), 1024);
  EXPECT_EQ(m->make_vocab_size_divisible_by(), 128);
  EXPECT_FLOAT_EQ(m->init_method_std(), 0.02f);
  EXPECT_FLOAT_EQ(m->layernorm_epsilon(), 1e-5f);
  EXPECT_EQ(paddedVocabSize(*m, 1), 50304);
  EXPECT_EQ(paddedVocabSize(*m, 2), 50432);
  EXPECT_EQ(paddedVocabSize(*m, 8), 51200);
}

TEST(ConfigLoader, EveryExampleClusterLoads) {
  for (const char *name : {"cpu-2", "cpu-4", "dgx-a100", "ptdp-3072"}) {
    auto c = loadClusterSpec(std::string("examples/clusters/") + name + ".pbtxt");
    ASSERT_TRUE(bool(c)) << name << ": " << errorOf(c.takeError());
    const auto &p = c->parallel();
    EXPECT_EQ(p.tensor_parallel_size() * p.pipeline_parallel_size() * p.data_parallel_size(),
              c->nodes() * c->devices_per_node())
        << name;
  }
  auto c = loadClusterSpec("examples/clusters/ptdp-3072.pbtxt");
  ASSERT_TRUE(bool(c));
  EXPECT_EQ(c->nodes() * c->devices_per_node(), 3072);
  auto m = loadModelConfig("examples/models/gpt-1t.pbtxt");
  ASSERT_TRUE(bool(m));
  EXPECT_FALSE(bool(checkModelFitsCluster(*m, *c, "ptdp-3072.pbtxt")));
}

TEST(ConfigLoader, DataParallelSizeIsInferredFromWorld) {
  auto path = writeTemp("dp.pbtxt", "nodes: 2 devices_per_node: 4 device { kind: CUDA }\n"
                                    "parallel { tensor_parallel_size: 2 pipeline_parallel_size: 2 }\n");
  auto c = loadClusterSpec(path);
  ASSERT_TRUE(bool(c)) << errorOf(c.takeError());
  EXPECT_EQ(c->parallel().data_parallel_size(), 2);
  EXPECT_EQ(c->parallel().global_batch_size(), 2);  // b * d
}

TEST(ConfigLoader, GlobalBatchMustSplitIntoMicroBatches) {
  auto path = writeTemp("gb.pbtxt", "nodes: 1 devices_per_node: 2 device { kind: CPU }\n"
                                    "parallel { micro_batch_size: 2 global_batch_size: 6 }\n");
  auto c = loadClusterSpec(path);
  ASSERT_FALSE(bool(c));
  EXPECT_EQ(errorOf(c.takeError()),
            path + ": error: field 'parallel.global_batch_size' (6) must be a multiple of "
                   "micro_batch_size * d = 2 * 2");
}

TEST(ConfigLoader, TensorParallelMustDivideFfn) {
  auto m = loadModelConfig("examples/models/gpt-tiny.pbtxt");
  ASSERT_TRUE(bool(m));
  m->set_ffn_hidden_size(250);
  auto path = writeTemp("t4.pbtxt", "nodes: 1 devices_per_node: 4 device { kind: CPU }\n"
                                    "parallel { tensor_parallel_size: 4 }\n");
  auto c = loadClusterSpec(path);
  ASSERT_TRUE(bool(c));
  EXPECT_EQ(errorOf(checkModelFitsCluster(*m, *c, path)),
            path + ": error: field 'parallel.tensor_parallel_size' t = 4 does not divide "
                   "ffn_hidden_size = 250 of model 'gpt-tiny'");
}

TEST(ConfigLoader, InterleavedScheduleNeedsChunks) {
  auto path = writeTemp("il.pbtxt", "nodes: 1 devices_per_node: 2 device { kind: CPU }\n"
                                    "parallel { pipeline_parallel_size: 2 schedule: INTERLEAVED_ONE_F_ONE_B }\n");
  auto c = loadClusterSpec(path);
  ASSERT_FALSE(bool(c));
  EXPECT_NE(errorOf(c.takeError()).find("needs virtual_pipeline_size >= 2"), std::string::npos);
}

TEST(ConfigLoader, EmptyFileIsRejectedWithAField) {
  auto path = writeTemp("empty.pbtxt", "");
  auto m = loadModelConfig(path);
  ASSERT_FALSE(bool(m));
  EXPECT_EQ(errorOf(m.takeError()), path + ": error: field 'architecture' must be GPT, BERT or LLAMA");
}

}  // namespace
}  // namespace loom
