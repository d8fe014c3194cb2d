// The byte-level BPE trainer: merge order on corpora worked by hand, the files' format read back
// by the tokenizer, determinism, and the errors.
#include "data/BpeTrainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "data/Bpe.h"

namespace loom {
namespace {

const std::string kSpace = "\xC4\xA0";  // U+0120, the byte-level alphabet's ' '

std::vector<std::pair<std::string, std::string>> trainMerges(const std::vector<std::string> &docs, int64_t vocab) {
  TrainedBpe bpe;
  Status s = trainByteLevelBpe(docs, vocab, &bpe);
  EXPECT_TRUE(s.isOk()) << s.message();
  return bpe.merges;
}

TEST(BpeTrainer, MergesTheMostFrequentPairFirstAndBreaksTiesByTheTokensBytes) {
  // Pieces: "ab", " ab" x2, " cd". Pairs: (a,b) x3, (' ',a) x2, (' ',c) x1, (c,d) x1.
  // After "a b": (' ',ab) x2. Then a tie at 1 between (' ',c) and (c,d): "c" < "\xC4\xA0".
  auto merges = trainMerges({"ab ab ab cd"}, 1000);
  std::vector<std::pair<std::string, std::string>> want{
      {"a", "b"}, {kSpace, "ab"}, {"c", "d"}, {kSpace, "cd"}};
  EXPECT_EQ(merges, want);
}

TEST(BpeTrainer, MergesOverlappingOccurrencesLeftToRight) {
  // "aaaa": (a,a) counts 3 within the piece; merged left to right it becomes "aa aa", whose
  // pair then merges again.
  auto merges = trainMerges({"aaaa"}, 1000);
  std::vector<std::pair<std::string, std::string>> want{{"a", "a"}, {"aa", "aa"}};
  EXPECT_EQ(merges, want);
}

TEST(BpeTrainer, StopsAtTheVocabularySizeWithTheBytesFirstAndEndOfTextLast) {
  std::vector<std::string> docs{"the cat sat on the mat; the dog sat on the log.", "then the cat ran."};
  TrainedBpe bpe;
  ASSERT_TRUE(trainByteLevelBpe(docs, 260, &bpe).isOk());
  ASSERT_EQ(bpe.tokens.size(), 260u);
  EXPECT_EQ(bpe.merges.size(), 3u);
  EXPECT_EQ(bpe.tokens.back(), "<|endoftext|>");
  EXPECT_EQ(bpe.tokens[0], "!");                // the first printable byte, as GPT-2's id 0
  EXPECT_EQ(std::set<std::string>(bpe.tokens.begin(), bpe.tokens.end()).size(), bpe.tokens.size());
  for (int k = 0; k < 3; ++k) EXPECT_EQ(bpe.tokens[256 + k], bpe.merges[k].first + bpe.merges[k].second);
}

TEST(BpeTrainer, DependsOnlyOnTheDocumentsNotTheirOrder) {
  std::vector<std::string> docs{"red green blue green red", "blue blue green", "yellow red red", "green"};
  auto first = trainMerges(docs, 300);
  std::reverse(docs.begin(), docs.end());
  EXPECT_EQ(trainMerges(docs, 300), first);
  EXPECT_EQ(trainMerges(docs, 300), first);
}

TEST(BpeTrainer, WrittenFilesLoadIntoTheTokenizerAndRoundTripAnyBytes) {
  std::vector<std::string> docs{"ab ab ab cd", "the quick brown fox jumps over the lazy dog"};
  TrainedBpe bpe;
  ASSERT_TRUE(trainByteLevelBpe(docs, 300, &bpe).isOk());
  auto dir = std::filesystem::path(testing::TempDir()) / "bpe_trainer_test";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(writeBpeFiles(bpe, (dir / "encoder.json").string(), (dir / "vocab.bpe").string()).isOk());
  std::unique_ptr<BpeTokenizer> tok;
  Status s = BpeTokenizer::load((dir / "encoder.json").string(), (dir / "vocab.bpe").string(), &tok);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(tok->vocabSize(), int64_t(bpe.tokens.size()));
  EXPECT_EQ(tok->endOfText(), int32_t(bpe.tokens.size() - 1));
  // "ab" and " cd" are single tokens, at their ids in the trained vocabulary.
  std::vector<int32_t> ids = tok->encode("ab cd");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(bpe.tokens[ids[0]], "ab");
  EXPECT_EQ(bpe.tokens[ids[1]], kSpace + "cd");
  std::string bytes = "caf\xC3\xA9 \xFF\xFE ab\n\tzebra";
  EXPECT_EQ(tok->decode(tok->encode(bytes)), bytes);
}

TEST(BpeTrainer, RefusesAVocabularyWithoutRoomForTheBytes) {
  TrainedBpe bpe;
  Status s = trainByteLevelBpe({"text"}, 256, &bpe);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("at least 257"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace loom
