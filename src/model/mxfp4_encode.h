// MXFP4 encoding (OCP Microscaling v1.0, the gpt-oss expert format), for
// writing synthetic checkpoints. A block is 32 consecutive values along the
// input dimension:
//   shared_exp = floor(log2(max |v|)) - 2   (2 = emax of E2M1), clamped to
//                [-127, 127]; an all-zero block gets -127;
//   scale byte = shared_exp + 127           (E8M0: 2^(byte - 127));
//   code       = E2M1(v / 2^shared_exp), round to nearest even, saturating at
//                +-6; the sign bit is kept (negative values that round to 0
//                give -0);
//   element 2j in the low nibble of byte j, element 2j + 1 in the high nibble.
// Decoding (transformers' convert_moe_packed_tensors) is
//   E2M1[code] * 2^(byte - 127), E2M1 = [0, .5, 1, 1.5, 2, 3, 4, 6] with bit 3
//   the sign.
#ifndef LOOM_MODEL_MXFP4_ENCODE_H_
#define LOOM_MODEL_MXFP4_ENCODE_H_

#include <cstdint>

namespace loom {

inline constexpr int64_t kMxfp4Block = 32;  // values per shared exponent

// Encodes x[32] (finite) into codes[16]; returns the E8M0 scale byte.
uint8_t EncodeMxfp4Block(const float* x, uint8_t* codes);

// The E2M1 code (0..15) of `q`, already divided by the block scale: round to
// nearest even on the grid {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6.
uint8_t EncodeE2M1(float q);

}  // namespace loom

#endif  // LOOM_MODEL_MXFP4_ENCODE_H_
