// Synthetic checkpoints: a config.json plus model.safetensors with seeded
// random weights of a given shape, for benchmarks and memory tests without
// downloading a model. Matrices ~ U(-a, a) with std 1/sqrt(fan_in), norm
// gains ~ 1 + U(-0.1, 0.1), embeddings std 0.02. Deterministic in the seed.
#ifndef LOOM_MODEL_SYNTH_H_
#define LOOM_MODEL_SYNTH_H_

#include <cstdint>
#include <string>

#include "src/base/status.h"
#include "src/core/dtype.h"

namespace loom {

struct SynthOptions {
  // "tinyllama-1.1b", "small" (hidden 256, 4 layers), "llama-3.1-8b"
  // (Llama-3.1-8B's config: 32 layers, vocab 128256, llama3 RoPE scaling;
  // 16 GB in bf16), "qwen3-30b-a3b"
  // (Qwen3-30B-A3B's layer shapes: 128 experts top-8 of 768, 2 layers, vocab
  // 32000) or "gpt-oss-20b" (2 layers, vocabulary 32768, MXFP4 experts).
  std::string preset = "tinyllama-1.1b";
  int64_t num_layers = 0;  // 0 = the preset's
  int64_t vocab_size = 0;  // 0 = the preset's
  DType dtype = DType::kBF16;
  uint64_t seed = 1;
};

// Writes `out_dir`/config.json and `out_dir`/model.safetensors (llama, or
// gpt_oss for the gpt-oss preset: biases ~ N-like std 0.1, sinks std 1,
// experts encoded to MXFP4 by src/model/mxfp4_encode.h). Returns the number of
// logical parameters written.
StatusOr<int64_t> WriteSyntheticModel(const std::string& out_dir,
                                      const SynthOptions& options);

}  // namespace loom

#endif  // LOOM_MODEL_SYNTH_H_
