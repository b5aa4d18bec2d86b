// The tokenizer.json BPE model: vocab, merges (as "a b" strings or [a, b]
// pairs), byte_fallback, ignore_merges, unk_token / fuse_unk,
// continuing_subword_prefix / end_of_word_suffix.
//
// Merging follows Hugging Face exactly: repeatedly apply the lowest-ranked
// merge among adjacent symbols (leftmost on ties), using a heap over a linked
// list of symbols, so long words (SentencePiece-style tokenizers feed the
// whole text as one word) stay O(n log n). Results for short words are kept
// in a sharded, thread-safe cache.
#ifndef LOOM_SRC_TOKENIZER_BPE_H_
#define LOOM_SRC_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/base/status.h"
#include "src/tokenizer/json_util.h"

namespace loom::tok {

// One model token: id and the byte range [begin, end) of the word it covers.
struct WordToken {
  int32_t id;
  uint32_t begin;
  uint32_t end;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const {
    return std::hash<std::string_view>{}(s);
  }
};
using Vocab =
    std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const Json& model,
                                                      const JsonPath& at);
  ~BpeModel();

  // Appends the tokens of `word` (one pre-tokenizer piece) to `out`.
  void Tokenize(std::string_view word, std::vector<WordToken>* out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr when `id` is not in the vocab.
  const std::string* IdToToken(int32_t id) const;
  // Largest id + 1.
  int32_t size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  BpeModel() = default;
  // Tokenizes `word` through the cache; offsets are shifted by `base`.
  void TokenizeCached(std::string_view word, uint32_t base,
                      std::vector<WordToken>* out) const;
  void MergeWord(std::string_view word, std::vector<WordToken>* out) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  // Open-addressing map (left id, right id) -> (rank, merged id).
  struct MergeSlot {
    uint64_t key = ~uint64_t{0};
    int32_t rank = 0;
    int32_t merged = 0;
  };
  std::vector<MergeSlot> merges_;
  uint64_t merge_mask_ = 0;
  const MergeSlot* FindMerge(int32_t a, int32_t b) const;
  void InsertMerge(int32_t a, int32_t b, int32_t rank, int32_t merged);

  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::array<int32_t, 256> byte_ids_{};
  // SentencePiece-style vocabularies have no token in which "▁" follows
  // another character. Then no merge can cross the start of a "▁" that
  // follows a non-"▁" character, and a long word (a whole text, for
  // tokenizers without a pre-tokenizer) is merged piecewise with the same
  // result, each piece going through the cache.
  bool split_before_meta_ = false;

  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<WordToken>, StringHash,
                       std::equal_to<>>
        map;
  };
  static constexpr int kCacheShards = 64;
  static constexpr size_t kCacheMaxWordBytes = 128;
  static constexpr size_t kCacheMaxEntriesPerShard = 4096;
  mutable std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace loom::tok

#endif  // LOOM_SRC_TOKENIZER_BPE_H_
