// The architecture definitions, one per file in this directory; the registry
// (src/model/registry.cc) lists them in one table.
#ifndef LOOM_MODEL_ARCH_ARCHS_H_
#define LOOM_MODEL_ARCH_ARCHS_H_

#include "src/model/registry.h"

namespace loom::arch {

extern const ArchDef kLlama;
extern const ArchDef kMistral;
extern const ArchDef kQwen2;
extern const ArchDef kQwen3;
extern const ArchDef kGemma;
extern const ArchDef kGemma2;
// gemma3 (multimodal) is planned and inspected only (runnable = false).
extern const ArchDef kGemma3;
extern const ArchDef kGemma3Text;
extern const ArchDef kPhi3;
extern const ArchDef kCodegen;
extern const ArchDef kFalcon;
extern const ArchDef kGpt2;
extern const ArchDef kGptBigcode;
extern const ArchDef kGptNeo;
extern const ArchDef kGptj;
extern const ArchDef kGptNeox;
extern const ArchDef kPhi;
extern const ArchDef kOlmo;
extern const ArchDef kOlmo2;
extern const ArchDef kOpt;
extern const ArchDef kGranite;
extern const ArchDef kStarcoder2;
extern const ArchDef kStablelm;
extern const ArchDef kNemotron;
extern const ArchDef kPersimmon;
extern const ArchDef kCohere;
extern const ArchDef kGlm;
extern const ArchDef kBloom;
// Mixture of experts (src/model/arch/moe.h).
extern const ArchDef kMixtral;
extern const ArchDef kQwen2Moe;
extern const ArchDef kQwen3Moe;
extern const ArchDef kGptOss;
extern const ArchDef kOlmoe;
extern const ArchDef kGranitemoe;
// Multi-head latent attention + group-limited sigmoid routing.
extern const ArchDef kDeepseekV3;

}  // namespace loom::arch

#endif  // LOOM_MODEL_ARCH_ARCHS_H_
