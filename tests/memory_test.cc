// Exact memory: (1) Loom's code performs zero heap allocations during a
// forward once the executor exists and its kernels are warm (counting
// allocator: malloc and operator new are replaced in this binary; each
// allocation is attributed by its call stack, and those made inside oneDNN or
// the OpenMP runtime are counted and reported separately — see
// docs/design/memory-plan.md); (2) the executor allocates exactly the
// planner's arenas; (3) resident memory after a run is within 1 % of the plan.
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>

#include "src/backend/cpu/cpu_backend.h"
#include "src/backend/registry.h"
#include "src/model/registry.h"
#include "src/model/synth.h"
#include "src/plan/planner.h"
#include "src/plan/report.h"
#include "src/runtime/executor.h"
#include "src/runtime/memory_stats.h"
#include "src/runtime/model.h"

// ---- Counting allocator
// -------------------------------------------------------
extern "C" void* __libc_malloc(size_t);
extern "C" void* __libc_calloc(size_t, size_t);
extern "C" void* __libc_realloc(void*, size_t);
extern "C" void* __libc_memalign(size_t, size_t);
extern "C" void __libc_free(void*);

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocs{0};          // made by Loom's code
std::atomic<int64_t> g_library_allocs{0};  // made inside oneDNN / libgomp
std::atomic<int64_t> g_library_bytes{0};
thread_local bool t_in_hook = false;

// True when a frame of the current stack lies in oneDNN or the OpenMP runtime.
bool FromLibrary() {
  void* frames[32];
  const int n = backtrace(frames, 32);
  for (int i = 1; i < n; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) && info.dli_fname &&
        (std::strstr(info.dli_fname, "libdnnl") ||
         std::strstr(info.dli_fname, "libgomp")))
      return true;
  }
  return false;
}

inline void Count(size_t bytes = 0) {
  if (!g_counting.load(std::memory_order_relaxed) || t_in_hook) return;
  t_in_hook = true;  // backtrace/dladdr may allocate themselves
  if (FromLibrary()) {
    g_library_allocs.fetch_add(1, std::memory_order_relaxed);
    g_library_bytes.fetch_add(static_cast<int64_t>(bytes),
                              std::memory_order_relaxed);
  } else {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
  }
  t_in_hook = false;
}

// Freed library buffers go back to the OS at once (no dynamic mmap
// threshold), so resident memory after a run reflects what is held.
const bool kMallocConfigured = [] {
  return mallopt(M_MMAP_THRESHOLD, 256 * 1024) == 1;
}();
}  // namespace

extern "C" {
void* malloc(size_t n) {
  Count(n);
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  Count();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  Count(n);
  return __libc_realloc(p, n);
}
void free(void* p) { __libc_free(p); }
void* aligned_alloc(size_t al, size_t n) {
  Count(n);
  return __libc_memalign(al, n);
}
void* memalign(size_t al, size_t n) {
  Count(n);
  return __libc_memalign(al, n);
}
int posix_memalign(void** out, size_t al, size_t n) {
  Count(n);
  *out = __libc_memalign(al, n);
  return *out ? 0 : ENOMEM;
}
}
void* operator new(size_t n) {
  Count(n);
  if (void* p = __libc_malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t) noexcept { __libc_free(p); }
void* operator new(size_t n, std::align_val_t al) {
  Count();
  if (void* p = __libc_memalign(static_cast<size_t>(al), n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t al) {
  return operator new(n, al);
}
void operator delete(void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept {
  __libc_free(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  __libc_free(p);
}

namespace loom {
namespace {

namespace fs = std::filesystem;

HookSet EveryHook(const ModelConfig& c) {
  HookSet hooks;
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (HookSite s :
         {HookSite::kResidPre, HookSite::kLn1, HookSite::kQ, HookSite::kK,
          HookSite::kV, HookSite::kRotQ, HookSite::kRotK, HookSite::kPattern,
          HookSite::kZ, HookSite::kAttnOut, HookSite::kResidMid, HookSite::kLn2,
          HookSite::kMlpPre, HookSite::kMlpPost, HookSite::kMlpOut,
          HookSite::kResidPost})
      hooks.Add({s, l});
  hooks.Add({HookSite::kEmbed, -1});
  hooks.Add({HookSite::kFinalNorm, -1});
  hooks.Add({HookSite::kLogits, -1});
  return hooks;
}

class NullSink : public HookSink {
 public:
  Status OnActivation(const HookPoint&, const Batch&, int64_t, int64_t,
                      const ActivationView& view) override {
    sum_ += view.f32()[0];  // read, do not store
    return Status();
  }
  double sum_ = 0;
};

// --verify-plan's split of resident memory: pages of a file mapping with the
// weights' suffix are `mapped`; other file mappings and anonymous executable
// ones (generated code) are `library`; anonymous data is neither.
TEST(MemoryTest, SmapsSplitsMappedLibraryAndData) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t pages = 16;
  const std::string path =
      (fs::temp_directory_path() /
       ("loom_smaps_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  auto touch = [&](void* p) {
    for (int64_t i = 0; i < pages; ++i)
      static_cast<volatile char*>(p)[i * page] = 1;
  };
  // Twice, checked the second time: the first faults in the libraries' code
  // this sequence runs (the kernel maps file pages 16 at a time around a
  // fault), which is library memory too, but not the mappings under test.
  for (int round = 0; round < 2; ++round) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, page * pages), 0);
    const SmapsRss before = ReadSmapsRss(".safetensors");
    void* file = ::mmap(nullptr, page * pages, PROT_READ | PROT_WRITE,
                        MAP_SHARED, fd, 0);
    void* code =
        ::mmap(nullptr, page * pages, PROT_READ | PROT_WRITE | PROT_EXEC,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* data = ::mmap(nullptr, page * pages, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(file, MAP_FAILED);
    ASSERT_NE(code, MAP_FAILED);
    ASSERT_NE(data, MAP_FAILED);
    touch(file);
    touch(code);
    touch(data);
    const SmapsRss after = ReadSmapsRss(".safetensors");
    ::munmap(file, page * pages);
    ::munmap(code, page * pages);
    ::munmap(data, page * pages);
    ::close(fd);
    fs::remove(path);
    if (round == 0) continue;
    ASSERT_TRUE(before.ok);
    ASSERT_TRUE(after.ok);
    EXPECT_EQ(after.mapped - before.mapped, page * pages);
    // Exactly the code pages: the data pages are neither kind.
    EXPECT_EQ(after.library - before.library, page * pages);
  }
}

TEST(MemoryTest, ForwardMakesNoHeapAllocations) {
  for (Precision p : {Precision::kF32, Precision::kBF16}) {
    auto model = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K", p);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    HookSet hooks = EveryHook((*model)->config());
    auto ex = Executor::Create(
        **model, hooks,
        {.max_tokens = 64, .max_seq_len = 32, .logits_chunk_rows = 16});
    ASSERT_TRUE(ex.ok()) << ex.status().ToString();
    std::vector<int32_t> ids(50);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int32_t>(1 + (i * 37) % 500);
    std::vector<int64_t> starts = {0, 20, 21, 50};
    NullSink sink;
    ASSERT_TRUE((*ex)
                    ->Forward(Batch{ids, starts}, &sink)
                    .ok());  // warm-up: kernels for these shapes
    g_allocs = 0;
    g_library_allocs = 0;
    g_library_bytes = 0;
    g_counting = true;
    Status st = (*ex)->Forward(Batch{ids, starts}, &sink);
    g_counting = false;
    ASSERT_TRUE(st.ok()) << st.ToString();
    const char* name = p == Precision::kF32 ? "f32" : "bf16";
    EXPECT_EQ(g_allocs.load(), 0)
        << "heap allocations by Loom's code during a forward (" << name << ")";
    std::printf(
        "%s forward: 0 allocations by Loom; %lld inside oneDNN/libgomp (%lld "
        "bytes, transient)\n",
        name, static_cast<long long>(g_library_allocs.load()),
        static_cast<long long>(g_library_bytes.load()));
    RecordProperty(std::string(name) + "_library_allocations",
                   std::to_string(g_library_allocs.load()));
  }
}

// Prefill chunks and decode steps over a KV cache allocate nothing either.
TEST(MemoryTest, KvCacheForwardsMakeNoHeapAllocations) {
  auto model = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                           Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  HookSet hooks;
  hooks.Add({HookSite::kFinalNorm, -1});
  hooks.Add({HookSite::kLogits, -1});
  auto ex = Executor::Create(**model, hooks, {.max_tokens = 16});
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto cache = KvCache::Create((*model)->config(), 2, 64, **backend);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  std::vector<int32_t> ids(16);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>(1 + (i * 37) % 500);
  const std::vector<int64_t> slots = {0, 1};
  NullSink sink;
  // Prefill both slots (7 and 9 tokens), then decode steps of one token each.
  std::vector<int64_t> starts = {0, 7, 16}, pos0 = {0, 0};
  auto step = [&]() {
    return (*ex)->Forward(Batch{std::span<const int32_t>(ids).first(
                                    static_cast<size_t>(starts.back())),
                                starts},
                          &sink, {cache->get(), slots, pos0});
  };
  ASSERT_TRUE(step().ok());
  starts = {0, 1, 2};
  pos0 = {7, 9};
  ASSERT_TRUE(step().ok());  // warm-up: kernels for the decode shapes
  pos0 = {8, 10};
  g_allocs = 0;
  g_counting = true;
  Status st = step();
  g_counting = false;
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(g_allocs.load(), 0)
      << "heap allocations by Loom's code during a decode step";
}

// So do the chunks of a streamed extraction row whose hooks stop early: a
// cache of the layers run (0-1), one slot, chunks carrying it.
TEST(MemoryTest, StreamedChunksOfEarlyHooksMakeNoHeapAllocations) {
  auto model = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                           Precision::kF32);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  HookSet hooks;
  hooks.Add({HookSite::kResidPost, 1});
  auto ex = Executor::Create(**model, hooks, {.max_tokens = 16});
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto cache = KvCache::Create((*model)->config(), 1, 64, **backend, {},
                               (*ex)->last_layer() + 1);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  std::vector<int32_t> ids(48);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>(1 + (i * 37) % 500);
  const std::vector<int64_t> slot = {0}, starts = {0, 16};
  std::vector<int64_t> pos0 = {0};
  NullSink sink;
  auto chunk = [&]() {
    return (*ex)->Forward(Batch{std::span<const int32_t>(ids).subspan(
                                    static_cast<size_t>(pos0[0]), 16),
                                starts},
                          &sink, {cache->get(), slot, pos0});
  };
  ASSERT_TRUE(chunk().ok());  // warm-up
  pos0 = {16};
  g_allocs = 0;
  g_counting = true;
  Status st = chunk();
  g_counting = false;
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(g_allocs.load(), 0)
      << "heap allocations by Loom's code during a streamed chunk";
}

TEST(MemoryTest, ExecutorAllocatesExactlyThePlannedArenas) {
  auto model = Model::Load(std::string(LOOM_MODELS_DIR) + "/stories260K",
                           Precision::kF32);
  ASSERT_TRUE(model.ok());
  HookSet hooks;
  hooks.Add({HookSite::kResidPost, 2});
  hooks.Add({HookSite::kLogits, -1});
  ExecutorOptions o{
      .max_tokens = 300, .max_seq_len = 256, .logits_chunk_rows = 64};
  auto ex = Executor::Create(**model, hooks, o);
  ASSERT_TRUE(ex.ok());
  const ActivationLayout plan =
      PlanActivations((*model)->config(), Executor::MakeJob(**model, hooks, o),
                      cpu::CpuKernelCosts());
  EXPECT_EQ((*ex)->arena_bytes(), plan.activations.total_bytes +
                                      plan.workspace.total_bytes +
                                      plan.logits.total_bytes);
  EXPECT_LE(plan.activations.total_bytes, plan.activations.naive_bytes);
}

// Resident memory held by load + forwards vs the planner's CPU total, for a
// synthetic model large enough that process overheads (code, allocator) are
// small.
TEST(MemoryTest, ResidentMemoryWithinOnePercentOfPlan) {
  const std::string dir = (fs::temp_directory_path() /
                           ("loom_mem_synth_" + std::to_string(::getpid())))
                              .string();
  SynthOptions so;
  so.preset = "tinyllama-1.1b";
  so.num_layers = 2;
  so.dtype = DType::kBF16;
  ASSERT_TRUE(WriteSyntheticModel(dir, so).ok());
  HookSet hooks;
  hooks.Add({HookSite::kResidPost, 1});
  hooks.Add({HookSite::kLogits, -1});
  ExecutorOptions eo{
      .max_tokens = 512, .max_seq_len = 512, .logits_chunk_rows = 128};
  // Plan first, as job commands do.
  JobSpec job;
  job.batch_tokens = 512;
  job.context = 512;
  job.hooks = hooks;
  job.logits = true;
  job.logits_chunk_rows = 128;
  job.weight_compute_dtype = DType::kBF16;
  job.selector = Selector::kLast;  // the sink below keeps nothing
  auto cpu = ParseDevice("cpu=24GiB", 24LL << 30);
  ASSERT_TRUE(cpu.ok());
  auto plan = PlanModelDir(dir, job, {*cpu}, 24LL << 30, cpu::CpuKernelCosts());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  int64_t planned = 0;
  for (const auto& d : plan->devices)
    planned += d.device.kind == DeviceKind::kCpu ? d.total() : 0;
  std::printf("%s\n", FormatPlanTable(*plan).c_str());

  ASSERT_TRUE(kMallocConfigured);
  malloc_trim(0);
  int64_t measured_held = 0;
  const int64_t before = CurrentRssBytes();
  const bool peak_reset = ResetPeakRss();  // the peak is only reported; some
                                           // kernels forbid the reset
  {
    auto model = Model::Load(dir, Precision::kBF16);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto ex = Executor::Create(**model, hooks, eo);
    ASSERT_TRUE(ex.ok());
    std::vector<int32_t> ids(512);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int32_t>((i * 7919) % 32000);
    std::vector<int64_t> starts = {0, 512};
    NullSink sink;
    ASSERT_TRUE((*ex)->Forward(Batch{ids, starts}, &sink).ok());
    ASSERT_TRUE((*ex)
                    ->Forward(Batch{ids, starts}, &sink)
                    .ok());  // no growth from run to run
    measured_held = CurrentRssBytes() - before;
  }
  const int64_t peak = PeakRssBytes() - before;
  const int64_t measured = measured_held;
  fs::remove_all(dir);
  const double ratio =
      static_cast<double>(measured) / static_cast<double>(planned);
  RecordProperty("planned_bytes", std::to_string(planned));
  RecordProperty("measured_bytes", std::to_string(measured));
  std::printf(
      "planned %lld bytes, resident after the run %lld bytes (ratio %.4f); "
      "transient peak %lld bytes\n",
      static_cast<long long>(planned), static_cast<long long>(measured), ratio,
      static_cast<long long>(peak));
  RecordProperty("peak_bytes",
                 peak_reset ? std::to_string(peak) : std::string("n/a"));
  EXPECT_NEAR(ratio, 1.0, 0.01)
      << "planned " << planned << " measured " << measured;
}

// The llama-3.1-8b preset has Llama-3.1-8B's shapes: one layer of it (and a
// small vocabulary) writes exactly that layer's parameter count, and the
// config reads back with llama3 RoPE scaling.
TEST(MemoryTest, SynthLlama31Preset) {
  const std::string dir = (fs::temp_directory_path() /
                           ("loom_synth_llama31_" + std::to_string(::getpid())))
                              .string();
  SynthOptions so;
  so.preset = "llama-3.1-8b";
  so.num_layers = 1;
  so.vocab_size = 512;
  so.dtype = DType::kBF16;
  auto params = WriteSyntheticModel(dir, so);
  ASSERT_TRUE(params.ok()) << params.status().ToString();
  // q, o 4096^2; k, v 4096 x 1024; gate, up, down 4096 x 14336; two norms.
  const int64_t layer =
      2 * 4096LL * 4096 + 2 * 4096LL * 1024 + 3 * 4096LL * 14336 + 2 * 4096;
  EXPECT_EQ(*params, layer + 2 * 512LL * 4096 + 4096);
  // The full model: Llama-3.1-8B's 8,030,261,248 parameters.
  EXPECT_EQ(32 * layer + 2 * 128256LL * 4096 + 4096, 8030261248LL);
  auto c = LoadModelConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_layers, 1);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_FLOAT_EQ(c->norm_eps, 1e-5f);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope.type, RopeConfig::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
