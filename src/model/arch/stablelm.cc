// StableLM (stabilityai/stablelm-2-*, stablelm-3b-4e1t, stablelm-zephyr): the
// Llama layout with LayerNorms with bias (layer_norm_eps), q/k/v biases
// (use_qkv_bias; o_proj has none), a SwiGLU MLP without biases, partial
// rotary (partial_rotary_factor, half-split within the rotated dims) and,
// with qk_layernorm, a LayerNorm without bias of each head's own on q and k
// before RoPE (q_layernorm.norms.h: QkNormKind::kPerHeadOwn). With
// use_parallel_residual the block is x + attn(ln1(x)) + mlp(ln1(x)), one
// norm for both branches and no post_attention_layernorm.
#include <string>
#include <tuple>

#include "src/model/arch/archs.h"
#include "src/model/arch/common.h"

namespace loom::arch {
namespace {

Status Parse(const ConfigReader& r, ModelConfig* c) {
  RETURN_IF_ERROR(ParseDecoderBase(r, /*tie_default=*/false, c));
  RETURN_IF_ERROR(ParseLayerNorm(r, "layer_norm_eps", c));
  ASSIGN_OR_RETURN(c->qkv_bias, r.Bool("use_qkv_bias", false));
  ASSIGN_OR_RETURN(const bool qk_layernorm, r.Bool("qk_layernorm", false));
  if (qk_layernorm) {
    c->qk_norm = QkNormKind::kPerHeadOwn;
    c->qk_norm_type = NormKind::kLayer;
  }
  ASSIGN_OR_RETURN(const bool parallel, r.Bool("use_parallel_residual", false));
  if (parallel) {
    c->block = BlockKind::kParallelSharedNorm;
    c->pre_mlp_norm = false;
  }
  return Status();
}

ArchWeights Declare(const ModelConfig& c) {
  DecoderNames names;
  if (c.block == BlockKind::kParallelSharedNorm) names.mlp_norm.clear();
  // The q/k norms are one tensor per head, declared below.
  ModelConfig without_qk_norm = c;
  without_qk_norm.qk_norm = QkNormKind::kNone;
  ArchWeights w = DeclareDecoderWeights(without_qk_norm, names);
  if (c.qk_norm != QkNormKind::kPerHeadOwn) return w;
  // One LayerNorm weight [head_dim] per head, bound as expert h.
  SpecList specs(&w);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
    for (const auto& [name, role, heads] :
         {std::tuple{"q_layernorm", WeightRole::kQNorm, c.num_heads},
          std::tuple{"k_layernorm", WeightRole::kKNorm, c.num_kv_heads}})
      for (int64_t h = 0; h < heads; ++h) {
        specs.Add(p + name + ".norms." + std::to_string(h) + ".weight", role, i,
                  {c.head_dim});
        w.specs.back().expert = h;
      }
  }
  return w;
}

}  // namespace

const ArchDef kStablelm = {"stablelm", Parse, Declare, /*runnable=*/true};

}  // namespace loom::arch
