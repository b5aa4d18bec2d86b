// The SAEs `loom serve` answers Neuronpedia's routes with (docs/saes.md,
// "HTTP"): configured as interp.saes entries (or `--sae`) "ID=PATH[@HOOK]",
// ID a Neuronpedia source id such as "6-res-jb" (its source set is the text
// after the first '-': "res-jb"), PATH[@HOOK] what `loom extract --sae`
// takes. Loaded once when the server starts (a bad file stops the start,
// naming the entry and the file); each request checks the SAE's hook
// against the model it runs on.
#ifndef LOOM_SERVE_SAE_SET_H_
#define LOOM_SERVE_SAE_SET_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "src/backend/backend.h"
#include "src/base/status.h"
#include "src/model/config.h"
#include "src/model/hooks.h"
#include "src/model/sae.h"

namespace loom::serve {

struct ServedSae {
  std::string id;    // "6-res-jb"
  std::string set;   // "res-jb"
  std::string spec;  // PATH[@HOOK] as configured, for messages
  std::shared_ptr<const Sae> sae;
};

class SaeSet {
 public:
  // Parses and loads every "ID=PATH[@HOOK]" of `specs`; errors name
  // `setting`, the entry and the file. Ids are distinct.
  static StatusOr<std::unique_ptr<SaeSet>> Load(
      const std::vector<std::string>& specs, std::string_view setting);

  const ServedSae* Find(std::string_view id) const;
  const std::vector<ServedSae>& all() const { return saes_; }
  bool empty() const { return saes_.empty(); }
  // The distinct source sets, in the order configured.
  std::vector<std::string> Sets() const;
  // The hooks the SAEs read (Loom's names), distinct: what the engines
  // must capture.
  std::vector<std::string> Hooks() const;

  // The hook `s` reads on a model of `config`, with the SAE's width
  // (InvalidArgument naming the source, the hook and both widths).
  static StatusOr<HookPoint> HookOn(const ServedSae& s,
                                    const ModelConfig& config);
  // Runs `sae` on rows x [rows, d_in] (host memory) with the CPU backend's
  // kernel; one call at a time (the calls share one scratch).
  Status Run(const Sae& sae, const float* x, int64_t rows,
             const SaeOutputs& out);

 private:
  std::vector<ServedSae> saes_;
  std::unique_ptr<Backend> host_;
  std::mutex mu_;  // guards workspace_ and host_'s use
  std::vector<char> workspace_;
};

}  // namespace loom::serve

#endif  // LOOM_SERVE_SAE_SET_H_
