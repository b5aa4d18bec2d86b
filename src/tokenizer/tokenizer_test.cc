// Unit tests of the tokenizer module: UTF-8 handling, the invalid-UTF-8
// policy, error messages for malformed files, offsets, the public API, batch
// encoding, and the normalizer / pre-tokenizer / decoder components on small
// synthetic tokenizer.json files.
#include "src/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/tokenizer/utf8.h"

namespace loom::tok {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kTestData = std::string(LOOM_TESTDATA_DIR) + "/tokenizers";
const std::string kModels = LOOM_MODELS_DIR;

std::unique_ptr<Tokenizer> MustLoad(const std::string& dir) {
  auto t = Tokenizer::Load(dir);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

// Writes `files` (name -> content) into a fresh directory.
std::string WriteDir(const std::string& name,
                     const std::map<std::string, std::string>& files) {
  const fs::path dir = fs::path(testing::TempDir()) / ("loom_tok_unit_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& [f, content] : files) std::ofstream(dir / f) << content;
  return dir.string();
}

// ---------------------------------------------------------------- UTF-8

TEST(Utf8Test, FindsFirstInvalidByte) {
  EXPECT_EQ(FindInvalidUtf8("hello"), std::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("h\xC3\xA9llo \xF0\x9F\x98\x80"),
            std::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("abc\xFF"), 3u);
  EXPECT_EQ(FindInvalidUtf8("ab\xC0\xAF"), 2u);        // overlong
  EXPECT_EQ(FindInvalidUtf8("a\xED\xA0\x80"), 1u);     // surrogate
  EXPECT_EQ(FindInvalidUtf8("ab\xE2\x82"), 2u);        // truncated
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0u);  // > U+10FFFF
}

TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(LossyUtf8("a\xF0\x9F\x98z"), "a\xEF\xBF\xBDz");      // one U+FFFD
  EXPECT_EQ(LossyUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // two
  EXPECT_EQ(LossyUtf8("ok"), "ok");
}

TEST(Utf8Test, ByteLevelAlphabetRoundTrips) {
  const auto& table = ByteLevelAlphabet();
  EXPECT_EQ(table[' '], "\xC4\xA0");  // "Ġ"
  EXPECT_EQ(table['A'], "A");
  for (int b = 0; b < 256; ++b) {
    char32_t cp = 0;
    ASSERT_GT(DecodeUtf8(table[b], 0, &cp), 0);
    EXPECT_EQ(ByteLevelCharToByte(cp), b);
  }
}

// ---------------------------------------------------------------- invalid
// input

TEST(InvalidUtf8Test, IsAnErrorNamingTheOffset) {
  auto tok = MustLoad(kTestData + "/gpt2");
  ASSERT_TRUE(tok);
  auto enc = tok->Encode("Hello \xFF world", true);
  ASSERT_FALSE(enc.ok());
  EXPECT_EQ(enc.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(enc.status().message().find("byte offset 6"), std::string::npos)
      << enc.status().message();
}

TEST(InvalidUtf8Test, ReplacePolicyMatchesReplacementCharacter) {
  auto tok = MustLoad(kTestData + "/gpt2");
  ASSERT_TRUE(tok);
  EncodeOptions options;
  options.add_special_tokens = false;
  options.invalid_utf8 = InvalidUtf8Policy::kReplace;
  const std::string bad = "Hello \xFF world";
  auto enc = tok->Encode(bad, options);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  auto ref = tok->Encode("Hello \xEF\xBF\xBD world", false);
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(enc->ids, ref->ids);
  // Offsets refer to the original bytes: the last token " world" ends at the
  // end.
  EXPECT_EQ(enc->offsets.back().second, static_cast<int64_t>(bad.size()));
  for (const auto& [b, e] : enc->offsets)
    EXPECT_LE(e, static_cast<int64_t>(bad.size()));
}

// ---------------------------------------------------------------- malformed
// files

TEST(MalformedTest, NotJson) {
  const std::string dir =
      WriteDir("notjson", {{"tokenizer.json", "{ not json"}});
  auto t = Tokenizer::Load(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos);
}

TEST(MalformedTest, NamesTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model": {"type": "BPE", "merges": []}})", "model.vocab"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})",
       "model.merges[0]"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Bogus"}]}})",
       "pre_tokenizer.pretokenizers[0].type"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "unk_token": "<unk>"}})",
       "model.unk_token"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
           "added_tokens": [{"id": 1}]})",
       "added_tokens[0].content"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
           "normalizer": {"type": "Replace", "pattern": {"Regex": "("}, "content": ""}})",
       "normalizer.pattern"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string dir = WriteDir("field" + std::to_string(i),
                                     {{"tokenizer.json", cases[i].first}});
    auto t = Tokenizer::Load(dir);
    ASSERT_FALSE(t.ok()) << cases[i].first;
    EXPECT_NE(t.status().message().find(cases[i].second), std::string::npos)
        << "expected \"" << cases[i].second
        << "\" in: " << t.status().message();
  }
}

TEST(MalformedTest, MissingFiles) {
  const std::string dir = WriteDir("empty", {});
  auto t = Tokenizer::Load(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(Tokenizer::Load(dir + "/does-not-exist").ok());
  const std::string bad_cfg =
      WriteDir("badcfg", {{"tokenizer_config.json", R"({"add_bos_token": 3})"},
                          {"tokenizer.json", "{}"}});
  auto t2 = Tokenizer::Load(bad_cfg);
  ASSERT_FALSE(t2.ok());
  EXPECT_NE(t2.status().message().find("tokenizer_config.json: add_bos_token"),
            std::string::npos)
      << t2.status().message();
}

TEST(DecodeTest, RejectsUnknownIds) {
  auto tok = MustLoad(kModels + "/stories260K");
  ASSERT_TRUE(tok);
  const std::vector<int32_t> ids = {1, 100000};
  auto text = tok->Decode(ids, false);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("100000"), std::string::npos);
}

// ---------------------------------------------------------------- API and
// offsets

TEST(ApiTest, Stories260K) {
  auto tok = MustLoad(kModels + "/stories260K");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->source(), "tokenizer.json");
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->unk_id(), 0);
  EXPECT_EQ(tok->pad_id(), -1);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_FALSE(tok->add_eos());
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->IdToToken(1), "<s>");
  EXPECT_EQ(tok->TokenToId("<s>"), 1);
  EXPECT_EQ(tok->TokenToId("no such token"), std::nullopt);
  EXPECT_TRUE(tok->IsSpecial(1));
  EXPECT_FALSE(tok->IsSpecial(300));
  EXPECT_EQ(tok->config().model_max_length, 512);

  const std::string text = "Hello world";
  auto enc = tok->Encode(text, true);
  ASSERT_TRUE(enc.ok());
  ASSERT_EQ(enc->ids.size(), enc->offsets.size());
  EXPECT_EQ(enc->ids[0], 1);
  EXPECT_EQ(enc->offsets[0], std::make_pair(int64_t{0}, int64_t{0}));
  // The text tokens tile the input: each starts where the previous ended.
  int64_t pos = 0;
  for (size_t i = 1; i < enc->offsets.size(); ++i) {
    EXPECT_EQ(enc->offsets[i].first, pos) << "token " << i;
    pos = enc->offsets[i].second;
  }
  EXPECT_EQ(pos, static_cast<int64_t>(text.size()));
}

TEST(ApiTest, QwenHasNoBos) {
  auto tok = MustLoad(kTestData + "/tiny_bytebpe512_qwen2");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->eos_id(), 509);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->config().model_max_length, std::nullopt);  // "unbounded"
}

TEST(ApiTest, SentencePieceModel) {
  auto tok = MustLoad(kTestData + "/tiny_spm512");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->source(), "tokenizer.model");
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->vocab_size(), 512);
  const std::string text = "Hello world";
  auto enc = tok->Encode(text, false);
  ASSERT_TRUE(enc.ok());
  for (const auto& [b, e] : enc->offsets) {
    EXPECT_LE(b, e);
    EXPECT_LE(e, static_cast<int64_t>(text.size()));
  }
  EXPECT_EQ(enc->offsets.back().second, static_cast<int64_t>(text.size()));
}

TEST(OffsetsTest, ByteLevelTokensCoverTheirBytes) {
  auto tok = MustLoad(kTestData + "/gpt2");
  ASSERT_TRUE(tok);
  const std::string text = "Hello world, caf\xC3\xA9 \xF0\x9F\x98\x80!";
  auto enc = tok->Encode(text, false);
  ASSERT_TRUE(enc.ok());
  int64_t pos = 0;
  std::string rebuilt;
  for (size_t i = 0; i < enc->ids.size(); ++i) {
    EXPECT_EQ(enc->offsets[i].first, pos);
    pos = enc->offsets[i].second;
    auto piece = tok->Decode(std::span<const int32_t>(&enc->ids[i], 1), false);
    rebuilt += *piece;
  }
  EXPECT_EQ(pos, static_cast<int64_t>(text.size()));
  EXPECT_EQ(enc->offsets[0],
            std::make_pair(int64_t{0}, int64_t{5}));  // "Hello"
  EXPECT_EQ(enc->offsets[1],
            std::make_pair(int64_t{5}, int64_t{11}));  // " world"
}

TEST(BatchTest, MatchesSequential) {
  auto tok = MustLoad(kTestData + "/gpt2");
  ASSERT_TRUE(tok);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    texts.push_back("Sample " + std::to_string(i) + ": the quick brown fox, " +
                    std::string(i % 7, 'z') + " jumps!");
  }
  EncodeOptions options;
  auto batch = tok->EncodeBatch(texts, options, 2);
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    auto one = tok->Encode(texts[i], true);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ((*batch)[i].ids, one->ids);
    EXPECT_EQ((*batch)[i].offsets, one->offsets);
  }
  texts[5] = "bad \xC3";
  auto failed = tok->EncodeBatch(texts, options, 2);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("text 5"), std::string::npos);
}

// ---------------------------------------------------------------- components

// A tokenizer.json over a tiny vocabulary with the given pieces.
std::string TinyTokenizer(const std::string& name, const Json& vocab,
                          const Json& merges, const Json& normalizer,
                          const Json& pre_tokenizer,
                          const Json& decoder = nullptr,
                          const Json& added = Json::array()) {
  Json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  j["normalizer"] = normalizer;
  j["pre_tokenizer"] = pre_tokenizer;
  j["decoder"] = decoder;
  j["post_processor"] = nullptr;
  j["added_tokens"] = added;
  return WriteDir(name, {{"tokenizer.json", j.dump()}});
}

std::vector<std::string> Tokens(const Tokenizer& tok, const std::string& text) {
  auto enc = tok.Encode(text, false);
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  std::vector<std::string> out;
  if (enc.ok()) {
    for (int32_t id : enc->ids) out.push_back(tok.IdToToken(id));
  }
  return out;
}

using V = std::vector<std::string>;

TEST(ComponentTest, DigitsAndPunctuationAndWhitespace) {
  const Json vocab = {{"1", 0},  {"2", 1}, {"12", 2}, {"a", 3},  {"!", 4},
                      {"a!", 5}, {"b", 6}, {" ", 7},  {"ab", 8}, {" b", 9}};
  const Json merges =
      Json::array({"1 2", "a !", "a b", Json::array({" ", "b"})});
  {
    auto tok = MustLoad(
        TinyTokenizer("digits", vocab, merges, nullptr,
                      {{"type", "Digits"}, {"individual_digits", true}}));
    EXPECT_EQ(Tokens(*tok, "12a!"), (V{"1", "2", "a!"}));
  }
  {
    auto tok = MustLoad(
        TinyTokenizer("digits2", vocab, merges, nullptr,
                      {{"type", "Digits"}, {"individual_digits", false}}));
    EXPECT_EQ(Tokens(*tok, "12a!"), (V{"12", "a!"}));
  }
  {
    auto tok = MustLoad(TinyTokenizer("punct", vocab, merges, nullptr,
                                      {{"type", "Punctuation"}}));
    EXPECT_EQ(Tokens(*tok, "a!b"), (V{"a", "!", "b"}));
  }
  {
    auto tok = MustLoad(
        TinyTokenizer("ws", vocab, merges, nullptr, {{"type", "Whitespace"}}));
    EXPECT_EQ(Tokens(*tok, "ab b!"), (V{"ab", "b", "!"}));
  }
  {
    auto tok = MustLoad(TinyTokenizer("split", vocab, merges, nullptr,
                                      {{"type", "Split"},
                                       {"pattern", {{"String", " "}}},
                                       {"behavior", "MergedWithNext"}}));
    EXPECT_EQ(Tokens(*tok, "a b"), (V{"a", " b"}));
  }
  {
    auto tok = MustLoad(TinyTokenizer("split2", vocab, merges, nullptr,
                                      {{"type", "Split"},
                                       {"pattern", {{"Regex", "\\s+"}}},
                                       {"behavior", "Removed"}}));
    EXPECT_EQ(Tokens(*tok, "ab  b"), (V{"ab", "b"}));
  }
}

TEST(ComponentTest, Normalizers) {
  const Json vocab = {{"f", 0}, {"i", 1},  {"fi", 2}, {"a", 3},
                      {"b", 4}, {"ab", 5}, {"x", 6},  {"\xC3\xA9", 7}};
  const Json merges = Json::array({"f i", "a b"});
  {
    auto tok = MustLoad(
        TinyTokenizer("nfkc", vocab, merges, {{"type", "NFKC"}}, nullptr));
    EXPECT_EQ(Tokens(*tok, "\xEF\xAC\x81"), (V{"fi"}));  // U+FB01 ligature
    auto enc = tok->Encode("x\xEF\xAC\x81", false);
    ASSERT_TRUE(enc.ok());
    EXPECT_EQ(enc->offsets[1], std::make_pair(int64_t{1}, int64_t{4}));
  }
  {
    auto tok = MustLoad(
        TinyTokenizer("nfc", vocab, merges, {{"type", "NFC"}}, nullptr));
    EXPECT_EQ(Tokens(*tok, "e\xCC\x81"),
              (V{"\xC3\xA9"}));  // e + combining acute
  }
  {
    const Json seq = {
        {"type", "Sequence"},
        {"normalizers",
         Json::array(
             {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
              {{"type", "Lowercase"}}})}};
    auto tok = MustLoad(TinyTokenizer("lower", vocab, merges, seq, nullptr));
    EXPECT_EQ(Tokens(*tok, "  AB\t"), (V{"ab"}));
    auto enc = tok->Encode("  AB\t", false);
    EXPECT_EQ(enc->offsets[0], std::make_pair(int64_t{2}, int64_t{4}));
  }
}

TEST(ComponentTest, MetaspaceSchemes) {
  const std::string m = "\xE2\x96\x81";
  const Json vocab = {{m, 0},       {"a", 1},     {"b", 2},
                      {m + "a", 3}, {m + "b", 4}, {"<x>", 5}};
  const Json merges =
      Json::array({Json::array({m, "a"}), Json::array({m, "b"})});
  const Json added =
      Json::array({{{"id", 5}, {"content", "<x>"}, {"special", true}}});
  auto make = [&](const std::string& scheme, bool split) {
    return MustLoad(TinyTokenizer(
        "meta_" + scheme + (split ? "1" : "0"), vocab, merges, nullptr,
        {{"type", "Metaspace"},
         {"replacement", m},
         {"prepend_scheme", scheme},
         {"split", split}},
        {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", scheme}},
        added));
  };
  auto always = make("always", true);
  EXPECT_EQ(Tokens(*always, "a b"), (V{m + "a", m + "b"}));
  EXPECT_EQ(Tokens(*always, "a<x>b"), (V{m + "a", "<x>", m + "b"}));
  auto first = make("first", true);
  EXPECT_EQ(Tokens(*first, "a<x>b"), (V{m + "a", "<x>", "b"}));
  auto never = make("never", true);
  EXPECT_EQ(Tokens(*never, "a b"), (V{"a", m + "b"}));
  auto first_nosplit = make("first", false);
  EXPECT_EQ(Tokens(*first_nosplit, " a"), (V{m + "a"}));
  // Decoder: the first token's "▁" is dropped unless the scheme is "never".
  const std::vector<int32_t> ids = {3, 4};
  EXPECT_EQ(*always->Decode(ids, false), "a b");
  EXPECT_EQ(*never->Decode(ids, false), " a b");
}

TEST(ComponentTest, AddedTokenStripAndSingleWord) {
  const Json vocab = {{"a", 0}, {" ", 1}, {"b", 2}};
  const Json added = Json::array({{{"id", 3},
                                   {"content", "<m>"},
                                   {"special", true},
                                   {"lstrip", true},
                                   {"rstrip", true}},
                                  {{"id", 4},
                                   {"content", "ab"},
                                   {"special", false},
                                   {"single_word", true}}});
  auto tok = MustLoad(TinyTokenizer("added", vocab, Json::array(), nullptr,
                                    nullptr, nullptr, added));
  EXPECT_EQ(Tokens(*tok, "a  <m>  b"), (V{"a", "<m>", "b"}));
  auto enc = tok->Encode("a  <m>  b", false);
  EXPECT_EQ(enc->offsets[1], std::make_pair(int64_t{1}, int64_t{8}));
  EXPECT_EQ(Tokens(*tok, "ab b"), (V{"ab", " ", "b"}));
  EXPECT_EQ(Tokens(*tok, "aab"), (V{"a", "a", "b"}));  // not a single word
  EXPECT_TRUE(tok->IsSpecial(3));
  EXPECT_FALSE(tok->IsSpecial(4));
  const std::vector<int32_t> ids = {0, 3, 2};
  EXPECT_EQ(*tok->Decode(ids, true),
            "a b");  // no decoder: tokens joined by spaces
  EXPECT_EQ(*tok->Decode(ids, false), "a <m> b");
}

TEST(ComponentTest, ByteFallbackAndUnknown) {
  Json vocab = {{"<unk>", 0}, {"a", 1}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 2 + b;
  }
  Json j;
  j["model"] = {{"type", "BPE"},           {"vocab", vocab},
                {"merges", Json::array()}, {"unk_token", "<unk>"},
                {"byte_fallback", true},   {"fuse_unk", true}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", Json::array({{{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}}})}};
  auto tok = MustLoad(WriteDir("bytefallback", {{"tokenizer.json", j.dump()}}));
  auto enc = tok->Encode("a\xC3\xA9", false);
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(enc->ids, (std::vector<int32_t>{1, 2 + 0xC3, 2 + 0xA9}));
  EXPECT_EQ(enc->offsets[1], std::make_pair(int64_t{1}, int64_t{2}));
  EXPECT_EQ(enc->offsets[2], std::make_pair(int64_t{2}, int64_t{3}));
  EXPECT_EQ(*tok->Decode(enc->ids, false), "a\xC3\xA9");
  const std::vector<int32_t> lone = {2 + 0xC3, 1};
  EXPECT_EQ(*tok->Decode(lone, false),
            "\xEF\xBF\xBD"
            "a");  // invalid byte -> U+FFFD

  j["model"]["byte_fallback"] = false;
  auto unk = MustLoad(WriteDir("unk", {{"tokenizer.json", j.dump()}}));
  auto e2 = unk->Encode(
      "a\xC3\xA9\xC3\xA9"
      "a",
      false);
  EXPECT_EQ(e2->ids, (std::vector<int32_t>{1, 0, 1}));  // fused unknowns
  EXPECT_EQ(e2->offsets[1], std::make_pair(int64_t{1}, int64_t{5}));
}

TEST(ConfigTest, ReadsFields) {
  const std::string dir = WriteDir(
      "config",
      {{"tokenizer.json",
        R"({"model": {"type": "BPE", "vocab": {"<s>": 0, "</s>": 1, "a": 2}, "merges": []},
                                        "added_tokens": [{"id": 0, "content": "<s>", "special": true},
                                                         {"id": 1, "content": "</s>", "special": true}]})"},
       {"tokenizer_config.json",
        R"({"tokenizer_class": "LlamaTokenizer", "add_bos_token": true, "add_eos_token": true,
                      "bos_token": {"content": "<s>"}, "eos_token": "</s>", "legacy": false,
                      "model_max_length": 2048, "chat_template": [{"name": "default", "template": "T"}]})"}});
  auto tok = MustLoad(dir);
  ASSERT_TRUE(tok);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->add_eos());
  EXPECT_EQ(tok->config().chat_template, "T");
  EXPECT_EQ(tok->config().legacy, false);
  EXPECT_EQ(tok->config().model_max_length, 2048);
  auto enc = tok->Encode("aa", true);
  EXPECT_EQ(enc->ids, (std::vector<int32_t>{0, 2, 2, 1}));
  EXPECT_EQ(enc->offsets.back(), std::make_pair(int64_t{2}, int64_t{2}));
}

}  // namespace
}  // namespace loom::tok
