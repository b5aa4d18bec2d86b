#include "src/eval/extract.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <set>

#include "src/backend/cpu/kernels.h"
#include "src/io/npy.h"
#include "src/io/safetensors_writer.h"
#include "src/model/hooks.h"
#include "src/runtime/executor.h"
#include "src/runtime/memory_stats.h"
#include "src/tokenizer/tokenizer.h"
#include "src/tokenizer/utf8.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int kManifestVersion = 1;

// ---- Hashing ----------------------------------------------------------------

std::string Hex(const unsigned char* d, unsigned n) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) s += {k[d[i] >> 4], k[d[i] & 15]};
  return s;
}

StatusOr<std::string> Sha256File(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return IoError(path + ": cannot open: " + std::strerror(errno));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                              &EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0)
    EVP_DigestUpdate(ctx.get(), buf.data(), n);
  const bool err = std::ferror(f);
  std::fclose(f);
  if (err) return IoError(path + ": read error");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return Hex(md, len);
}

// ---- Small file helpers
// -------------------------------------------------------

Status WriteFileDurably(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError(tmp + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t w = ::write(fd, content.data() + done, content.size() - done);
    if (w < 0) {
      ::close(fd);
      return IoError(tmp + ": write failed: " + std::strerror(errno));
    }
    done += static_cast<size_t>(w);
  }
  if (::fdatasync(fd) != 0 || ::close(fd) != 0)
    return IoError(tmp + ": sync failed: " + std::strerror(errno));
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return IoError(path + ": rename failed: " + std::strerror(errno));
  const int dfd = ::open(fs::path(path).parent_path().c_str(),
                         O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status();
}

// ---- Input ---------------------------------------------------------------

struct InputRow {
  int64_t index = 0;
  Json id;
  std::string text;
  bool has_tokens = false;
  std::vector<int32_t> tokens;
  std::string error;  // non-empty: the row is bad
};

class InputReader {
 public:
  static StatusOr<std::unique_ptr<InputReader>> Open(const std::string& path,
                                                     int64_t offset,
                                                     int64_t first_index) {
    auto r = std::unique_ptr<InputReader>(new InputReader());
    r->path_ = path;
    r->file_ = std::fopen(path.c_str(), "rb");
    if (!r->file_)
      return NotFoundError("--input " + path +
                           ": cannot open: " + std::strerror(errno));
    // JSONL when the extension says so or the first non-blank byte is '{'.
    const std::string ext = fs::path(path).extension().string();
    r->jsonl_ = ext == ".jsonl" || ext == ".json";
    if (!r->jsonl_) {
      int c;
      while ((c = std::fgetc(r->file_)) != EOF && std::isspace(c)) {
      }
      r->jsonl_ = c == '{';
    }
    if (::fseeko(r->file_, offset, SEEK_SET) != 0)
      return IoError(path + ": seek failed");
    r->offset_ = offset;
    r->next_index_ = first_index;
    return r;
  }
  ~InputReader() {
    if (file_) std::fclose(file_);
    std::free(line_);
  }
  bool jsonl() const { return jsonl_; }
  int64_t offset() const { return offset_; }

  // False at end of input.
  StatusOr<bool> Next(InputRow* row, bool replace_invalid_utf8) {
    for (;;) {
      const ssize_t n = ::getline(&line_, &cap_, file_);
      if (n < 0) {
        if (std::ferror(file_)) return IoError(path_ + ": read error");
        return false;
      }
      offset_ += n;
      std::string_view line(line_, static_cast<size_t>(n));
      if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (jsonl_ && line.find_first_not_of(" \t") == std::string_view::npos)
        continue;  // blank JSONL line
      *row = InputRow();
      row->index = next_index_++;
      row->id = row->index;
      const size_t bad = tok::FindInvalidUtf8(line);
      if (bad != std::string_view::npos && (jsonl_ || !replace_invalid_utf8)) {
        row->error =
            "invalid UTF-8 at byte " + std::to_string(bad) + " of the line";
        return true;
      }
      if (!jsonl_) {
        row->text = std::string(line);
        return true;
      }
      Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        row->error = "not a JSON object";
        return true;
      }
      if (j.contains("id") && !j["id"].is_null()) row->id = j["id"];
      if (j.contains("tokens")) {
        row->has_tokens = true;
        if (!j["tokens"].is_array()) {
          row->error = "'tokens' is not an array";
          return true;
        }
        for (const auto& t : j["tokens"]) {
          if (!t.is_number_integer()) {
            row->error = "'tokens' holds " + t.dump() + ", expected integers";
            return true;
          }
          const int64_t v = t.get<int64_t>();
          if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
            row->error = "token id " + std::to_string(v) + " is out of range";
            return true;
          }
          row->tokens.push_back(static_cast<int32_t>(v));
        }
      } else if (j.contains("text") && j["text"].is_string()) {
        row->text = j["text"].get<std::string>();
      } else {
        row->error = "the row has neither a 'text' string nor a 'tokens' array";
      }
      return true;
    }
  }

 private:
  InputReader() = default;
  std::string path_;
  FILE* file_ = nullptr;
  char* line_ = nullptr;
  size_t cap_ = 0;
  bool jsonl_ = false;
  int64_t offset_ = 0;
  int64_t next_index_ = 0;
};

// ---- Outputs
// -------------------------------------------------------------------

// One output array: a hook x selector pair.
struct Output {
  HookPoint hook;
  std::string hook_name;
  RowSelector sel;
  int64_t width = 0;  // values per selected row
  std::string file;   // "<hook>.<selector>.npy"
  std::unique_ptr<NpyWriter> npy;
  // Window staging: fixed selectors [slots, rows_per_prompt, width] in the
  // output dtype; ragged ones [window rows, width]; mean/max accumulate in acc.
  std::vector<uint8_t> stage;
  std::vector<double> acc;
};

struct RaggedIndex {  // per ragged selector: offsets file and window layout
  std::string file;   // "<selector>.offsets.npy"
  std::unique_ptr<NpyWriter> npy;
  std::vector<int64_t> slot_begin;  // row of each slot within the window
  int64_t window_rows = 0;
};

// Prepared row of the current window.
struct Prepared {
  int64_t index = 0;
  Json id;
  std::vector<int32_t> ids;
  std::string reason;  // non-empty: skipped
  bool ok() const { return reason.empty(); }
};

struct SpanRange {
  int64_t begin = 0, end = 0;
};
// Resolves a span selector for a row of `len` tokens (negative = from the end).
bool ResolveSpan(const RowSelector& s, int64_t len, SpanRange* r) {
  int64_t a = s.span_begin < 0 ? len + s.span_begin : s.span_begin;
  int64_t b = s.span_end < 0 ? len + s.span_end : s.span_end;
  if (a < 0 || b > len || a >= b) return false;
  *r = {a, b};
  return true;
}

class ExtractSink : public HookSink {
 public:
  ExtractSink(std::vector<Output>* outputs, std::vector<RaggedIndex>* ragged,
              const std::vector<int>* ragged_of, DType dtype)
      : outputs_(outputs),
        ragged_(ragged),
        ragged_of_(ragged_of),
        dtype_(dtype) {}

  // Which window slot each sequence of the next batch fills.
  void SetBatch(const std::vector<int64_t>* slot_of_seq) {
    slot_of_seq_ = slot_of_seq;
  }

  Status OnActivation(const HookPoint& hook, const Batch& batch, int64_t seq,
                      int64_t row_begin, const ActivationView& view) override {
    const int64_t rows = view.rows, cols = view.cols, ld = view.ld;
    const float* data = view.f32();
    const int64_t ds = DTypeSize(dtype_);
    for (size_t oi = 0; oi < outputs_->size(); ++oi) {
      Output& o = (*outputs_)[oi];
      if (!(o.hook == hook)) continue;
      LOOM_CHECK_EQ(cols, o.width);
      const int64_t row_end = row_begin + rows;
      for (int64_t s = 0; s < batch.num_seqs(); ++s) {
        const int64_t b = batch.seq_start[s], e = batch.seq_start[s + 1],
                      len = e - b;
        if (e <= row_begin || b >= row_end) continue;
        const int64_t slot = (*slot_of_seq_)[s];
        auto row_ptr = [&](int64_t p) {
          return data + (b + p - row_begin) * ld;
        };  // position p of seq s
        auto in_chunk = [&](int64_t p) {
          return b + p >= row_begin && b + p < row_end;
        };
        switch (o.sel.kind) {
          case RowSelector::Kind::kLast:
          case RowSelector::Kind::kFirst: {
            const int64_t p =
                o.sel.kind == RowSelector::Kind::kLast ? len - 1 : 0;
            if (in_chunk(p))
              cpu::ConvertFromF32(row_ptr(p), &o.stage[slot * o.width * ds],
                                  dtype_, o.width);
            break;
          }
          case RowSelector::Kind::kPos: {
            const int64_t n = static_cast<int64_t>(o.sel.positions.size());
            for (int64_t k = 0; k < n; ++k) {
              const int64_t p = o.sel.positions[k] < 0
                                    ? len + o.sel.positions[k]
                                    : o.sel.positions[k];
              if (in_chunk(p))
                cpu::ConvertFromF32(row_ptr(p),
                                    &o.stage[(slot * n + k) * o.width * ds],
                                    dtype_, o.width);
            }
            break;
          }
          case RowSelector::Kind::kMean:
          case RowSelector::Kind::kMax: {
            double* acc = &o.acc[slot * o.width];
            const bool mean = o.sel.kind == RowSelector::Kind::kMean;
            for (int64_t t = std::max(b, row_begin); t < std::min(e, row_end);
                 ++t) {
              const float* r = data + (t - row_begin) * ld;
              if (mean) {
                for (int64_t j = 0; j < o.width; ++j) acc[j] += r[j];
              } else {
                for (int64_t j = 0; j < o.width; ++j)
                  acc[j] = std::max(acc[j], static_cast<double>(r[j]));
              }
            }
            break;
          }
          case RowSelector::Kind::kAll:
          case RowSelector::Kind::kSpan: {
            SpanRange span{0, len};
            if (o.sel.kind == RowSelector::Kind::kSpan)
              LOOM_CHECK(ResolveSpan(o.sel, len, &span));
            const RaggedIndex& ri = (*ragged_)[(*ragged_of_)[oi]];
            for (int64_t p = span.begin; p < span.end; ++p) {
              if (!in_chunk(p)) continue;
              const int64_t dst_row = ri.slot_begin[slot] + (p - span.begin);
              cpu::ConvertFromF32(row_ptr(p), &o.stage[dst_row * o.width * ds],
                                  dtype_, o.width);
            }
            break;
          }
        }
      }
    }
    return Status();
  }

 private:
  std::vector<Output>* outputs_;
  std::vector<RaggedIndex>* ragged_;
  const std::vector<int>* ragged_of_;
  DType dtype_;
  const std::vector<int64_t>* slot_of_seq_ = nullptr;
};

int64_t HookWidth(HookSite site, const ModelConfig& c) {
  switch (site) {
    case HookSite::kQ:
    case HookSite::kRotQ:
    case HookSite::kZ:
      return c.q_dim();
    case HookSite::kK:
    case HookSite::kV:
    case HookSite::kRotK:
      return c.kv_dim();
    case HookSite::kMlpPre:
    case HookSite::kMlpPost:
      return c.intermediate_size;
    case HookSite::kLogits:
      return c.vocab_size;
    default:
      return c.hidden_size;
  }
}

std::string SelectorKindName(RowSelector::Kind k) {
  switch (k) {
    case RowSelector::Kind::kLast:
      return "last";
    case RowSelector::Kind::kFirst:
      return "first";
    case RowSelector::Kind::kMean:
      return "mean";
    case RowSelector::Kind::kMax:
      return "max";
    case RowSelector::Kind::kAll:
      return "all";
    case RowSelector::Kind::kPos:
      return "pos";
    case RowSelector::Kind::kSpan:
      return "span";
  }
  return "?";
}

}  // namespace

// ---- Public helpers
// ---------------------------------------------------------------

StatusOr<RowSelector> ParseRowSelector(const std::string& text) {
  RowSelector s;
  s.spec = text;
  auto parse_int = [&](const std::string& v, int64_t* out) -> Status {
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || end != v.c_str() + v.size())
      return InvalidArgumentError("selector '" + text + "': '" + v +
                                  "' is not an integer");
    *out = x;
    return Status();
  };
  if (text == "last")
    s.kind = RowSelector::Kind::kLast;
  else if (text == "first")
    s.kind = RowSelector::Kind::kFirst;
  else if (text == "mean")
    s.kind = RowSelector::Kind::kMean;
  else if (text == "max")
    s.kind = RowSelector::Kind::kMax;
  else if (text == "all")
    s.kind = RowSelector::Kind::kAll;
  else if (text.rfind("pos:", 0) == 0) {
    s.kind = RowSelector::Kind::kPos;
    std::string rest = text.substr(4);
    size_t start = 0;
    while (start <= rest.size()) {
      const size_t comma = rest.find(',', start);
      int64_t v;
      RETURN_IF_ERROR(parse_int(
          rest.substr(start, comma == std::string::npos ? std::string::npos
                                                        : comma - start),
          &v));
      s.positions.push_back(v);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else if (text.rfind("span:", 0) == 0) {
    s.kind = RowSelector::Kind::kSpan;
    const std::string rest = text.substr(5);
    const size_t colon = rest.find(':');
    if (colon == std::string::npos)
      return InvalidArgumentError("selector '" + text + "': expected span:A:B");
    RETURN_IF_ERROR(parse_int(rest.substr(0, colon), &s.span_begin));
    RETURN_IF_ERROR(parse_int(rest.substr(colon + 1), &s.span_end));
    if (s.span_begin >= 0 && s.span_end >= 0 && s.span_begin >= s.span_end)
      return InvalidArgumentError("selector '" + text +
                                  "': empty span (A must be < B)");
  } else {
    return InvalidArgumentError(
        "selector '" + text +
        "': expected last, first, mean, max, all, pos:I[,J...] or span:A:B");
  }
  s.file_name = SelectorKindName(s.kind);
  for (int64_t p : s.positions) s.file_name += "_" + std::to_string(p);
  if (s.kind == RowSelector::Kind::kSpan)
    s.file_name +=
        "_" + std::to_string(s.span_begin) + "_" + std::to_string(s.span_end);
  return s;
}

StatusOr<HookSet> ResolveExtractHooks(const std::vector<std::string>& hooks,
                                      const std::vector<std::string>& layers,
                                      const ModelConfig& c) {
  HookSet set;
  for (const std::string& h : hooks) {
    std::vector<std::string> patterns;
    const bool bare = h.rfind("blocks.", 0) != 0 && h != "hook_embed" &&
                      h != "hook_pos_embed" &&
                      h != "ln_final.hook_normalized" && h != "logits";
    if (bare) {
      if (layers.empty())
        return InvalidArgumentError("hook '" + h +
                                    "' needs a layer: write blocks.{L}." + h +
                                    " or give --layers");
      for (const std::string& l : layers) {
        const bool fraction = l.find('.') != std::string::npos;
        patterns.push_back("blocks." + (fraction ? "{" + l + "}" : l) + "." +
                           h);
      }
    } else {
      patterns.push_back(h);
    }
    for (const std::string& p : patterns) {
      ASSIGN_OR_RETURN(std::vector<HookPoint> points,
                       ParseHookPattern(p, c.num_layers));
      for (const HookPoint& hp : points) {
        RETURN_IF_ERROR(CheckHookExists(hp, c));
        if (hp.site == HookSite::kPattern)
          return UnimplementedError(
              "hook " + HookName(hp) +
              ": attention patterns are [heads, L, L] per prompt and are not "
              "extracted by "
              "`loom extract` (request hook_z or hook_attn_out instead)");
        set.Add(hp);
      }
    }
  }
  if (set.empty()) return InvalidArgumentError("no hooks requested (--hooks)");
  return set;
}

Json ExtractSummary::ToJson() const {
  return Json{{"rows", rows},
              {"rows_ok", rows_ok},
              {"rows_skipped", rows_skipped},
              {"tokens", tokens},
              {"seconds", seconds},
              {"tokens_per_second",
               seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0},
              {"rows_per_second",
               seconds > 0 ? static_cast<double>(rows_ok) / seconds : 0.0},
              {"hooks", resolved_hooks},
              {"files", files},
              {"complete", complete},
              {"planned_bytes", planned_bytes},
              {"verify_plan", verify_plan}};
}

// ---- The job
// -----------------------------------------------------------------------

StatusOr<ExtractSummary> RunExtract(const ExtractOptions& o) {
  const auto t_start = std::chrono::steady_clock::now();
  if (o.threads > 0) cpu::SetNumThreads(o.threads);
  if (o.on_error != "fail" && o.on_error != "skip")
    return InvalidArgumentError("--on-error '" + o.on_error +
                                "': expected fail or skip");
  if (o.add_bos != "auto" && o.add_bos != "yes" && o.add_bos != "no")
    return InvalidArgumentError("--add-bos '" + o.add_bos +
                                "': expected auto, yes or no");
  if (o.format != "npy" && o.format != "safetensors")
    return InvalidArgumentError("--format '" + o.format +
                                "': expected npy or safetensors");
  if (o.commit_every <= 0)
    return InvalidArgumentError("--commit-every must be > 0");
  if (!o.template_text.empty() &&
      o.template_text.find("{text}") == std::string::npos)
    return InvalidArgumentError("--template '" + o.template_text +
                                "' has no {text} placeholder");

  // Everything that depends only on config.json and the options is checked
  // before planning, so bad options fail before anything is loaded.
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.model_dir));
  ASSIGN_OR_RETURN(HookSet hooks,
                   ResolveExtractHooks(o.hooks, o.layers, config));
  std::vector<std::string> hook_names;
  for (const HookPoint& hp : hooks.hooks()) hook_names.push_back(HookName(hp));
  std::vector<RowSelector> selectors;
  for (const std::string& s : o.selectors) {
    ASSIGN_OR_RETURN(RowSelector sel, ParseRowSelector(s));
    for (const auto& prev : selectors)
      if (prev.file_name == sel.file_name)
        return InvalidArgumentError("selector '" + s + "' given twice");
    selectors.push_back(std::move(sel));
  }
  if (selectors.empty()) return InvalidArgumentError("no selectors (--select)");
  std::optional<DType> dtype_flag;
  if (!o.dtype.empty()) {
    dtype_flag = ParseDType(o.dtype);
    if (!dtype_flag || !IsComputeDType(*dtype_flag))
      return InvalidArgumentError("--dtype '" + o.dtype +
                                  "': expected f32, bf16 or f16");
  }
  const int64_t max_pos = config.max_position_embeddings;
  const int64_t batch_tokens =
      o.batch_tokens > 0 ? o.batch_tokens : std::min<int64_t>(4096, max_pos);

  // Plan first, from config.json and the safetensors headers; refuse if the
  // job does not fit.
  ASSIGN_OR_RETURN(DType planned_compute,
                   PlannedComputeDType(config, o.precision));
  JobSpec job;
  job.batch_tokens = batch_tokens;
  job.context = std::min(batch_tokens, max_pos);
  job.hooks = hooks;
  job.capture_dtype = dtype_flag.value_or(planned_compute);
  job.selector = Selector::kLast;
  for (const RowSelector& sel : selectors) {
    if (sel.ragged())
      job.selector = Selector::kAll;
    else if ((sel.kind == RowSelector::Kind::kMean ||
              sel.kind == RowSelector::Kind::kMax) &&
             job.selector != Selector::kAll)
      job.selector = Selector::kMean;
  }
  job.seqs_per_batch = std::min(
      o.commit_every, job.batch_tokens);  // staging holds a commit window
  job.weight_compute_dtype = planned_compute;
  const int64_t rss_before = CurrentRssBytes();
  ASSIGN_OR_RETURN(MemoryPlan plan,
                   PlanJobOrRefuse("extract", o.model_dir, job, o.plan));

  // Model and tokenizer.
  std::string warning;
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   Model::Load(o.model_dir, o.precision, &warning));
  if (!warning.empty())
    std::fprintf(stderr, "loom extract: warning: %s\n", warning.c_str());
  const ModelConfig& c = model->config();
  const DType out_dtype = dtype_flag.value_or(model->compute_dtype());
  std::unique_ptr<tok::Tokenizer> tokenizer;
  std::string tokenizer_error;  // token-id rows work without a tokenizer
  if (StatusOr<std::unique_ptr<tok::Tokenizer>> t =
          tok::Tokenizer::Load(o.model_dir);
      t.ok()) {
    tokenizer = std::move(t).value();
  } else {
    tokenizer_error = t.status().message();
  }

  std::vector<Output> outputs;
  for (const HookPoint& hp : hooks.hooks()) {
    for (const RowSelector& sel : selectors) {
      Output out;
      out.hook = hp;
      out.hook_name = HookName(hp);
      out.sel = sel;
      out.width = HookWidth(hp.site, c);
      out.file = out.hook_name + "." + sel.file_name + ".npy";
      outputs.push_back(std::move(out));
    }
  }
  std::vector<RaggedIndex> ragged;
  std::vector<int> ragged_of(outputs.size(), -1);
  for (const RowSelector& sel : selectors) {
    if (!sel.ragged()) continue;
    RaggedIndex ri;
    ri.file = sel.file_name + ".offsets.npy";
    ragged.push_back(std::move(ri));
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].sel.file_name == sel.file_name)
        ragged_of[i] = static_cast<int>(ragged.size()) - 1;
  }

  // The manifest: fresh, or resumed.
  const std::string manifest_path = o.out_dir + "/manifest.json";
  const std::string rows_path = o.out_dir + "/rows.jsonl";
  Json manifest;
  int64_t committed_rows = 0, rows_ok = 0, rows_skipped = 0, input_offset = 0,
          rows_bytes = 0, shards = 0;
  std::vector<std::string> files;
  for (const auto& out : outputs) files.push_back(out.file);
  for (const auto& ri : ragged) files.push_back(ri.file);
  if (o.format == "safetensors") {
    files.clear();
  }
  ASSIGN_OR_RETURN(std::string config_sha,
                   Sha256File(o.model_dir + "/config.json"));
  std::string tokenizer_file;
  for (const char* f : {"tokenizer.json", "tokenizer.model"})
    if (fs::exists(o.model_dir + "/" + f)) {
      tokenizer_file = f;
      break;
    }
  std::vector<std::string> selector_specs;
  for (const auto& s : selectors) selector_specs.push_back(s.spec);
  Json settings = {
      {"model",
       {{"path", fs::absolute(o.model_dir).lexically_normal().string()},
        {"config_sha256", config_sha},
        {"model_type", c.model_type},
        {"architecture", c.architecture},
        {"num_layers", c.num_layers},
        {"hidden_size", c.hidden_size}}},
      {"compute_dtype", std::string(DTypeLongName(model->compute_dtype()))},
      {"output_dtype", std::string(DTypeLongName(out_dtype))},
      {"hooks", hook_names},
      {"selectors", selector_specs},
      {"template", o.template_text},
      {"add_bos", o.add_bos},
      {"batch_tokens", batch_tokens},
      {"commit_every", o.commit_every},
      {"on_error", o.on_error},
      {"format", o.format},
      {"hf_bf16_activations", o.hf_bf16_activations},
  };
  if (o.resume) {
    std::ifstream in(manifest_path);
    if (!in)
      return NotFoundError("--resume: " + manifest_path +
                           " not found (nothing to resume)");
    manifest = Json::parse(in, nullptr, false);
    if (manifest.is_discarded() || !manifest.is_object() ||
        !manifest.contains("progress"))
      return DataLossError(manifest_path + ": not a valid manifest");
    for (const auto& [k, v] : settings.items()) {
      if (k == "compute_dtype" && v == manifest["settings"].value(k, Json()))
        continue;
      if (manifest["settings"].value(k, Json()) != v)
        return FailedPreconditionError(
            "--resume: setting '" + k + "' differs from the interrupted run (" +
            manifest["settings"].value(k, Json()).dump() + " there, " +
            v.dump() + " now); resume with the same options");
    }
    const Json& p = manifest["progress"];
    committed_rows = p["rows_committed"];
    rows_ok = p["rows_ok"];
    rows_skipped = p["rows_skipped"];
    input_offset = p["input_offset"];
    rows_bytes = p["rows_file_bytes"];
    shards = p.value("shards", 0);
    const int64_t input_size =
        static_cast<int64_t>(fs::file_size(o.input_path));
    if (input_size != manifest["input"]["bytes"].get<int64_t>())
      return FailedPreconditionError("--resume: input " + o.input_path +
                                     " has " + std::to_string(input_size) +
                                     " bytes, the interrupted run read " +
                                     manifest["input"]["bytes"].dump());
    if (manifest.value("complete", false)) {
      ExtractSummary done;
      done.rows = committed_rows;
      done.rows_ok = rows_ok;
      done.rows_skipped = rows_skipped;
      done.resolved_hooks = hook_names;
      done.files = manifest.value("files", std::vector<std::string>{});
      done.complete = true;
      return done;
    }
  } else {
    if (fs::exists(manifest_path))
      return FailedPreconditionError(
          "--out " + o.out_dir +
          " already holds a job (manifest.json); use --resume to continue it "
          "or "
          "choose another directory (nothing was overwritten)");
    std::error_code ec;
    fs::create_directories(o.out_dir, ec);
    if (ec) return IoError("--out " + o.out_dir + ": " + ec.message());
    ASSIGN_OR_RETURN(std::string input_sha, Sha256File(o.input_path));
    manifest = Json{{"format", "loom-activations"},
                    {"version", kManifestVersion},
                    {"settings", settings}};
    manifest["input"] = {
        {"path", fs::absolute(o.input_path).lexically_normal().string()},
        {"sha256", input_sha},
        {"bytes", static_cast<int64_t>(fs::file_size(o.input_path))}};
    manifest["tokenizer"] = {{"file", tokenizer_file}};
    if (!tokenizer_file.empty()) {
      ASSIGN_OR_RETURN(std::string tsha,
                       Sha256File(o.model_dir + "/" + tokenizer_file));
      manifest["tokenizer"]["sha256"] = tsha;
    }
    Json arrays = Json::array();
    for (const auto& out : outputs) {
      Json a = {{"hook", out.hook_name},
                {"selector", out.sel.spec},
                {"dtype", std::string(DTypeLongName(out_dtype))},
                {"row_shape",
                 out.sel.ragged() || out.sel.kind != RowSelector::Kind::kPos
                     ? Json{out.width}
                     : Json{out.sel.rows_per_prompt(), out.width}}};
      if (o.format == "npy") a["file"] = out.file;
      if (out.sel.ragged())
        a["offsets_file"] = out.sel.file_name + ".offsets.npy";
      arrays.push_back(a);
    }
    manifest["arrays"] = arrays;
  }
  manifest["files"] = files;

  // Open or create the output arrays.
  auto row_shape = [&](const Output& out) {
    std::vector<int64_t> s;
    if (out.sel.kind == RowSelector::Kind::kPos)
      s.push_back(out.sel.rows_per_prompt());
    s.push_back(out.width);
    return s;
  };
  if (o.format == "npy") {
    for (auto& out : outputs) {
      const std::string path = o.out_dir + "/" + out.file;
      if (o.resume) {
        // Ragged arrays hold concatenated rows: their committed count is
        // recorded per file in the manifest.
        const int64_t keep =
            out.sel.ragged()
                ? manifest["progress"]["ragged_rows"][out.file].get<int64_t>()
                : committed_rows;
        ASSIGN_OR_RETURN(out.npy, NpyWriter::OpenForAppend(path, keep));
      } else {
        ASSIGN_OR_RETURN(out.npy,
                         NpyWriter::Create(path, out_dtype, row_shape(out)));
      }
    }
    for (auto& ri : ragged) {
      const std::string path = o.out_dir + "/" + ri.file;
      if (o.resume) {
        ASSIGN_OR_RETURN(ri.npy,
                         NpyWriter::OpenForAppend(path, committed_rows + 1));
      } else {
        ASSIGN_OR_RETURN(ri.npy, NpyWriter::Create(path, DType::kI64, {}));
        const int64_t zero = 0;
        RETURN_IF_ERROR(ri.npy->AppendRows(&zero, 1));
        RETURN_IF_ERROR(ri.npy->Commit());
      }
    }
  } else if (o.resume) {
    // Drop shards written after the last commit record.
    for (const auto& entry : fs::directory_iterator(o.out_dir)) {
      const std::string name = entry.path().filename().string();
      const size_t at = name.rfind(".shard-");
      if (at == std::string::npos) continue;
      const int64_t idx = std::strtoll(name.c_str() + at + 7, nullptr, 10);
      if (idx >= shards) fs::remove(entry.path());
    }
  }
  // rows.jsonl: per-row id, token count, status (append-only).
  {
    const int fd =
        ::open(rows_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      return IoError(rows_path + ": cannot open: " + std::strerror(errno));
    if (::ftruncate(fd, rows_bytes) != 0) {
      ::close(fd);
      return IoError(rows_path + ": truncate failed");
    }
    ::close(fd);
  }
  if (!o.resume) {
    manifest["progress"] = {{"rows_committed", 0},
                            {"rows_ok", 0},
                            {"rows_skipped", 0},
                            {"input_offset", 0},
                            {"rows_file_bytes", 0},
                            {"shards", 0},
                            {"ragged_rows", Json::object()}};
    for (const auto& out : outputs)
      if (out.sel.ragged()) manifest["progress"]["ragged_rows"][out.file] = 0;
    manifest["complete"] = false;
    RETURN_IF_ERROR(WriteFileDurably(manifest_path, manifest.dump(2) + "\n"));
  }

  ASSIGN_OR_RETURN(
      std::unique_ptr<InputReader> reader,
      InputReader::Open(o.input_path, input_offset, committed_rows));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Executor> ex,
      Executor::Create(*model, hooks,
                       {.max_tokens = batch_tokens,
                        .max_seq_len = std::min(batch_tokens, max_pos),
                        .logits_chunk_rows = 256,
                        .hf_bf16_activations = o.hf_bf16_activations}));
  ExtractSink sink(&outputs, &ragged, &ragged_of, out_dtype);
  const int64_t ds = DTypeSize(out_dtype);

  ExtractSummary summary;
  summary.resolved_hooks = hook_names;
  int64_t commits = 0;
  std::string rows_text;
  bool eof = false;
  while (!eof) {
    // 1. Read and prepare a window of rows.
    std::vector<Prepared> window;
    while (static_cast<int64_t>(window.size()) < o.commit_every) {
      InputRow row;
      ASSIGN_OR_RETURN(bool got, reader->Next(&row, o.replace_invalid_utf8));
      if (!got) {
        eof = true;
        break;
      }
      Prepared p;
      p.index = row.index;
      p.id = row.id;
      p.reason = row.error;
      if (p.ok() && row.has_tokens) {
        p.ids = std::move(row.tokens);
        if (o.add_bos == "yes" && c.bos_token_id >= 0 &&
            (p.ids.empty() || p.ids[0] != c.bos_token_id))
          p.ids.insert(p.ids.begin(), static_cast<int32_t>(c.bos_token_id));
      } else if (p.ok()) {
        if (row.text.empty()) {
          p.reason = "empty text";
        } else if (!tokenizer) {
          p.reason = "no tokenizer: " + tokenizer_error;
        } else {
          std::string text = row.text;
          if (!o.template_text.empty()) {
            text = o.template_text;
            text.replace(text.find("{text}"), 6, row.text);
          }
          tok::EncodeOptions eo;
          eo.add_special_tokens = o.add_bos != "no";
          eo.invalid_utf8 = o.replace_invalid_utf8
                                ? tok::InvalidUtf8Policy::kReplace
                                : tok::InvalidUtf8Policy::kError;
          StatusOr<tok::Encoding> enc = tokenizer->Encode(text, eo);
          if (!enc.ok()) {
            p.reason = enc.status().message();
          } else {
            p.ids = std::move(enc->ids);
            if (o.add_bos == "yes" && tokenizer->bos_id() >= 0 &&
                (p.ids.empty() || p.ids[0] != tokenizer->bos_id()))
              p.ids.insert(p.ids.begin(), tokenizer->bos_id());
          }
        }
      }
      if (p.ok()) {
        const int64_t n = static_cast<int64_t>(p.ids.size());
        if (n == 0)
          p.reason = "empty: no tokens";
        else if (n > max_pos)
          p.reason = "too long for the model: " + std::to_string(n) +
                     " tokens > max_position_embeddings " +
                     std::to_string(max_pos);
        else if (n > batch_tokens)
          p.reason = std::to_string(n) + " tokens > --batch-tokens " +
                     std::to_string(batch_tokens) + " (raise --batch-tokens)";
        for (int32_t id : p.ids)
          if (p.ok() && id >= c.vocab_size)
            p.reason = "token id " + std::to_string(id) +
                       " outside the vocabulary [0, " +
                       std::to_string(c.vocab_size) + ")";
        for (const auto& sel : selectors) {
          if (!p.ok()) break;
          if (sel.kind == RowSelector::Kind::kPos) {
            for (int64_t q : sel.positions)
              if ((q < 0 ? n + q : q) < 0 || (q < 0 ? n + q : q) >= n)
                p.reason = "selector " + sel.spec + ": position " +
                           std::to_string(q) + " outside a row of " +
                           std::to_string(n) + " tokens";
          } else if (sel.kind == RowSelector::Kind::kSpan) {
            SpanRange r;
            if (!ResolveSpan(sel, n, &r))
              p.reason = "selector " + sel.spec + ": span outside a row of " +
                         std::to_string(n) + " tokens";
          }
        }
      }
      if (!p.ok() && o.on_error == "fail")
        return InvalidArgumentError("input row " + std::to_string(p.index) +
                                    " (id " + p.id.dump() + "): " + p.reason +
                                    "; " + std::to_string(committed_rows) +
                                    " rows committed before it are kept (use "
                                    "--on-error skip to record and skip "
                                    "bad rows, --resume to continue)");
      window.push_back(std::move(p));
    }
    if (window.empty()) break;
    const int64_t W = static_cast<int64_t>(window.size());

    // 2. Size the window's staging.
    for (auto& ri : ragged) {
      ri.slot_begin.assign(W + 1, 0);
    }
    for (size_t oi = 0; oi < outputs.size(); ++oi) {
      Output& out = outputs[oi];
      if (out.sel.ragged()) {
        RaggedIndex& ri = ragged[ragged_of[oi]];
        int64_t total = 0;
        for (int64_t s = 0; s < W; ++s) {
          ri.slot_begin[s] = total;
          if (!window[s].ok()) continue;
          const int64_t n = static_cast<int64_t>(window[s].ids.size());
          SpanRange r{0, n};
          if (out.sel.kind == RowSelector::Kind::kSpan)
            ResolveSpan(out.sel, n, &r);
          total += r.end - r.begin;
        }
        ri.slot_begin[W] = total;
        ri.window_rows = total;
        out.stage.assign(static_cast<size_t>(total * out.width * ds), 0);
      } else {
        out.stage.assign(
            static_cast<size_t>(W * out.sel.rows_per_prompt() * out.width * ds),
            0);
        if (out.sel.kind == RowSelector::Kind::kMean)
          out.acc.assign(W * out.width, 0.0);
        if (out.sel.kind == RowSelector::Kind::kMax)
          out.acc.assign(W * out.width,
                         -std::numeric_limits<double>::infinity());
      }
    }

    // 3. Batches: longest first, packed up to batch_tokens.
    std::vector<int64_t> order;
    for (int64_t s = 0; s < W; ++s)
      if (window[s].ok()) order.push_back(s);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return window[a].ids.size() > window[b].ids.size();
    });
    std::vector<int32_t> ids;
    std::vector<int64_t> starts, slots;
    ids.reserve(batch_tokens);
    size_t next = 0;
    while (next < order.size()) {
      ids.clear();
      starts.assign(1, 0);
      slots.clear();
      while (next < order.size() &&
             static_cast<int64_t>(
                 ids.size() + window[order[next]].ids.size()) <= batch_tokens) {
        const Prepared& p = window[order[next]];
        ids.insert(ids.end(), p.ids.begin(), p.ids.end());
        starts.push_back(static_cast<int64_t>(ids.size()));
        slots.push_back(order[next]);
        ++next;
      }
      sink.SetBatch(&slots);
      RETURN_IF_ERROR(ex->Forward(Batch{ids, starts}, &sink));
      summary.tokens += static_cast<int64_t>(ids.size());
    }

    // 4. Finalise mean/max and skipped rows, then append in input order.
    for (auto& out : outputs) {
      if (out.sel.ragged()) continue;
      const int64_t per = out.sel.rows_per_prompt() * out.width;
      const bool reduced = out.sel.kind == RowSelector::Kind::kMean ||
                           out.sel.kind == RowSelector::Kind::kMax;
      std::vector<float> row(per);
      for (int64_t s = 0; s < W; ++s) {
        if (window[s].ok() && !reduced) continue;  // stored by the sink
        if (!window[s].ok()) {
          std::fill(row.begin(), row.end(),
                    std::numeric_limits<float>::quiet_NaN());
        } else {
          const double div = out.sel.kind == RowSelector::Kind::kMean
                                 ? static_cast<double>(window[s].ids.size())
                                 : 1.0;
          for (int64_t j = 0; j < out.width; ++j)
            row[j] = static_cast<float>(out.acc[s * out.width + j] / div);
        }
        cpu::ConvertFromF32(row.data(), &out.stage[s * per * ds], out_dtype,
                            per);
      }
    }
    rows_text.clear();
    for (const Prepared& p : window) {
      Json r = {{"row", p.index},
                {"id", p.id},
                {"tokens", static_cast<int64_t>(p.ids.size())},
                {"status", p.ok() ? "ok" : "skipped"}};
      if (!p.ok()) r["reason"] = p.reason;
      rows_text += r.dump() + "\n";
      (p.ok() ? rows_ok : rows_skipped) += 1;
    }

    // 5. Commit: arrays (data, then headers), rows.jsonl, then the manifest.
    if (o.format == "npy") {
      for (auto& out : outputs) {
        RETURN_IF_ERROR(out.npy->Append(
            out.stage.data(), static_cast<int64_t>(out.stage.size())));
        RETURN_IF_ERROR(out.npy->Commit());
        if (out.sel.ragged())
          manifest["progress"]["ragged_rows"][out.file] =
              out.npy->committed_rows();
      }
      for (size_t r = 0; r < ragged.size(); ++r) {
        RaggedIndex& ri = ragged[r];
        // Global offsets: the data file's rows before this window + slot
        // begins.
        int64_t base = 0;
        for (size_t oi = 0; oi < outputs.size(); ++oi)
          if (ragged_of[oi] == static_cast<int>(r))
            base = outputs[oi].npy->committed_rows() - ri.window_rows;
        std::vector<int64_t> ends(W);
        for (int64_t s = 0; s < W; ++s) ends[s] = base + ri.slot_begin[s + 1];
        RETURN_IF_ERROR(ri.npy->AppendRows(ends.data(), W));
        RETURN_IF_ERROR(ri.npy->Commit());
      }
    } else {
      for (size_t oi = 0; oi < outputs.size(); ++oi) {
        Output& out = outputs[oi];
        char shard[32];
        std::snprintf(shard, sizeof shard, ".shard-%05lld",
                      static_cast<long long>(shards));
        const std::string name =
            out.hook_name + "." + out.sel.file_name + shard + ".safetensors";
        SafetensorsWriter w;
        w.SetMetadata("first_row", std::to_string(committed_rows));
        w.SetMetadata("rows", std::to_string(W));
        std::vector<int64_t> shape = row_shape(out);
        const int64_t nrows =
            out.sel.ragged() ? ragged[ragged_of[oi]].window_rows : W;
        shape.insert(shape.begin(), nrows);
        RETURN_IF_ERROR(w.Add("activations", out_dtype, Shape(shape),
                              out.stage.data(),
                              static_cast<int64_t>(out.stage.size())));
        std::vector<int64_t> offs;
        if (out.sel.ragged()) {
          offs.assign(ragged[ragged_of[oi]].slot_begin.begin(),
                      ragged[ragged_of[oi]].slot_begin.end());
          RETURN_IF_ERROR(w.Add("offsets", DType::kI64, Shape({W + 1}),
                                offs.data(), (W + 1) * 8));
        }
        RETURN_IF_ERROR(w.Write(o.out_dir + "/" + name));
        manifest["files"].push_back(name);
      }
      ++shards;
    }
    {
      const int fd = ::open(rows_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
      if (fd < 0)
        return IoError(rows_path + ": cannot open: " + std::strerror(errno));
      const ssize_t w = ::write(fd, rows_text.data(), rows_text.size());
      const bool ok =
          w == static_cast<ssize_t>(rows_text.size()) && ::fdatasync(fd) == 0;
      ::close(fd);
      if (!ok) return IoError(rows_path + ": write failed");
      rows_bytes += static_cast<int64_t>(rows_text.size());
    }
    committed_rows += W;
    manifest["progress"]["rows_committed"] = committed_rows;
    manifest["progress"]["rows_ok"] = rows_ok;
    manifest["progress"]["rows_skipped"] = rows_skipped;
    manifest["progress"]["input_offset"] = reader->offset();
    manifest["progress"]["rows_file_bytes"] = rows_bytes;
    manifest["progress"]["shards"] = shards;
    RETURN_IF_ERROR(WriteFileDurably(manifest_path, manifest.dump(2) + "\n"));
    ++commits;
    const double secs = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - t_start)
                            .count();
    if (o.progress) {
      const double size =
          static_cast<double>(manifest["input"]["bytes"].get<int64_t>());
      o.progress(committed_rows, summary.tokens, secs,
                 size > 0 ? static_cast<double>(reader->offset()) / size : 1.0);
    }
    if (o.stop_after_commits > 0 && commits >= o.stop_after_commits) {
      summary.rows = committed_rows;
      summary.rows_ok = rows_ok;
      summary.rows_skipped = rows_skipped;
      summary.seconds = secs;
      return summary;
    }
  }

  // Done: the per-row records join the manifest.
  {
    std::ifstream in(rows_path);
    Json rows = Json::array();
    std::string line;
    while (std::getline(in, line)) rows.push_back(Json::parse(line));
    manifest["rows"] = rows;
  }
  manifest["complete"] = true;
  manifest["row_count"] = committed_rows;
  RETURN_IF_ERROR(WriteFileDurably(manifest_path, manifest.dump(2) + "\n"));
  summary.rows = committed_rows;
  summary.rows_ok = rows_ok;
  summary.rows_skipped = rows_skipped;
  summary.files = manifest["files"].get<std::vector<std::string>>();
  summary.complete = true;
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start)
          .count();
  summary.planned_bytes = PlannedHostBytes(plan);
  if (o.plan.verify_plan)
    summary.verify_plan = VerifyPlan(summary.planned_bytes, rss_before);
  return summary;
}

}  // namespace loom
