// Harness: an SAE or transcoder directory as published (src/model/sae.h) ->
// LoadSae, then, when it loads, RunSae on a few rows. The input is a mode
// byte (bit 4: Llama Scope's hyperparams.json + checkpoints/final.safetensors;
// else bit 3: Gemma Scope's params.npz, the config ignored; else bit 2:
// Gemma Scope 2's config.json + params.safetensors; else bit 0: SAELens
// files, else sparsify's; bit 1: give a hook as PATH@HOOK), then the config
// and the weights file separated by the first "\n--\n". A file that
// loads must hold tensors of the sizes its config says, and running it must
// write finite top-k indices within d_sae.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "src/backend/cpu/sae_cpu.h"
#include "src/model/sae.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  const fuzz::ModeAndRest in = fuzz::TakeMode(data, size);
  const size_t sep = in.rest.find("\n--\n");
  const std::string_view cfg = in.rest.substr(0, sep);
  const std::string_view weights = sep == std::string_view::npos
                                       ? std::string_view()
                                       : in.rest.substr(sep + 4);
  const bool llama_scope = (in.mode & 16) != 0;
  const bool gemma_scope = (in.mode & 8) != 0;
  const bool gemma_scope_2 = (in.mode & 4) != 0;
  const bool saelens = (in.mode & 1) != 0;
  const std::string dir = fuzz::ScratchDir() + "/sae/layers.2";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (llama_scope) {
    fuzz::WriteScratch("sae/layers.2/hyperparams.json", cfg);
    fuzz::WriteScratch("sae/layers.2/checkpoints/final.safetensors", weights);
  } else if (gemma_scope) {
    fuzz::WriteScratch("sae/layers.2/params.npz", weights);
  } else {
    fuzz::WriteScratch(
        gemma_scope_2 ? "sae/layers.2/config.json" : "sae/layers.2/cfg.json",
        cfg);
    fuzz::WriteScratch(gemma_scope_2 ? "sae/layers.2/params.safetensors"
                       : saelens     ? "sae/layers.2/sae_weights.safetensors"
                                     : "sae/layers.2/sae.safetensors",
                       weights);
  }
  StatusOr<Sae> sae =
      LoadSae(dir, (in.mode & 2) != 0 ? "blocks.2.hook_resid_post" : "");
  if (!sae.ok()) return 0;
  const auto need = [&](const std::vector<float>& v, int64_t n,
                        const char* what) {
    if (static_cast<int64_t>(v.size()) != n)
      fuzz::Fail(std::string(what) + " has " + std::to_string(v.size()) +
                 " values, expected " + std::to_string(n));
  };
  need(sae->w_enc, sae->d_sae * sae->d_in, "w_enc");
  need(sae->b_enc, sae->d_sae, "b_enc");
  need(sae->w_dec, sae->d_sae * sae->d_out, "w_dec");
  need(sae->b_dec, sae->d_out, "b_dec");
  if (HasThreshold(sae->architecture))
    need(sae->threshold, sae->d_sae, "threshold");
  for (float v : sae->w_enc)
    if (!std::isfinite(v)) fuzz::Fail("a non-finite W_enc value loaded");
  if (sae->hook.empty()) fuzz::Fail("loaded with no hook");
  if (sae->architecture == SaeArchitecture::kTopK &&
      (sae->k < 1 || sae->k > sae->d_sae))
    fuzz::Fail("k " + std::to_string(sae->k) + " outside 1.." +
               std::to_string(sae->d_sae));
  // Run small ones: three rows, the top 4 (or d_sae) features.
  if (sae->d_sae * (sae->d_in + sae->d_out) > (int64_t{1} << 20)) return 0;
  const int64_t rows = 3, topk = std::min<int64_t>(4, sae->d_sae);
  std::vector<float> x(rows * sae->d_in), ref(rows * sae->d_out, 0.5f);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  std::vector<float> acts(rows * sae->d_sae), rec(rows * sae->d_out),
      err(rows * sae->d_out), values(rows * topk);
  std::vector<int32_t> indices(rows * topk);
  std::vector<char> ws(cpu::SaeWorkspaceBytes(*sae, rows) + 64);
  SaeOutputs out;
  out.feature_acts = acts.data();
  out.reconstruction = rec.data();
  out.error = err.data();
  out.topk = topk;
  out.topk_indices = indices.data();
  out.topk_values = values.data();
  void* aligned = reinterpret_cast<void*>(
      (reinterpret_cast<uintptr_t>(ws.data()) + 63) & ~uintptr_t{63});
  cpu::RunSae(*sae, x.data(), ref.data(), rows, aligned, out);
  for (int32_t i : indices)
    if (i < 0 || i >= sae->d_sae)
      fuzz::Fail("top-k index " + std::to_string(i) + " outside d_sae " +
                 std::to_string(sae->d_sae));
  return 0;
}
