#include "src/tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "src/tokenizer/utf8.h"

namespace loom::tok {
namespace {

constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
         static_cast<uint32_t>(b);
}

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace

BpeModel::~BpeModel() = default;

const BpeModel::MergeSlot* BpeModel::FindMerge(int32_t a, int32_t b) const {
  if (merges_.empty()) return nullptr;
  const uint64_t key = PairKey(a, b);
  for (uint64_t i = Mix(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
    const MergeSlot& slot = merges_[i];
    if (slot.key == key) return &slot;
    if (slot.key == ~uint64_t{0}) return nullptr;
  }
}

void BpeModel::InsertMerge(int32_t a, int32_t b, int32_t rank, int32_t merged) {
  const uint64_t key = PairKey(a, b);
  for (uint64_t i = Mix(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
    MergeSlot& slot = merges_[i];
    if (slot.key == key || slot.key == ~uint64_t{0}) {
      slot = {key, rank, merged};  // A later duplicate overrides, as in HF.
      return;
    }
  }
}

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& model,
                                                       const JsonPath& at) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  auto vit = model.find("vocab");
  if (vit == model.end() || !vit->is_object()) {
    return JsonError(at.Child("vocab"), "expected an object of token -> id");
  }
  int32_t max_id = -1;
  m->vocab_.reserve(vit->size());
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return JsonError(at.Child("vocab").Child(it.key()),
                       "expected a non-negative integer id");
    }
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    m->vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.resize(max_id + 1);
  m->has_id_.resize(max_id + 1, false);
  for (const auto& [token, id] : m->vocab_) {
    m->id_to_token_[id] = token;
    m->has_id_[id] = true;
  }

  ASSIGN_OR_RETURN(std::string unk, OptString(model, "unk_token", at, ""));
  if (!unk.empty()) {
    auto it = m->vocab_.find(unk);
    if (it == m->vocab_.end()) {
      return JsonError(at.Child("unk_token"),
                       "\"" + unk + "\" is not in model.vocab");
    }
    m->unk_id_ = it->second;
  }
  ASSIGN_OR_RETURN(m->fuse_unk_, OptBool(model, "fuse_unk", at, false));
  ASSIGN_OR_RETURN(m->byte_fallback_,
                   OptBool(model, "byte_fallback", at, false));
  ASSIGN_OR_RETURN(m->ignore_merges_,
                   OptBool(model, "ignore_merges", at, false));
  ASSIGN_OR_RETURN(m->continuing_subword_prefix_,
                   OptString(model, "continuing_subword_prefix", at, ""));
  ASSIGN_OR_RETURN(m->end_of_word_suffix_,
                   OptString(model, "end_of_word_suffix", at, ""));
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() &&
        model["dropout"].get<double>() == 0.0)) {
    return UnimplementedError(at.Child("dropout").ToString() +
                              ": BPE dropout is not supported");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = m->vocab_.find(std::string_view(name));
    m->byte_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
  }

  auto mit = model.find("merges");
  if (mit == model.end() || !mit->is_array()) {
    return JsonError(at.Child("merges"), "expected an array");
  }
  size_t cap = 16;
  while (cap < mit->size() * 2 + 2) cap <<= 1;
  m->merges_.assign(cap, MergeSlot{});
  m->merge_mask_ = cap - 1;
  const JsonPath mat = at.Child("merges");
  const size_t prefix_len = m->continuing_subword_prefix_.size();
  std::string merged;
  for (size_t i = 0; i < mit->size(); ++i) {
    const Json& e = (*mit)[i];
    std::string_view a, b;
    std::string joined;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return JsonError(
            mat.Index(i),
            "expected \"a b\" (two tokens separated by one space), got \"" + s +
                "\"");
      }
      a = std::string_view(s).substr(0, sp);
      b = std::string_view(s).substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() &&
               e[1].is_string()) {
      a = e[0].get_ref<const std::string&>();
      b = e[1].get_ref<const std::string&>();
    } else {
      return JsonError(mat.Index(i), "expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = m->vocab_.find(a);
    auto ib = m->vocab_.find(b);
    if (ia == m->vocab_.end() || ib == m->vocab_.end()) {
      return JsonError(mat.Index(i), "merge \"" + std::string(a) + "\" + \"" +
                                         std::string(b) +
                                         "\": token not in model.vocab");
    }
    merged.assign(a);
    if (prefix_len > 0 && b.starts_with(m->continuing_subword_prefix_)) {
      merged.append(b.substr(prefix_len));
    } else {
      merged.append(b);
    }
    auto im = m->vocab_.find(merged);
    // A merge whose result is not a token can never apply. GPT-2's own files
    // have one ("ĠCla ude"), so such merges are skipped rather than rejected.
    if (im == m->vocab_.end()) continue;
    m->InsertMerge(ia->second, ib->second, static_cast<int32_t>(i), im->second);
  }
  if (!m->ignore_merges_ && m->continuing_subword_prefix_.empty() &&
      m->end_of_word_suffix_.empty() && m->vocab_.count(kMeta) != 0) {
    bool crossing = false;
    for (const auto& [token, id] : m->vocab_) {
      for (size_t p = token.find(kMeta, 1); p != std::string::npos && !crossing;
           p = token.find(kMeta, p + 1)) {
        crossing = !std::string_view(token).substr(0, p).ends_with(kMeta);
      }
      if (crossing) break;
    }
    m->split_before_meta_ = !crossing;
  }
  m->cache_ = std::make_unique<CacheShard[]>(kCacheShards);
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view word,
                        std::vector<WordToken>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out->push_back({it->second, 0, static_cast<uint32_t>(word.size())});
      return;
    }
  }
  if (!split_before_meta_ || word.size() <= kCacheMaxWordBytes) {
    TokenizeCached(word, 0, out);
    return;
  }
  size_t start = 0;
  size_t p = word.find(kMeta, 1);
  while (p != std::string_view::npos) {
    if (!word.substr(0, p).ends_with(kMeta)) {
      TokenizeCached(word.substr(start, p - start),
                     static_cast<uint32_t>(start), out);
      start = p;
    }
    p = word.find(kMeta, p + kMeta.size());
  }
  TokenizeCached(word.substr(start), static_cast<uint32_t>(start), out);
}

void BpeModel::TokenizeCached(std::string_view word, uint32_t base,
                              std::vector<WordToken>* out) const {
  if (word.empty()) return;
  const size_t first = out->size();
  if (word.size() > kCacheMaxWordBytes) {
    MergeWord(word, out);
  } else {
    CacheShard& shard = cache_[StringHash{}(word) % kCacheShards];
    bool hit = false;
    {
      std::lock_guard<std::mutex> lock(shard.mu);
      auto it = shard.map.find(word);
      if (it != shard.map.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        hit = true;
      }
    }
    if (!hit) {
      MergeWord(word, out);
      std::lock_guard<std::mutex> lock(shard.mu);
      if (shard.map.size() < kCacheMaxEntriesPerShard) {
        shard.map.emplace(
            std::string(word),
            std::vector<WordToken>(out->begin() + first, out->end()));
      }
    }
  }
  if (base != 0) {
    for (size_t k = first; k < out->size(); ++k) {
      (*out)[k].begin += base;
      (*out)[k].end += base;
    }
  }
}

void BpeModel::MergeWord(std::string_view word,
                         std::vector<WordToken>* out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t begin;
    uint32_t end;  // 0-length symbol == merged away
  };
  thread_local std::vector<Symbol> symbols;
  symbols.clear();

  // 1. Initial symbols: one per character (byte fallback / unk as needed).
  std::optional<Symbol> pending_unk;
  std::string scratch;
  auto push = [&](int32_t id, uint32_t b, uint32_t e) {
    symbols.push_back({id, static_cast<int32_t>(symbols.size()) - 1,
                       static_cast<int32_t>(symbols.size()) + 1, b, e});
  };
  auto flush_unk = [&] {
    if (pending_unk) {
      push(pending_unk->id, pending_unk->begin, pending_unk->end);
      pending_unk.reset();
    }
  };
  const bool affixes =
      !continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty();
  size_t i = 0;
  while (i < word.size()) {
    const size_t n = std::min<size_t>(
        Utf8SeqLen(static_cast<unsigned char>(word[i])), word.size() - i);
    std::string_view ch = word.substr(i, n);
    if (affixes) {
      scratch.clear();
      if (i > 0) scratch.append(continuing_subword_prefix_);
      scratch.append(ch);
      if (i + n == word.size()) scratch.append(end_of_word_suffix_);
      ch = scratch;
    }
    const auto b = static_cast<uint32_t>(i);
    const auto e = static_cast<uint32_t>(i + n);
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      flush_unk();
      push(it->second, b, e);
    } else {
      bool done = false;
      if (byte_fallback_) {
        bool all = true;
        for (char c : ch)
          all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
        if (all) {
          flush_unk();
          // Byte tokens cover one input byte each (when no affix was added).
          for (size_t k = 0; k < ch.size(); ++k) {
            const uint32_t kb =
                affixes ? b : b + static_cast<uint32_t>(std::min(k, n - 1));
            const uint32_t ke = affixes ? e : std::min<uint32_t>(kb + 1, e);
            push(byte_ids_[static_cast<unsigned char>(ch[k])], kb, ke);
          }
          done = true;
        }
      }
      if (!done && unk_id_) {
        if (pending_unk && fuse_unk_) {
          pending_unk->end = e;
        } else {
          flush_unk();
          pending_unk = Symbol{*unk_id_, 0, 0, b, e};
        }
      }
    }
    i += n;
  }
  flush_unk();
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // 2. Merge, lowest rank first, leftmost on ties.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Candidate> heap;
  heap.clear();
  const auto cmp = std::greater<Candidate>();
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const MergeSlot* m = FindMerge(symbols[k].id, symbols[k + 1].id)) {
      heap.push_back({m->rank, static_cast<int32_t>(k), m->merged});
    }
  }
  std::make_heap(heap.begin(), heap.end(), cmp);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const MergeSlot* m = FindMerge(left.id, right.id);
    if (m == nullptr || m->merged != top.merged) continue;
    left.id = top.merged;
    left.end = right.end;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    right.id = -1;
    right.next = -1;
    if (left.prev >= 0) {
      if (const MergeSlot* pm = FindMerge(symbols[left.prev].id, left.id)) {
        heap.push_back({pm->rank, left.prev, pm->merged});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
    if (left.next >= 0) {
      if (const MergeSlot* nm = FindMerge(left.id, symbols[left.next].id)) {
        heap.push_back({nm->rank, top.pos, nm->merged});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
  }
  for (int32_t k = 0; k >= 0; k = symbols[k].next) {
    out->push_back({symbols[k].id, symbols[k].begin, symbols[k].end});
  }
}

}  // namespace loom::tok
