// GPT-Neo: a GPT-2 block (learned absolute positions, LayerNorm with bias,
// gelu_new MLP c_fc/c_proj with biases, tied lm_head) with separate q/k/v
// projections without bias, an out_proj with bias, attention scores q.k with
// no 1/sqrt(head_dim) scale, and per-layer local (sliding window of
// window_size keys: i - window_size < j <= i) or global attention read from
// attention_layers (or its run-length form attention_types).
#include <string>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

// attention_layers ["local", "global", ...] (one per layer), else
// attention_types [[["local", "global"], repeats], ...] expanded.
StatusOr<std::vector<std::string>> LayerTypes(const ConfigReader& r,
                                              int64_t num_layers) {
  std::vector<std::string> types;
  const nlohmann::json& j = r.json();
  if (j.contains("attention_layers") && j["attention_layers"].is_array()) {
    for (const nlohmann::json& t : j["attention_layers"]) {
      if (!t.is_string())
        return InvalidArgumentError(r.source() + ": attention_layers holds " +
                                    t.dump() +
                                    ", expected \"local\" or "
                                    "\"global\"");
      types.push_back(t.get<std::string>());
    }
  } else if (j.contains("attention_types") && j["attention_types"].is_array()) {
    for (const nlohmann::json& run : j["attention_types"]) {
      if (!run.is_array() || run.size() != 2 || !run[0].is_array() ||
          !run[1].is_number_integer() || run[1].get<int64_t>() < 0 ||
          run[1].get<int64_t>() > num_layers)
        return InvalidArgumentError(r.source() + ": attention_types entry " +
                                    run.dump() +
                                    " is not [[types...], repeats]");
      for (int64_t k = 0; k < run[1].get<int64_t>(); ++k)
        for (const nlohmann::json& t : run[0]) {
          if (!t.is_string())
            return InvalidArgumentError(r.source() +
                                        ": attention_types holds " + t.dump());
          types.push_back(t.get<std::string>());
        }
    }
  } else {
    return InvalidArgumentError(r.source() +
                                ": neither attention_layers nor "
                                "attention_types says which layers are local");
  }
  if (static_cast<int64_t>(types.size()) != num_layers)
    return InvalidArgumentError(
        r.source() + ": attention_layers names " +
        std::to_string(types.size()) +
        " layers, num_layers = " + std::to_string(num_layers));
  for (const std::string& t : types)
    if (t != "local" && t != "global")
      return InvalidArgumentError(r.source() + ": attention layer type '" + t +
                                  "' is not \"local\" or \"global\"");
  return types;
}

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseSizes(r, {"hidden_size", "num_layers", "num_heads"}, c));
  // intermediate_size null (GPTNeoConfig's default): 4 x hidden_size.
  ASSIGN_OR_RETURN(c->intermediate_size,
                   r.Int("intermediate_size", 4 * c->hidden_size));
  ASSIGN_OR_RETURN(c->max_position_embeddings,
                   r.Int("max_position_embeddings"));
  RETURN_IF_ERROR(ParseGptNormAndMlp(r, "gelu_new", c));
  c->qkv_bias = false;
  c->o_bias = c->mlp_bias = true;
  c->tie_word_embeddings = true;
  c->learned_positions = true;
  c->rope.type = RopeConfig::Type::kNone;
  c->attn_scale = 1.0f;  // GPTNeoSelfAttention does not scale q.k
  ASSIGN_OR_RETURN(int64_t window, r.Int("window_size", 256));
  if (window <= 0)
    return InvalidArgumentError(r.source() + ": window_size = " +
                                std::to_string(window) + ", expected > 0");
  ASSIGN_OR_RETURN(const std::vector<std::string> types,
                   LayerTypes(r, c->num_layers));
  c->sliding_window.assign(c->num_layers, 0);
  for (int64_t l = 0; l < c->num_layers; ++l)
    if (types[static_cast<size_t>(l)] == "local") c->sliding_window[l] = window;
  return FinishParse(r, c);
}

ArchWeights Declare(const ModelConfig& c) {
  ArchWeights w;
  SpecList specs(&w);
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  specs.Add("transformer.wte.weight", WeightRole::kEmbed, -1,
            {c.vocab_size, H});
  specs.Add("transformer.wpe.weight", WeightRole::kPosEmbed, -1,
            {c.max_position_embeddings, H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    const std::string a = p + "attn.attention.";
    specs.AddLayerNorm(p + "ln_1", WeightRole::kAttnNorm,
                       WeightRole::kAttnNormBias, i, H);
    specs.Add(a + "q_proj.weight", WeightRole::kQ, i, {H, H}, true);
    specs.Add(a + "k_proj.weight", WeightRole::kK, i, {H, H}, true);
    specs.Add(a + "v_proj.weight", WeightRole::kV, i, {H, H}, true);
    specs.Add(a + "out_proj.weight", WeightRole::kO, i, {H, H}, true);
    specs.Add(a + "out_proj.bias", WeightRole::kOBias, i, {H});
    specs.AddLayerNorm(p + "ln_2", WeightRole::kMlpNorm,
                       WeightRole::kMlpNormBias, i, H);
    specs.Add(p + "mlp.c_fc.weight", WeightRole::kUp, i, {I, H}, true);
    specs.Add(p + "mlp.c_fc.bias", WeightRole::kUpBias, i, {I});
    specs.Add(p + "mlp.c_proj.weight", WeightRole::kDown, i, {H, I}, true);
    specs.Add(p + "mlp.c_proj.bias", WeightRole::kDownBias, i, {H});
  }
  specs.AddLayerNorm("transformer.ln_f", WeightRole::kFinalNorm,
                     WeightRole::kFinalNormBias, -1, H);
  specs.AddLmHead(c, "transformer.wte.weight");
  // Causal-mask buffers older GPT-Neo checkpoints carry.
  w.ignored_suffixes = {".attn.attention.bias", ".attn.attention.masked_bias"};
  w.optional_prefixes = {"transformer."};
  return w;
}

}  // namespace

const ArchDef kGptNeo = {"gpt_neo", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
