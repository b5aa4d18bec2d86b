// loom synth OUT_DIR
// [--preset
// tinyllama-1.1b|small|llama-3.1-8b|qwen3-30b-a3b|gpt-oss-20b|deepseek-v3]
// [--layers N]
// [--vocab N]
// [--dtype bf16] [--seed N]
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>

#include "src/model/synth.h"
#include "tools/cli/commands.h"
#include "tools/cli/flag_ranges.h"

namespace loom::cli {

void AddSynthCommand(CLI::App& app, int* exit_code) {
  struct Options {
    std::string out_dir;
    std::string dtype = "bf16";
    SynthOptions synth;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "synth",
      "Write a synthetic checkpoint (llama, Qwen3-MoE, or "
      "gpt-oss with MXFP4 experts) with seeded random weights "
      "(benchmarks, memory tests)");
  cmd->add_option("OUT_DIR", opts->out_dir,
                  "Directory to write config.json and model.safetensors into")
      ->required();
  cmd->add_option("--preset", opts->synth.preset,
                  "tinyllama-1.1b (hidden 2048, 22 layers, 32/4 heads, "
                  "intermediate 5632, vocab 32000), small (hidden 256, 4 "
                  "layers, 8/2 heads, intermediate 688, vocab 4096), "
                  "llama-3.1-8b "
                  "(Llama-3.1-8B's config: hidden 4096, 32 layers, 32/8 "
                  "heads, intermediate 14336, vocab 128256, llama3 RoPE "
                  "scaling; 16 GB in bf16), qwen3-30b-a3b "
                  "(Qwen3-30B-A3B layer shapes: 128 experts top-8 of 768, "
                  "2 layers, vocab 32000), gpt-oss-20b (gpt-oss-20b's "
                  "shapes, 2 layers, vocab 32768, MXFP4 experts) or "
                  "deepseek-v3 (DeepSeek-V3's MLA and MoE shapes: 256 "
                  "experts in 8 groups, top-8; layer 0 dense, layer 1 MoE, "
                  "vocab 32000; 24 GB in bf16)")
      ->capture_default_str();
  cmd->add_option("--layers", opts->synth.num_layers,
                  "Override the number of layers")
      ->check(IntRange(1));
  // Token ids are int32.
  cmd->add_option("--vocab", opts->synth.vocab_size,
                  "Override the vocabulary size")
      ->check(IntRange(1, std::numeric_limits<int32_t>::max()));
  cmd->add_option("--dtype", opts->dtype, "Storage dtype: f32, bf16 or f16")
      ->capture_default_str();
  cmd->add_option("--seed", opts->synth.seed, "Random seed")
      ->capture_default_str()
      ->check(Unsigned64());
  cmd->callback([opts, exit_code] {
    const auto dtype = ParseDType(opts->dtype);
    if (!dtype) {
      *exit_code = ReportStatus(
          "synth", InvalidArgumentError("--dtype '" + opts->dtype +
                                        "': expected f32, bf16 or f16"));
      return;
    }
    opts->synth.dtype = *dtype;
    StatusOr<int64_t> params = WriteSyntheticModel(opts->out_dir, opts->synth);
    if (!params.ok()) {
      *exit_code = ReportStatus("synth", params.status());
      return;
    }
    std::printf("wrote %s/model.safetensors: %lld parameters (%s)\n",
                opts->out_dir.c_str(), static_cast<long long>(*params),
                opts->dtype.c_str());
  });
}

}  // namespace loom::cli
