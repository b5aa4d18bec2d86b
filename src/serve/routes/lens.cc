// POST /v1/lens/prompt (lens.h).
#include "src/serve/routes/lens.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/eval/generate.h"
#include "src/eval/lens.h"
#include "src/serve/routes/common.h"
#include "src/serve/routes/generation.h"
#include "src/serve/routes/neuronpedia.h"

namespace loom::serve::routes {

namespace {

// Rows of the lens's logits computed at a time.
constexpr int64_t kLensChunkRows = 32;

struct LensRequest {
  std::vector<int32_t> ids;  // the prompt
  std::vector<int64_t> layers;
  int64_t top_n = 10;
  int64_t completion_tokens = 0;
  double temperature = 1.0;
  bool prepend_bos = true;
  bool stream = true;
  bool filter = true;  // filterNonWordTokens
  int64_t reuse_len = 0;
};

// A list of integers field (400 naming it).
StatusOr<std::vector<int64_t>> Ints(const json& b, const std::string& key,
                                    int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  if (!b.contains(key) || b[key].is_null()) return out;
  if (!b[key].is_array())
    return InvalidArgumentError("field `" + key + "`: expected a list");
  for (const json& x : b[key]) {
    if (!x.is_number_integer() || x.get<int64_t>() < lo ||
        x.get<int64_t>() > hi)
      return InvalidArgumentError(
          "field `" + key + "`: expected integers in [" + std::to_string(lo) +
          ", " + std::to_string(hi) + "], got " + Dump(x));
    out.push_back(x.get<int64_t>());
  }
  return out;
}

// The prompt's ids: `inputTokenIds` when not empty, else exactly one of
// `prompt` (a text; `prependBos` puts the BOS first or takes it off) and
// `chat` (messages through the model's template).
StatusOr<std::vector<int32_t>> LensIds(const ServerContext& ctx,
                                       const Engine& e, const json& b,
                                       LensRequest* r) {
  const std::string ids_key = NpKey(b, "inputTokenIds", "input_token_ids");
  const int64_t vocab = e.model().config().vocab_size;
  ASSIGN_OR_RETURN(std::vector<int64_t> given, Ints(b, ids_key, 0, vocab - 1));
  if (!given.empty()) return std::vector<int32_t>(given.begin(), given.end());
  const bool text = b.contains("prompt") && !b["prompt"].is_null();
  const bool chat = b.contains("chat") && !b["chat"].is_null();
  if (text == chat)
    return InvalidArgumentError(
        "exactly one of `prompt` and `chat` must be given (or `" + ids_key +
        "`)");
  if (text) {
    if (!b["prompt"].is_string())
      return InvalidArgumentError("field `prompt`: expected a string");
    ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                     Tokens(ctx.options, e, b["prompt"], true));
    SetLeadingBos(e, r->prepend_bos, &ids);
    return ids;
  }
  if (e.chat_template() == nullptr)
    return InvalidArgumentError("field `chat`: model " + e.id() +
                                " has no chat template; send `prompt`");
  ASSIGN_OR_RETURN(nlohmann::ordered_json messages, NpMessages(b, "chat"));
  // A last assistant message is a prefill the model continues.
  const bool prefill = messages.back()["role"] == "assistant";
  ASSIGN_OR_RETURN(
      const bool thinking,
      GetBool(b, NpKey(b, "enableThinking", "enable_thinking"), false));
  nlohmann::ordered_json render = {{"messages", messages},
                                   {"add_generation_prompt", !prefill},
                                   {"continue_final_message", prefill},
                                   {"enable_thinking", thinking}};
  ASSIGN_OR_RETURN(std::string rendered, e.chat_template()->Render(render));
  return Tokens(ctx.options, e, json(rendered), false, "chat");
}

StatusOr<LensRequest> ParseLens(const ServerContext& ctx, const Engine& e,
                                const json& b) {
  LensRequest r;
  const int64_t n = e.model().config().num_layers;
  ASSIGN_OR_RETURN(std::vector<std::string> types, GetStrings(b, "type"));
  if (types.empty())
    return InvalidArgumentError("field `type`: expected [\"LOGIT_LENS\"]");
  for (const std::string& t : types)
    if (t != "LOGIT_LENS")
      return InvalidArgumentError(
          "field `type`: `" + t +
          (t == "JACOBIAN_LENS" ? "` needs a fitted Jacobian lens, and none "
                                  "is loaded (LOGIT_LENS is served)"
                                : "` is no lens type (LOGIT_LENS)"));
  ASSIGN_OR_RETURN(
      r.top_n, GetInt(b, NpKey(b, "topN", "top_n"), 10, 1,
                      std::min<int64_t>(1000, e.model().config().vocab_size)));
  ASSIGN_OR_RETURN(r.layers, Ints(b, "layers", 0, n - 1));
  if (r.layers.empty())  // every layer
    for (int64_t l = 0; l < n; ++l) r.layers.push_back(l);
  r.layers.push_back(n - 1);  // the last layer: always
  std::sort(r.layers.begin(), r.layers.end());
  r.layers.erase(std::unique(r.layers.begin(), r.layers.end()), r.layers.end());
  ASSIGN_OR_RETURN(r.prepend_bos,
                   GetBool(b, NpKey(b, "prependBos", "prepend_bos"), true));
  ASSIGN_OR_RETURN(r.stream, GetBool(b, "stream", true));
  ASSIGN_OR_RETURN(
      r.filter,
      GetBool(b, NpKey(b, "filterNonWordTokens", "filter_non_word_tokens"),
              true));
  ASSIGN_OR_RETURN(r.temperature, GetNumber(b, "temperature", 1.0, 0.0,
                                            eval::kMaxTemperature));
  ASSIGN_OR_RETURN(
      r.completion_tokens,
      GetInt(b, NpKey(b, "numCompletionTokens", "num_completion_tokens"), 0, 0,
             kMaxRequestTokens));
  for (const auto& [camel, snake] :
       {std::pair{"steerLayers", "steer_layers"},
        std::pair{"steerTokens", "steer_tokens"}}) {
    const std::string key = NpKey(b, camel, snake);
    if (b.contains(key) && !b[key].is_null() &&
        !(b[key].is_array() && b[key].empty()))
      return InvalidArgumentError("field `" + key +
                                  "`: steering by lens token is not "
                                  "supported by this server yet");
  }
  const std::string swap = NpKey(b, "swapToken", "swap_token");
  if (b.contains(swap) && !b[swap].is_null())
    return InvalidArgumentError("field `" + swap +
                                "`: not supported by this server yet");
  ASSIGN_OR_RETURN(r.ids, LensIds(ctx, e, b, &r));
  const std::string max_key = NpKey(b, "maxSeqLen", "max_seq_len");
  ASSIGN_OR_RETURN(const int64_t max_len, GetInt(b, max_key, 0, 1, 1 << 30));
  if (max_len > 0 && static_cast<int64_t>(r.ids.size()) > max_len)
    r.ids.resize(static_cast<size_t>(max_len));
  const std::string cached = NpKey(b, "cachedTokenIds", "cached_token_ids");
  ASSIGN_OR_RETURN(std::vector<int64_t> prefix,
                   Ints(b, cached, 0, e.model().config().vocab_size - 1));
  while (r.reuse_len <
             static_cast<int64_t>(std::min(prefix.size(), r.ids.size())) &&
         prefix[r.reuse_len] == r.ids[r.reuse_len])
    ++r.reuse_len;
  return r;
}

// The texts of the tokens a request shows, and whether each is a word for
// filterNonWordTokens (not special, its text holding a letter or a digit;
// any non-ASCII byte counts), decoded once each, when first asked.
class TokenTexts {
 public:
  explicit TokenTexts(const Engine& e) : e_(e) {}
  const std::string& Text(int32_t id) {
    auto it = text_.find(id);
    if (it == text_.end()) it = text_.emplace(id, TokenText(e_, id)).first;
    return it->second;
  }
  bool Word(int32_t id) {
    if (IsSpecialToken(e_, id)) return false;
    for (unsigned char c : Text(id))
      if (c >= 0x80 || std::isalnum(c)) return true;
    return false;
  }

 private:
  const Engine& e_;
  std::unordered_map<int32_t, std::string> text_;
};

// Per row, the topN (token, probability) of the lens at `hook`.
struct Top {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};

// The top_n tokens of logits l [V] (ties to the lower id), with `words`
// only words but the argmax when `keep_top1`: the candidates sorted a
// prefix at a time, the prefix doubled until it holds top_n of them.
std::vector<int32_t> TopTokens(const float* l, int64_t V, int64_t top_n,
                               TokenTexts* words, bool keep_top1,
                               std::vector<int32_t>* order) {
  order->resize(static_cast<size_t>(V));
  std::iota(order->begin(), order->end(), 0);
  auto before = [l](int32_t a, int32_t b) {
    return l[a] != l[b] ? l[a] > l[b] : a < b;
  };
  std::vector<int32_t> out;
  for (int64_t k = std::min(V, top_n);; k = std::min(V, 2 * k)) {
    std::partial_sort(order->begin(), order->begin() + k, order->end(), before);
    out.clear();
    for (int64_t j = 0; j < k && static_cast<int64_t>(out.size()) < top_n;
         ++j) {
      const int32_t id = (*order)[static_cast<size_t>(j)];
      if (words == nullptr || words->Word(id) || (keep_top1 && j == 0))
        out.push_back(id);
    }
    if (static_cast<int64_t>(out.size()) == top_n || k == V) return out;
  }
}

// Per row of rows [T, width] read at `hook`: the top_n tokens of the lens
// (TopTokens) and their probabilities over the whole vocabulary.
StatusOr<std::vector<Top>> LensTops(eval::Lens& lens, const HookPoint& hook,
                                    const float* rows, int64_t T, int64_t width,
                                    int64_t top_n, TokenTexts* words,
                                    bool keep_top1) {
  const int64_t V = lens.vocab();
  std::vector<float> logits(static_cast<size_t>(kLensChunkRows * V));
  std::vector<int32_t> order;
  std::vector<Top> out(static_cast<size_t>(T));
  for (int64_t r0 = 0; r0 < T; r0 += kLensChunkRows) {
    const int64_t C = std::min(kLensChunkRows, T - r0);
    eval::LensOutputs o;
    o.logits = logits.data();
    RETURN_IF_ERROR(lens.Run(hook, rows + r0 * width, C, o));
    for (int64_t i = 0; i < C; ++i) {
      const float* l = logits.data() + i * V;
      const float max = *std::max_element(l, l + V);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double{l[v]} - max);
      const double log_z = max + std::log(sum);
      Top& t = out[static_cast<size_t>(r0 + i)];
      t.ids = TopTokens(l, V, top_n, words, keep_top1, &order);
      for (int32_t id : t.ids)
        t.probs.push_back(std::round(std::exp(double{l[id]} - log_z) * 1e4) /
                          1e4);
    }
  }
  return out;
}

// The hook a layer's lens reads: blocks.L.hook_resid_post, captured as
// blocks.(L+1).hook_resid_pre (the same rows) below the last layer.
HookPoint LayerResidual(int64_t layer, int64_t num_layers) {
  if (layer + 1 < num_layers) return {HookSite::kResidPre, layer + 1};
  return {HookSite::kResidPost, layer};
}

json TokenFrame(const std::vector<std::string>& strs,
                const std::vector<int32_t>& ids, int64_t t, int64_t prompt_len,
                const std::vector<std::vector<Top>>& tops, TokenTexts& texts) {
  json top_tokens = json::array(), top_probs = json::array(),
       top_ids = json::array();
  for (const std::vector<Top>& layer : tops) {
    const Top& top = layer[static_cast<size_t>(t)];
    json words = json::array();
    for (int32_t id : top.ids) words.push_back(texts.Text(id));
    top_tokens.push_back(std::move(words));
    top_probs.push_back(top.probs);
    top_ids.push_back(top.ids);
  }
  return {{"kind", "token"},
          {"position", t},
          {"token", strs[static_cast<size_t>(t)]},
          {"id", ids[static_cast<size_t>(t)]},
          {"is_generated", t >= prompt_len},
          {"results",
           {{{"type", "LOGIT_LENS"},
             {"top_tokens", std::move(top_tokens)},
             {"top_probs", std::move(top_probs)},
             {"top_ids", std::move(top_ids)}}}},  // Loom's: the tokens' ids
          {"is_char_continuation", false},
          {"message_index", nullptr},
          {"role", nullptr},
          {"channel", nullptr},
          {"section", nullptr}};
}

Status LensPrompt(ServerContext& ctx, const httplib::Request& req,
                  httplib::Response& res) {
  ASSIGN_OR_RETURN(json b, ParseBody(req.body));
  ASSIGN_OR_RETURN(auto e, NpEngine(ctx, b));
  ASSIGN_OR_RETURN(LensRequest r, ParseLens(ctx, *e, b));
  const ModelConfig& c = e->model().config();
  // The lens runs the model's final norm and head on the host.
  for (const DevicePlan& d : e->session().plan().devices)
    if (d.holds_head && d.device.kind != DeviceKind::kCpu)
      return UnimplementedError("/v1/lens/prompt: model " + e->id() +
                                "'s head is placed on " + d.device.name +
                                "; the lens runs on the host so far");
  std::vector<int32_t> ids = r.ids;
  const int64_t prompt_len = static_cast<int64_t>(ids.size());
  std::string completion;
  if (r.completion_tokens > 0) {
    GenRequest g;
    g.prompt = ids;
    g.max_new_tokens = r.completion_tokens;
    g.sampling.temperature = static_cast<float>(r.temperature);
    g.stop_ids = e->stop_ids();
    ASSIGN_OR_RETURN(std::shared_ptr<Ticket> t, e->Submit(std::move(g)));
    ASSIGN_OR_RETURN(GenResult done, t->Wait());
    ids.insert(ids.end(), done.token_ids.begin(), done.token_ids.end());
    completion = std::move(done.text);
  }
  GenRequest capture;
  capture.prompt = ids;
  capture.rows = CaptureRows::kAll;
  for (int64_t l : r.layers)
    capture.hooks.push_back(LayerResidual(l, c.num_layers));
  ASSIGN_OR_RETURN(std::shared_ptr<Ticket> t, e->Submit(std::move(capture)));
  ASSIGN_OR_RETURN(GenResult g, t->Wait());
  ASSIGN_OR_RETURN(std::unique_ptr<eval::Lens> lens,
                   eval::Lens::Create(e->model(), nullptr, kLensChunkRows));
  TokenTexts texts(*e);
  std::vector<std::vector<Top>> tops;
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const bool last = r.layers[i] == c.num_layers - 1;
    ASSIGN_OR_RETURN(std::vector<Top> layer,
                     LensTops(*lens, LayerResidual(r.layers[i], c.num_layers),
                              g.captures[i].data(), g.rows, g.widths[i],
                              r.top_n, r.filter ? &texts : nullptr, last));
    tops.push_back(std::move(layer));
  }
  const std::vector<std::string> strs = TokenStrings(*e, ids);
  const json meta = {{"kind", "meta"},
                     {"model", e->id()},
                     {"types", {"LOGIT_LENS"}},
                     {"layers_by_type", {{"LOGIT_LENS", r.layers}}},
                     {"top_n", r.top_n},
                     {"prompt_len", prompt_len},
                     {"num_completion_tokens", r.completion_tokens},
                     {"temperature", r.temperature},
                     {"prepend_bos", r.prepend_bos},
                     {"reuse_len", r.reuse_len}};
  const json done = {{"kind", "done"},
                     {"seq_len", ids.size()},
                     {"prompt_len", prompt_len},
                     {"vocab_size", c.vocab_size},
                     {"completion", completion}};
  json frames = json::array();
  for (int64_t p = r.reuse_len; p < static_cast<int64_t>(ids.size()); ++p)
    frames.push_back(TokenFrame(strs, ids, p, prompt_len, tops, texts));
  if (!r.stream) {
    Reply(res, 200, {{"meta", meta}, {"tokens", frames}, {"done", done}});
    return Status();
  }
  json prompt_tokens = json::array();
  for (int64_t p = 0; p < prompt_len; ++p)
    prompt_tokens.push_back({{"position", p},
                             {"token", strs[static_cast<size_t>(p)]},
                             {"id", ids[static_cast<size_t>(p)]},
                             {"is_generated", false},
                             {"is_char_continuation", false},
                             {"message_index", nullptr},
                             {"role", nullptr},
                             {"channel", nullptr},
                             {"section", nullptr}});
  std::string body = Dump(meta) + "\n" +
                     Dump({{"kind", "prompt"}, {"tokens", prompt_tokens}}) +
                     "\n";
  for (const json& f : frames) body += Dump(f) + "\n";
  body += Dump(done) + "\n";
  res.status = 200;
  res.set_content(body, "application/x-ndjson");
  return Status();
}

}  // namespace

void RegisterLensRoutes(HttpListeners& http, ServerContext& ctx) {
  NpPost(http, ctx, "/v1/lens/prompt", LensPrompt);
}

}  // namespace loom::serve::routes
