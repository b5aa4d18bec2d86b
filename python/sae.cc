#include "python/sae.h"

#include <pybind11/numpy.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "python/convert.h"
#include "src/backend/registry.h"
#include "src/base/units.h"
#include "src/model/sae.h"

namespace loom::python {
namespace {

class PySae {
 public:
  PySae(const py::object& path, const py::object& hook) {
    const std::string p = StrArg("path", path);
    const std::string h = hook.is_none() ? std::string() : StrArg("hook", hook);
    sae_ = std::make_shared<const Sae>(
        ValueOrRaise(WithoutGil([&] { return LoadSae(p, h); })));
    host_ = ValueOrRaise(CreateBackend("cpu"));
  }

  py::dict Info() const {
    py::dict d;
    d["path"] = sae_->path;
    d["format"] = std::string(SaeFormatName(sae_->format));
    d["architecture"] = std::string(SaeArchitectureName(sae_->architecture));
    d["hook"] = sae_->hook;
    d["hook_out"] = sae_->hook_out.empty()
                        ? py::object(py::none())
                        : py::object(py::str(sae_->hook_out));
    d["d_in"] = sae_->d_in;
    d["d_sae"] = sae_->d_sae;
    d["d_out"] = sae_->d_out;
    d["k"] = sae_->k;
    d["apply_b_dec_to_input"] = sae_->apply_b_dec_to_input;
    d["normalize_activations"] =
        std::string(SaeNormalizationName(sae_->normalization));
    return d;
  }

  py::array DecoderRow(const py::object& feature) const {
    const int64_t f = IntArg("feature", feature);
    if (f < 0 || f >= sae_->d_sae)
      Raise(InvalidArgumentError(
          "feature: " + std::to_string(f) + " is not a feature of " +
          sae_->path + " (0 .. " + std::to_string(sae_->d_sae - 1) + ")"));
    std::vector<float> row(sae_->w_dec.begin() + f * sae_->d_out,
                           sae_->w_dec.begin() + (f + 1) * sae_->d_out);
    return HandOver(std::move(row), py::dtype("float32"), {sae_->d_out});
  }

  // Every output of the SAE on `x` (the estimated hook's `target` gives a
  // transcoder's error).
  py::dict Encode(const py::object& x, const py::object& target,
                  const py::object& topk) const {
    int64_t rows = 0, target_rows = 0;
    const std::vector<float> in =
        FloatRows("x", x, sae_->d_in, "the SAE takes", &rows);
    std::vector<float> ref;
    if (!target.is_none()) {
      ref = FloatRows("target", target, sae_->d_out, "the SAE takes",
                      &target_rows);
      if (target_rows != rows)
        Raise(InvalidArgumentError("target: " + std::to_string(target_rows) +
                                   " rows, x has " + std::to_string(rows)));
    } else if (!IsTranscoder(sae_->architecture)) {
      ref = in;
    }
    const int64_t k = IntArg("topk", topk);
    if (k < 0 || k > sae_->d_sae)
      Raise(InvalidArgumentError("topk: " + std::to_string(k) +
                                 " is outside 0 .. d_sae " +
                                 std::to_string(sae_->d_sae)));
    const int64_t ns = sae_->d_sae, no = sae_->d_out;
    std::vector<float> hidden(rows * ns), acts(rows * ns), recons(rows * no),
        rec(rows * no), err(ref.empty() ? 0 : rows * no), values(rows * k);
    std::vector<int32_t> indices(rows * k);
    SaeOutputs out{hidden.data(),
                   acts.data(),
                   recons.data(),
                   rec.data(),
                   err.empty() ? nullptr : err.data(),
                   k,
                   indices.data(),
                   values.data()};
    CheckOrRaise(WithoutGil([&]() -> Status {
      std::vector<char> ws(host_->SaeWorkspaceBytes(*sae_, rows) + 64);
      return host_->RunSae(*sae_, in.data(), ref.empty() ? nullptr : ref.data(),
                           rows,
                           reinterpret_cast<void*>(AlignUp(
                               reinterpret_cast<intptr_t>(ws.data()), 64)),
                           out);
    }));
    py::dict d;
    const py::dtype f32("float32");
    d["hidden_pre"] = HandOver(std::move(hidden), f32, {rows, ns});
    d["feature_acts"] = HandOver(std::move(acts), f32, {rows, ns});
    d["hook_sae_recons"] = HandOver(std::move(recons), f32, {rows, no});
    d["reconstruction"] = HandOver(std::move(rec), f32, {rows, no});
    if (!err.empty()) d["error"] = HandOver(std::move(err), f32, {rows, no});
    if (k > 0) {
      d["topk_indices"] =
          HandOver(std::move(indices), py::dtype("int32"), {rows, k});
      d["topk_values"] = HandOver(std::move(values), f32, {rows, k});
    }
    return d;
  }

  const std::shared_ptr<const Sae>& loaded() const { return sae_; }

 private:
  std::shared_ptr<const Sae> sae_;  // shared with the extract jobs given it
  std::unique_ptr<Backend> host_;   // runs the SAE (the CPU backend)
};

}  // namespace

std::shared_ptr<const Sae> LoadedSae(const py::handle& obj) {
  if (!py::isinstance<PySae>(obj)) return nullptr;
  return obj.cast<const PySae&>().loaded();
}

void AddSaeClass(py::module_& m) {
  py::class_<PySae>(m, "Sae")
      .def(py::init<const py::object&, const py::object&>(), py::arg("path"),
           py::arg("hook") = py::none())
      .def("_info", &PySae::Info)
      .def("decoder_row", &PySae::DecoderRow, py::arg("feature"),
           "Feature `feature`'s decoder row [d_out] (float32): what steering "
           "by the feature adds, times its coefficient.")
      .def("encode", &PySae::Encode, py::arg("x"),
           py::arg("target") = py::none(), py::arg("topk") = 0,
           "The SAE on activations x [rows, d_in] (or one row): a dict of "
           "hidden_pre and feature_acts [rows, d_sae], hook_sae_recons and "
           "reconstruction [rows, d_out], error (x - reconstruction; a "
           "transcoder's: target - reconstruction, when target is given) and, "
           "with topk, topk_indices (int32) / topk_values [rows, topk], "
           "descending, ties to the lower index.");
}

}  // namespace loom::python
