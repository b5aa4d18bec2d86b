// Weight storage formats: ONE table (format.cc) of how a logical weight
// matrix [..., out, in] is stored in a checkpoint, as values plus scales:
//
// clang-format off
//   format            values                   block scales            global / input scales
//   dense             F32 | BF16 | F16         -                       -
//   fp8-per-tensor    weight F8_E4M3           -                       weight_scale F32 [],
//     (ModelOpt)        [out, in]                                        input_scale F32 []
//   fp8-block         weight F8_E4M3           weight_scale_inv        -
//                       [out, in]                BF16 | F32
//                                                [ceil(out/bo), ceil(in/bi)]
//   mxfp4 (gpt-oss)   <w>_blocks U8            <w>_scales U8 (E8M0)    -
//                       [out, in/32, 16]         [out, in/32]
//   nvfp4-modelopt    weight U8 [out, in/2]    weight_scale F8_E4M3    weight_scale_2 F32 [],
//                                                [out, in/16]            input_scale F32 []
//   nvfp4-compressed- weight_packed U8         weight_scale F8_E4M3    weight_global_scale F32 [1],
//     tensors           [out, in/2]              [out, in/16]            input_global_scale F32 [1]
// clang-format on
//
// FP4 values are E2M1 codes, two per byte (the even element in the low
// nibble). Leading dimensions (stacked experts [E, out, in]) prefix every
// tensor of the weight, scalar scales included ([] -> [E]).
//
// Physical names derive from the logical weight's name N ("...q_proj.weight",
// or gpt-oss's "...experts.gate_up_proj"): a component is either N + suffix
// ("weight" -> "weight_scale") or a sibling, the module (N up to its last '.')
// + "." + name ("...q_proj.input_scale").
#ifndef LOOM_CORE_FORMAT_H_
#define LOOM_CORE_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"
#include "src/core/dtype.h"
#include "src/core/tensor.h"

namespace loom {

enum class FormatKind : uint8_t {
  kDense,
  kFp8PerTensor,
  kFp8Block,
  kMxfp4,
  kNvfp4ModelOpt,
  kNvfp4CompressedTensors,
};

// What a physical tensor of a weight holds.
enum class ComponentKind : uint8_t {
  kValues,        // the (possibly packed) elements
  kBlockScales,   // one scale per block of values
  kGlobalScale,   // one weight scale per tensor (per expert when stacked)
  kInputScale,    // activation scale (stored; weight-only decoding ignores it)
  kKvCacheScale,  // FP8 KV-cache scale riding on a k/v projection (ModelOpt)
};
std::string_view ComponentName(ComponentKind k);  // "values", ...

// How one component's shape is derived from the logical [..., out, in].
enum class ComponentShape : uint8_t {
  kSame,        // [..., out, in]
  kPacked,      // [..., out, in x bits / 8]          (FP4: in / 2)
  kMxBlocks,    // [..., out, in / block, block x bits / 8]
  kPerBlockIn,  // [..., out, in / block]             (MX, NVFP4 groups)
  kPerBlock2d,  // [..., ceil(out / bo), ceil(in / bi)]  (FP8 blocks)
  kScalar,      // [...]  (no trailing dimension)
  kOne,         // [..., 1]
};

struct FormatComponent {
  ComponentKind kind;
  std::string_view name;  // suffix appended to the weight's name, or sibling
  bool sibling;           // true: module + "." + name
  DType stored;           // dtype in the file (U8 for packed FP4 / E8M0)
  DType element;          // what the bytes encode (kF4E2M1, kF8E8M0, ...)
  ComponentShape shape;
  // The stored dtype is the checkpoint's choice (FP8 block scales: BF16 or
  // F32): `stored` is only the default (WeightFormat::scale_dtype).
  bool stored_varies = false;
};

// One row of the format table.
struct FormatInfo {
  FormatKind kind;
  std::string_view name;  // "mxfp4", "nvfp4-modelopt", ...
  int value_bits;         // bits per stored value (dense: 0 = the dtype's)
  DType value_element;    // element type of the values (dense: the dtype)
  int64_t block_in;       // values per block scale along `in`; 0 = none;
                          // -1 = from the config (FP8 weight_block_size)
  std::vector<FormatComponent> components;
};

// The table, one row per FormatKind in enum order.
const std::vector<FormatInfo>& AllFormats();
const FormatInfo& GetFormatInfo(FormatKind kind);
std::string_view FormatName(FormatKind kind);

// A weight's storage format: a table row plus what the checkpoint chooses.
struct WeightFormat {
  FormatKind kind = FormatKind::kDense;
  // kDense: the stored dtype; nullopt = unknown (read from the checkpoint, or
  // assumed by the planner).
  std::optional<DType> dtype;
  // kFp8Block: weight_block_size [block_out, block_in].
  int64_t block_out = 0;
  int64_t block_in = 0;
  // kFp8Block: the dtype of weight_scale_inv (BF16 or F32).
  DType scale_dtype = DType::kF32;

  bool quantized() const { return kind != FormatKind::kDense; }
  // "bf16", "mxfp4", "fp8-block[128x128]", ...
  std::string ToString() const;
};

// A physical tensor of a weight.
struct PhysicalTensor {
  ComponentKind component = ComponentKind::kValues;
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;    // stored dtype
  DType element = DType::kF32;  // what it encodes
  bool dtype_varies = false;    // the checkpoint may choose another dtype
  int64_t bytes = 0;            // exact stored bytes
};

// Expands a logical weight to its physical tensors. `shape` is [..., out, in]
// for quantized formats; for kDense it is the stored shape, whatever its
// layout, and `format.dtype` must be set. Errors (InvalidArgument, naming
// `name`) when `in` is not a multiple of the format's block or rank < 2.
StatusOr<std::vector<PhysicalTensor>> ExpandWeight(const WeightFormat& format,
                                                   const std::string& name,
                                                   const Shape& shape);

// Exact stored bytes of a logical shape: values + block scales + global and
// input scales.
StatusOr<int64_t> StorageBytes(const WeightFormat& format, const Shape& shape);

}  // namespace loom

#endif  // LOOM_CORE_FORMAT_H_
