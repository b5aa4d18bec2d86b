// The configuration of `loom serve`: a YAML file in the layout of TheLoom's
// config.yaml, then LOOM_<SECTION>__<KEY> environment variables on top of it
// (then the command line's flags, which are the CLI's business). Every layer
// is validated as it is applied; the key table with defaults and meanings is
// docs/design/serve-config.md.
//
// The file is a map of sections, each a map of keys. Every section and key
// is optional; an empty file (or one holding only `~`) is the default
// configuration. A complete example, every value being the default except
// where a comment says otherwise:
//
//   server:
//     transport: http          # http | unix | both (TCP and the socket)
//     unix_socket: /tmp/loom.sock  # unix, both: the socket's path (mode 0600)
//     http_host: 127.0.0.1     # TheLoom's default is 0.0.0.0
//     http_port: 8080          # 0 = any free port
//     auth_token: ""           # non-empty: "Authorization: Bearer <token>"
//     max_body_bytes: 8MiB     # a count of bytes, or a number with a unit
//     max_analysis_body_bytes: 256MiB  # /analyze/geometry, /analyze/bilateral
//     max_prompt_tokens: 0     # 0 = batching.context
//     max_queue: 256           # requests waiting for admission
//     max_batch_prompts: 100   # prompts of /generate/batch, texts of
//                              # /embed/batch
//     threads: 0               # 0 = max_queue + 16, at most 512
//     chat_stream_format: auto # auto | openai | theloom
//     cors_origins: []         # e.g. ["http://localhost:3000"]
//     cors_allow_credentials: false
//     shutdown_timeout_seconds: 30
//   gpu:
//     devices: [0, 1]          # default []: CPU only
//     default_device: 0        # default -1: the CPU; else one of devices
//     memory_fraction: 0.9     # 0.1 .. 1.0
//   models:
//     dirs: [/srv/models]      # default []; model ids are paths relative
//                              # to one of these directories
//     preload: [Qwen2.5-0.5B-Instruct]  # default []; at most max_loaded
//     max_loaded: 3
//     default_dtype: auto      # auto | float32 | bfloat16 | float16
//                              # (f32 | bf16 | f16 are read as the long names)
//   hidden_states:
//     default_layers: [-1]     # TheLoom layer indices (-1 = the last)
//     precision: float32       # float32 | bfloat16 | float16
//     embedding_layer: -1      # /embed and /v1/embeddings: the layer pooled
//     embedding_pooling: last_token  # last_token | first_token | mean
//     embedding_normalize: false     # divide by the L2 norm
//   memory:
//     precision_mode: auto     # auto | fp32 | fp16 | bf16
//     streaming_chunk_size: 512
//     memory_warning_threshold: 0.85  # (0, 1]
//     activation_cache_filter: [blocks.1.hook_resid_post]  # default []
//   batching:                  # Loom's own section (TheLoom has none)
//     slots: 8
//     context: 0               # 0 = min(2048, the model's maximum)
//     batch_tokens: 0          # 0 = memory.streaming_chunk_size + slots
//     capture_bytes: 256MiB
//     kv_tokens: 0         # default; KV positions shared by all sequences
//     page_size: 16        # default; positions per KV page (0 = no pages)
//   logging:
//     level: info              # debug | info | warning | error, any case
//     file: ""                 # "" or null: standard error
//     format: ""
//   persistence:               # the /experiments store (docs/server.md)
//     enabled: false           # false: /experiments* answer 503
//     db_path: ~/.local/share/loom/experiments.db  # SQLite, WAL journal
//     hidden_states_dir: ~/.local/share/loom/hidden_states  # .safetensors
//     export_dir: ~/.local/share/loom/exports  # exports are written here only
//     compression: gzip        # gzip | lzf | none (null = none)
//     compression_level: 4     # 0..9
//     chunk_size: 1024         # >= 64; these three: no effect (the arrays
//                              # are uncompressed safetensors files)
//     auto_persist: true       # with enabled: record each generation
//   interp:                    # Loom's own section: Neuronpedia's routes
//     saes: ["6-res-jb=/saes/gpt2/6"]  # ID=PATH[@HOOK]; default []
//
// Types are strict: an integer key takes a plain integer (`8080`, not
// `"8080"` or `8080.0`), a list key takes a list (block or flow style; null
// is the empty list), a boolean takes true/false (yes/no, on/off; any case).
// String keys take any scalar as written. The *_bytes keys also take a
// number with a unit (B, KB, MB, GB, KiB, MiB, GiB, ...: src/base/units.h).
//
// Errors are InvalidArgument and name the source, the line and column, the
// full key path, the value given and what was expected:
//   config.yaml:3:14: server.http_port: expected an integer in 0..65535,
//   found 70000
// Unknown sections and keys are errors (naming the key path, with the known
// keys), as are duplicate keys.
//
// Keys of TheLoom's config that mean nothing to Loom are accepted and
// ignored, each with a line in ServeConfig::warnings: models.cache_dir,
// models.trust_remote_code, models.auto_unload_minutes,
// hidden_states.include_attention, memory.enable_gradient_checkpointing, and
// the whole sections loaders, patching and model_overrides (one warning per
// section, their contents unread). A leading "~/" of a persistence path is
// kept as written; the server expands it (HOME) when it opens the store.
//
// Thread-safety: plain values and free functions; no shared state.
#ifndef LOOM_SERVE_CONFIG_H_
#define LOOM_SERVE_CONFIG_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/status.h"

namespace loom::serve {

struct ServerSection {
  // http (TCP on http_host:http_port) | unix (HTTP/1.1 on unix_socket) |
  // both (the two listeners, the same routes and state).
  std::string transport = "http";
  // The socket's path (at most 107 bytes): a stale socket there (no server
  // answering) is replaced, anything else there is an error; the socket is
  // made mode 0600 and removed on shutdown.
  std::string unix_socket = "/tmp/loom.sock";
  std::string http_host = "127.0.0.1";  // safe default (TheLoom's: 0.0.0.0)
  int http_port = 8080;                 // 0..65535 (0 = pick a free port)
  // "" = no authentication; else every request needs
  // "Authorization: Bearer <token>". ToJson never reveals it.
  std::string auth_token;
  int64_t max_body_bytes = 8 << 20;  // > 0
  // The body limit of /analyze/geometry and /analyze/bilateral (1,000
  // vectors of width 4,096 as Go writes them are about 80 MB); > 0.
  int64_t max_analysis_body_bytes = int64_t{256} << 20;
  int64_t max_prompt_tokens = 0;     // >= 0; 0 = batching.context
  int64_t max_queue = 256;           // requests waiting for admission; >= 0
  // Prompts per /generate/batch, texts per /embed/batch; > 0.
  int64_t max_batch_prompts = 100;
  int threads = 0;  // HTTP worker threads; 0 = max_queue + 16, at most 512
  std::string chat_stream_format = "auto";  // auto | openai | theloom
  std::vector<std::string> cors_origins;    // may be empty
  bool cors_allow_credentials = false;
  int64_t shutdown_timeout_seconds = 30;  // >= 0
};

struct GpuSection {
  std::vector<int> devices;  // GPU indices (distinct, >= 0); empty = CPU only
  int default_device = -1;   // -1 = the CPU; else one of `devices`
  double memory_fraction = 0.9;  // 0.1 .. 1.0
};

struct ModelsSection {
  // Directories models may be loaded from; a model id is a path relative to
  // one of them.
  std::vector<std::string> dirs;
  std::vector<std::string> preload;  // model ids loaded at start
  int max_loaded = 3;                // >= 1, and >= preload.size()
  // auto | float32 | bfloat16 | float16. The parser reads f32/bf16/f16 as
  // the long names; ValidateServeConfig accepts both spellings.
  std::string default_dtype = "auto";
};

struct HiddenStatesSection {
  std::vector<int64_t> default_layers = {-1};  // TheLoom layer indices
  // The dtype hidden states are returned in: float32 | bfloat16 | float16.
  std::string precision = "float32";
  // Defaults of the embedding routes (/embed, /embed/batch, /v1/embeddings):
  // the layer pooled (TheLoom index), the pooling (last_token | first_token
  // | mean; the parser reads last / first / cls as those) and whether the
  // vector is divided by its L2 norm.
  int64_t embedding_layer = -1;
  std::string embedding_pooling = "last_token";
  bool embedding_normalize = false;
};

struct MemorySection {
  std::string precision_mode = "auto";     // auto | fp32 | fp16 | bf16
  int64_t streaming_chunk_size = 512;      // prompt tokens per prefill forward
  double memory_warning_threshold = 0.85;  // (0, 1]
  // Hook patterns made capturable besides the hidden-state layers.
  std::vector<std::string> activation_cache_filter;
};

// Loom's own section.
struct BatchingSection {
  int64_t slots = 8;  // sequences decoded together; > 0
  // KV positions per sequence; 0 = min(2048, the model's maximum).
  int64_t context = 0;
  // Tokens per forward; 0 = memory.streaming_chunk_size + slots.
  int64_t batch_tokens = 0;
  // Host bytes for captured hidden states of in-flight requests; > 0.
  int64_t capture_bytes = 256 << 20;
  // KV positions of the global layers shared by all sequences (pages of
  // page_size positions); 0 = slots x context. >= 0.
  int64_t kv_tokens = 0;
  // Positions per KV page; 0 = no pages (each slot holds `context`
  // positions; kv_tokens must then be 0). >= 0.
  int64_t page_size = 16;
};

struct LoggingSection {
  // debug | info | warning | error; the parser reads any case as lower case.
  std::string level = "info";
  std::string file;    // "" = standard error
  std::string format;  // free text (TheLoom: a Python logging format)
};

// Loom's own section: what Neuronpedia's routes read (docs/saes.md, "HTTP").
struct InterpSection {
  // The SAEs by Neuronpedia source id: "ID=PATH[@HOOK]" (src/serve/sae_set.h).
  std::vector<std::string> saes;
};

// TheLoom's `persistence` section: the /experiments store.
struct PersistenceSection {
  bool enabled = false;  // false: every /experiments* route answers 503
  std::string db_path = "~/.local/share/loom/experiments.db";
  std::string hidden_states_dir = "~/.local/share/loom/hidden_states";
  std::string export_dir = "~/.local/share/loom/exports";
  // TheLoom's HDF5 options, validated and without effect (hidden states are
  // uncompressed safetensors files): gzip | lzf | none ("" = none), 0..9,
  // >= 64.
  std::string compression = "gzip";
  int compression_level = 4;
  int64_t chunk_size = 1024;
  // With enabled: every completed generation request is recorded as an
  // experiment (docs/server.md, "Recording generations").
  bool auto_persist = true;
};

struct ServeConfig {
  ServerSection server;
  GpuSection gpu;
  ModelsSection models;
  HiddenStatesSection hidden_states;
  MemorySection memory;
  BatchingSection batching;
  LoggingSection logging;
  PersistenceSection persistence;
  InterpSection interp;
  // Notes for the log, e.g. "config.yaml:4:3: models.trust_remote_code is a
  // TheLoom key that loom serve ignores".
  std::vector<std::string> warnings;

  // {"server": {...}, "gpu": {...}, ..., "warnings": [...]}: every section
  // and key (for /health and the docs). A non-empty server.auth_token is
  // written as "<redacted>".
  nlohmann::json ToJson() const;
};

// Parses YAML text; `source_name` (e.g. the file's path) starts every message.
StatusOr<ServeConfig> ParseServeConfig(std::string_view yaml_text,
                                       std::string_view source_name);

// Reads and parses a file: NotFound naming the path if it does not exist.
StatusOr<ServeConfig> LoadServeConfig(const std::string& path);

// Applies environment overrides in TheLoom's form LOOM_<SECTION>__<KEY>=VALUE
// (the whole name case-insensitive: LOOM_SERVER__HTTP_PORT=9000,
// LOOM_GPU__DEVICES=[0,1],
// LOOM_MEMORY__ACTIVATION_CACHE_FILTER='["blocks.1.hook_resid_post"]').
// `env` holds "NAME=VALUE" strings (main's `environ`).
//
// A string key takes VALUE verbatim (a token may hold any character); any
// other key parses VALUE as a YAML scalar or flow sequence and checks it as
// the file's value would be. TheLoom's flat variables LOOM_MAX_MODELS,
// LOOM_DEFAULT_DEVICE and LOOM_MEMORY_FRACTION set models.max_loaded,
// gpu.default_device and gpu.memory_fraction; they are applied before the
// LOOM_<SECTION>__<KEY> ones, so those win. Other variables starting with
// LOOM_ but holding no "__" are not ours and are skipped; an unknown section
// or key is InvalidArgument naming the variable. TheLoom keys that Loom
// ignores add warnings, as in the file. The result is validated as a whole;
// on error `config` is left unchanged.
Status ApplyEnvOverrides(const std::vector<std::string>& env,
                         ServeConfig& config);

// Checks every key's range or choices and the relations between keys
// (gpu.default_device in gpu.devices, models.preload within
// models.max_loaded). Parse and Apply call it; exposed for CLI overrides.
Status ValidateServeConfig(const ServeConfig& config);

}  // namespace loom::serve

#endif  // LOOM_SERVE_CONFIG_H_
