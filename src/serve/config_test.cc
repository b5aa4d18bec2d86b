// The `loom serve` configuration: defaults, a file setting every key, each
// class of error (with the key, the value and the place in the message),
// TheLoom keys ignored with warnings, environment overrides, files.
#include "src/serve/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "src/io/test_util.h"

namespace loom::serve {
namespace {

StatusOr<ServeConfig> Parse(std::string_view yaml) {
  return ParseServeConfig(yaml, "test.yaml");
}

// The error of parsing `yaml`, which must fail with `code`.
std::string ParseError(std::string_view yaml,
                       StatusCode code = StatusCode::kInvalidArgument) {
  StatusOr<ServeConfig> config = Parse(yaml);
  EXPECT_FALSE(config.ok()) << yaml;
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), code) << config.status().ToString();
  return config.status().message();
}

void ExpectDefaults(const ServeConfig& c) {
  EXPECT_EQ(c.server.transport, "http");
  EXPECT_EQ(c.server.http_host, "127.0.0.1");
  EXPECT_EQ(c.server.http_port, 8080);
  EXPECT_EQ(c.server.auth_token, "");
  EXPECT_EQ(c.server.max_body_bytes, 8 << 20);
  EXPECT_EQ(c.server.max_analysis_body_bytes, int64_t{256} << 20);
  EXPECT_EQ(c.server.max_prompt_tokens, 0);
  EXPECT_EQ(c.server.max_queue, 256);
  EXPECT_EQ(c.server.max_batch_prompts, 100);
  EXPECT_EQ(c.server.threads, 0);
  EXPECT_EQ(c.server.chat_stream_format, "auto");
  EXPECT_TRUE(c.server.cors_origins.empty());
  EXPECT_FALSE(c.server.cors_allow_credentials);
  EXPECT_EQ(c.server.shutdown_timeout_seconds, 30);
  EXPECT_TRUE(c.gpu.devices.empty());
  EXPECT_EQ(c.gpu.default_device, -1);
  EXPECT_DOUBLE_EQ(c.gpu.memory_fraction, 0.9);
  EXPECT_TRUE(c.models.dirs.empty());
  EXPECT_TRUE(c.models.preload.empty());
  EXPECT_EQ(c.models.max_loaded, 3);
  EXPECT_EQ(c.models.default_dtype, "auto");
  EXPECT_EQ(c.hidden_states.default_layers, std::vector<int64_t>{-1});
  EXPECT_EQ(c.hidden_states.precision, "float32");
  EXPECT_EQ(c.hidden_states.embedding_layer, -1);
  EXPECT_EQ(c.hidden_states.embedding_pooling, "last_token");
  EXPECT_FALSE(c.hidden_states.embedding_normalize);
  EXPECT_EQ(c.memory.precision_mode, "auto");
  EXPECT_EQ(c.memory.streaming_chunk_size, 512);
  EXPECT_DOUBLE_EQ(c.memory.memory_warning_threshold, 0.85);
  EXPECT_TRUE(c.memory.activation_cache_filter.empty());
  EXPECT_EQ(c.batching.slots, 8);
  EXPECT_EQ(c.batching.context, 0);
  EXPECT_EQ(c.batching.batch_tokens, 0);
  EXPECT_EQ(c.batching.capture_bytes, 256 << 20);
  EXPECT_EQ(c.batching.kv_tokens, 0);
  EXPECT_EQ(c.batching.page_size, 16);
  EXPECT_EQ(c.logging.level, "info");
  EXPECT_EQ(c.logging.file, "");
  EXPECT_EQ(c.logging.format, "");
  EXPECT_TRUE(c.warnings.empty());
}

TEST(ServeConfigTest, EmptyInputIsTheDefaultConfig) {
  ExpectDefaults(ServeConfig());
  EXPECT_TRUE(ValidateServeConfig(ServeConfig()).ok());
  for (std::string_view yaml :
       {"", "~", "\n# only a comment\n", "null", "server:\ngpu: ~\n"}) {
    StatusOr<ServeConfig> config = Parse(yaml);
    ASSERT_TRUE(config.ok()) << yaml << ": " << config.status().ToString();
    ExpectDefaults(*config);
  }
}

// Every key, none at its default.
constexpr std::string_view kFullExample = R"(
server:
  transport: http
  http_host: 0.0.0.0
  http_port: 9001
  auth_token: "s3cret token"
  max_body_bytes: 16MiB
  max_analysis_body_bytes: 512MiB
  max_prompt_tokens: 4096
  max_queue: 0
  max_batch_prompts: 7
  threads: 12
  chat_stream_format: theloom
  cors_origins: ["http://localhost:3000", https://example.org]
  cors_allow_credentials: true
  shutdown_timeout_seconds: 0
gpu:
  devices: [0, 2]
  default_device: 2
  memory_fraction: 0.5
models:
  dirs:
    - /srv/models
    - relative/models
  preload: [Qwen2.5-0.5B-Instruct, org/llama]
  max_loaded: 2
  default_dtype: bf16
hidden_states:
  default_layers: [0, -2, -1]
  precision: bfloat16
  embedding_layer: 2
  embedding_pooling: cls
  embedding_normalize: true
memory:
  precision_mode: fp16
  streaming_chunk_size: 128
  memory_warning_threshold: 1
  activation_cache_filter: ["blocks.1.hook_resid_post", "blocks.*.attn.hook_pattern"]
batching:
  slots: 4
  context: 1024
  batch_tokens: 300
  capture_bytes: 1048576
  kv_tokens: 4096
  page_size: 32
logging:
  level: WARNING
  file: serve.log
  format: json
)";

TEST(ServeConfigTest, FullExampleSetsEveryKey) {
  StatusOr<ServeConfig> parsed = Parse(kFullExample);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const ServeConfig& c = *parsed;
  EXPECT_EQ(c.server.transport, "http");
  EXPECT_EQ(c.server.http_host, "0.0.0.0");
  EXPECT_EQ(c.server.http_port, 9001);
  EXPECT_EQ(c.server.auth_token, "s3cret token");
  EXPECT_EQ(c.server.max_body_bytes, 16 << 20);
  EXPECT_EQ(c.server.max_analysis_body_bytes, int64_t{512} << 20);
  EXPECT_EQ(c.server.max_prompt_tokens, 4096);
  EXPECT_EQ(c.server.max_queue, 0);
  EXPECT_EQ(c.server.max_batch_prompts, 7);
  EXPECT_EQ(c.server.threads, 12);
  EXPECT_EQ(c.server.chat_stream_format, "theloom");
  EXPECT_EQ(c.server.cors_origins,
            (std::vector<std::string>{"http://localhost:3000",
                                      "https://example.org"}));
  EXPECT_TRUE(c.server.cors_allow_credentials);
  EXPECT_EQ(c.server.shutdown_timeout_seconds, 0);
  EXPECT_EQ(c.gpu.devices, (std::vector<int>{0, 2}));
  EXPECT_EQ(c.gpu.default_device, 2);
  EXPECT_DOUBLE_EQ(c.gpu.memory_fraction, 0.5);
  EXPECT_EQ(c.models.dirs,
            (std::vector<std::string>{"/srv/models", "relative/models"}));
  EXPECT_EQ(c.models.preload,
            (std::vector<std::string>{"Qwen2.5-0.5B-Instruct", "org/llama"}));
  EXPECT_EQ(c.models.max_loaded, 2);
  EXPECT_EQ(c.models.default_dtype, "bfloat16");  // bf16 read as the long name
  EXPECT_EQ(c.hidden_states.default_layers, (std::vector<int64_t>{0, -2, -1}));
  EXPECT_EQ(c.hidden_states.precision, "bfloat16");
  EXPECT_EQ(c.hidden_states.embedding_layer, 2);
  EXPECT_EQ(c.hidden_states.embedding_pooling, "first_token");  // cls
  EXPECT_TRUE(c.hidden_states.embedding_normalize);
  EXPECT_EQ(c.memory.precision_mode, "fp16");
  EXPECT_EQ(c.memory.streaming_chunk_size, 128);
  EXPECT_DOUBLE_EQ(c.memory.memory_warning_threshold, 1.0);
  EXPECT_EQ(c.memory.activation_cache_filter,
            (std::vector<std::string>{"blocks.1.hook_resid_post",
                                      "blocks.*.attn.hook_pattern"}));
  EXPECT_EQ(c.batching.slots, 4);
  EXPECT_EQ(c.batching.context, 1024);
  EXPECT_EQ(c.batching.batch_tokens, 300);
  EXPECT_EQ(c.batching.capture_bytes, 1 << 20);
  EXPECT_EQ(c.batching.kv_tokens, 4096);
  EXPECT_EQ(c.batching.page_size, 32);
  EXPECT_EQ(c.logging.level, "warning");  // any case, stored lower case
  EXPECT_EQ(c.logging.file, "serve.log");
  EXPECT_EQ(c.logging.format, "json");
  EXPECT_TRUE(c.warnings.empty());
}

// The example in config.h's comment is a valid file.
TEST(ServeConfigTest, HeaderExampleParses) {
  std::ifstream header(std::string(LOOM_SOURCE_DIR) + "/src/serve/config.h");
  ASSERT_TRUE(header.good());
  std::string line, yaml;
  bool inside = false;
  while (std::getline(header, line)) {
    if (line == "//   server:") inside = true;
    if (!inside) continue;
    if (!line.starts_with("//   ")) break;
    yaml += line.substr(5) + "\n";
  }
  ASSERT_NE(yaml.find("logging:"), std::string::npos) << yaml;
  StatusOr<ServeConfig> c = Parse(yaml);
  ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << yaml;
  EXPECT_EQ(c->gpu.devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(c->server.max_body_bytes, 8 << 20);
  EXPECT_EQ(c->batching.capture_bytes, 256 << 20);
  EXPECT_EQ(c->memory.activation_cache_filter,
            std::vector<std::string>{"blocks.1.hook_resid_post"});
  EXPECT_TRUE(c->warnings.empty());
}

TEST(ServeConfigTest, ToJsonHasEverySectionAndKeyAndHidesTheToken) {
  StatusOr<ServeConfig> parsed = Parse(kFullExample);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const nlohmann::json j = parsed->ToJson();
  EXPECT_EQ(j["server"]["http_port"], 9001);
  EXPECT_EQ(j["server"]["auth_token"], "<redacted>");
  EXPECT_EQ(j["server"]["cors_allow_credentials"], true);
  EXPECT_EQ(j["gpu"]["devices"], nlohmann::json::array({0, 2}));
  EXPECT_EQ(j["gpu"]["memory_fraction"], 0.5);
  EXPECT_EQ(j["models"]["default_dtype"], "bfloat16");
  EXPECT_EQ(j["hidden_states"]["default_layers"],
            nlohmann::json::array({0, -2, -1}));
  EXPECT_EQ(j["batching"]["capture_bytes"], 1 << 20);
  EXPECT_EQ(j["logging"]["level"], "warning");
  EXPECT_TRUE(j["warnings"].is_array());

  const nlohmann::json d = ServeConfig().ToJson();
  EXPECT_EQ(d["server"]["auth_token"], "");  // nothing to hide
  const std::vector<std::pair<std::string, size_t>> sizes = {
      {"server", 15}, {"gpu", 3},      {"models", 4},  {"hidden_states", 5},
      {"memory", 4},  {"batching", 6}, {"logging", 3}, {"persistence", 8},
      {"interp", 1}};
  for (const auto& [section, keys] : sizes) {
    ASSERT_TRUE(d.contains(section)) << section;
    EXPECT_EQ(d[section].size(), keys) << section;
  }
  EXPECT_EQ(d.size(), sizes.size() + 1);  // + warnings
}

TEST(ServeConfigTest, UnknownKeyNamesItsPathAndPlace) {
  const std::string message = ParseError("server:\n  http_prot: 80\n");
  EXPECT_CONTAINS(message, "test.yaml:2:3: unknown key server.http_prot");
  EXPECT_CONTAINS(message, "did you mean server.http_port?");
  EXPECT_CONTAINS(message,
                  "the keys of server are: transport, unix_socket, http_host");
  EXPECT_CONTAINS(ParseError("batching:\n  slot_count: 2\n"),
                  "unknown key batching.slot_count");
  // Keys are exact: TheLoom's names only.
  EXPECT_CONTAINS(ParseError("server:\n  port: 80\n"),
                  "unknown key server.port");
}

TEST(ServeConfigTest, UnknownSectionNamesIt) {
  const std::string message = ParseError("sever:\n  http_port: 80\n");
  EXPECT_CONTAINS(message, "test.yaml:1:1: unknown section sever");
  EXPECT_CONTAINS(message, "did you mean server?");
  EXPECT_CONTAINS(message, "server, gpu, models, hidden_states, memory");
  EXPECT_CONTAINS(ParseError("gpu: {}\ntelemetry: {a: 1}\n"),
                  "test.yaml:2:1: unknown section telemetry");
}

TEST(ServeConfigTest, WrongTypesNameTheKeyTheValueAndTheExpectation) {
  EXPECT_CONTAINS(ParseError("server:\n  http_port: abc\n"),
                  "test.yaml:2:14: server.http_port: expected an integer in "
                  "0..65535, found abc");
  // A quoted number is a string.
  EXPECT_CONTAINS(ParseError("server:\n  http_port: \"8080\"\n"),
                  "server.http_port: expected an integer in 0..65535, found "
                  "the string \"8080\"");
  EXPECT_CONTAINS(ParseError("server:\n  max_queue: 2.5\n"),
                  "server.max_queue: expected an integer >= 0, found 2.5");
  EXPECT_CONTAINS(ParseError("gpu:\n  devices: {first: 0}\n"),
                  "gpu.devices: expected a list of integers (e.g. [a, b]), "
                  "found a map");
  EXPECT_CONTAINS(ParseError("models:\n  preload: gpt2\n"),
                  "models.preload: expected a list of strings (e.g. [a, b]), "
                  "found gpt2");
  EXPECT_CONTAINS(ParseError("gpu:\n  devices: [0, one]\n"),
                  "test.yaml:2:16: gpu.devices[1]: expected an integer in "
                  "0..2147483647, found one");
  EXPECT_CONTAINS(ParseError("server:\n  cors_allow_credentials: maybe\n"),
                  "server.cors_allow_credentials: expected true or false, "
                  "found maybe");
  EXPECT_CONTAINS(ParseError("gpu:\n  memory_fraction: most\n"),
                  "gpu.memory_fraction: expected a number in [0.1, 1], found "
                  "most");
  EXPECT_CONTAINS(ParseError("server:\n  http_host: [a, b]\n"),
                  "server.http_host: expected a non-empty string, found a "
                  "list");
  // A key with no value is null, an error where a value is needed (the
  // place is the key's).
  EXPECT_CONTAINS(ParseError("server:\n  http_port:\nlogging: {}\n"),
                  "test.yaml:2:3: server.http_port: expected an integer in "
                  "0..65535, found null (no value)");
  EXPECT_CONTAINS(ParseError("server: 8080\n"),
                  "section server: expected a map of keys, found 8080");
  EXPECT_CONTAINS(ParseError("- server\n- gpu\n"),
                  "test.yaml:1:1: expected a map of sections (server, gpu, "
                  "models, hidden_states, memory, batching, logging, "
                  "persistence, interp), found "
                  "a list");
  EXPECT_CONTAINS(ParseError("models:\n  preload: [a, ~]\n"),
                  "models.preload[1]: expected a non-empty string, found null");
}

TEST(ServeConfigTest, OutOfRangeValuesNameTheKeyTheValueAndTheRange) {
  EXPECT_CONTAINS(ParseError("server:\n  http_port: 70000\n"),
                  "test.yaml:2:14: server.http_port: expected an integer in "
                  "0..65535, found 70000");
  EXPECT_CONTAINS(ParseError("server:\n  http_port: -1\n"),
                  "server.http_port: expected an integer in 0..65535, found "
                  "-1");
  EXPECT_CONTAINS(ParseError("server:\n  max_batch_prompts: 0\n"),
                  "server.max_batch_prompts: expected an integer > 0, found 0");
  EXPECT_CONTAINS(ParseError("server:\n  max_body_bytes: -5\n"),
                  "server.max_body_bytes: expected a byte count > 0 (e.g. "
                  "8388608 or 8MiB), found -5");
  EXPECT_CONTAINS(ParseError("server:\n  threads: 99999999999\n"),
                  "server.threads: expected an integer in 0..2147483647, "
                  "found 99999999999");
  EXPECT_CONTAINS(ParseError("batching:\n  slots: 99999999999999999999\n"),
                  "batching.slots: expected an integer > 0, found "
                  "99999999999999999999");
  EXPECT_CONTAINS(ParseError("batching:\n  context: -2048\n"),
                  "batching.context: expected an integer >= 0, found -2048");
  EXPECT_CONTAINS(ParseError("gpu:\n  memory_fraction: 1.5\n"),
                  "gpu.memory_fraction: expected a number in [0.1, 1], found "
                  "1.5");
  EXPECT_CONTAINS(ParseError("gpu:\n  memory_fraction: .nan\n"),
                  "gpu.memory_fraction: expected a number in [0.1, 1], found "
                  ".nan");
  EXPECT_CONTAINS(ParseError("memory:\n  memory_warning_threshold: 0\n"),
                  "memory.memory_warning_threshold: expected a number in (0, "
                  "1], found 0");
  EXPECT_CONTAINS(ParseError("models:\n  max_loaded: 0\n"),
                  "models.max_loaded: expected an integer in 1..2147483647, "
                  "found 0");
  EXPECT_CONTAINS(ParseError("gpu:\n  devices: [0, -1]\n"),
                  "gpu.devices[1]: expected an integer in 0..2147483647, "
                  "found -1");
  EXPECT_CONTAINS(ParseError("gpu:\n  devices: [1, 0, 1]\n"),
                  "gpu.devices: 1 is listed twice (items 0 and 2)");
  EXPECT_CONTAINS(ParseError("server:\n  chat_stream_format: sse\n"),
                  "server.chat_stream_format: expected one of auto, openai, "
                  "theloom, found \"sse\"");
  EXPECT_CONTAINS(ParseError("models:\n  default_dtype: int8\n"),
                  "models.default_dtype: expected one of auto, float32, "
                  "bfloat16, float16, found \"int8\"");
  EXPECT_CONTAINS(ParseError("logging:\n  level: verbose\n"),
                  "logging.level: expected one of debug, info, warning, "
                  "error, found \"verbose\"");
  EXPECT_CONTAINS(ParseError("server:\n  http_host: \"\"\n"),
                  "server.http_host: expected a non-empty string, found \"\"");
}

TEST(ServeConfigTest, RelationsBetweenKeysAreChecked) {
  EXPECT_CONTAINS(ParseError("gpu:\n  devices: [0, 1]\n  default_device: 3\n"),
                  "test.yaml: gpu.default_device: expected -1 (the CPU) or "
                  "one of gpu.devices [0, 1], found 3");
  EXPECT_CONTAINS(ParseError("gpu:\n  default_device: 0\n"),
                  "gpu.default_device: expected -1 (the CPU) or one of "
                  "gpu.devices [], found 0");
  EXPECT_CONTAINS(ParseError("models:\n  preload: [a, b]\n  max_loaded: 1\n"),
                  "models.preload: 2 models to load at start, more than "
                  "models.max_loaded (1)");
  EXPECT_CONTAINS(
      ParseError("batching:\n  kv_tokens: 4096\n  page_size: 0\n"),
      "batching.kv_tokens: 4096 KV tokens need pages, but batching.page_size "
      "is 0");
}

TEST(ServeConfigTest, MalformedYamlNamesLineAndColumn) {
  const std::string message =
      ParseError("server:\n  http_port: 8080\n  cors_origins: [a,\n");
  EXPECT_CONTAINS(message, "test.yaml:4:1: malformed YAML: ");
  EXPECT_CONTAINS(message, "end of sequence flow not found");
  EXPECT_CONTAINS(ParseError("server:\n  http_port: 1\n   bad: : x\n"),
                  "test.yaml:3:");
  EXPECT_CONTAINS(ParseError("server: *missing\n"),
                  "test.yaml:1:9: malformed YAML: the referenced anchor is "
                  "not defined");
  EXPECT_CONTAINS(ParseError("--- {}\n--- {}\n"),
                  "holds 2 YAML documents, expected one");
}

TEST(ServeConfigTest, DuplicateKeysAreErrors) {
  EXPECT_CONTAINS(ParseError("server:\n  http_port: 1\n  http_port: 2\n"),
                  "test.yaml:3:3: server.http_port is given twice (first at "
                  "line 2)");
  EXPECT_CONTAINS(ParseError("gpu: {}\nmodels: {}\ngpu: {}\n"),
                  "test.yaml:3:1: section gpu is given twice (first at line "
                  "1)");
}

TEST(ServeConfigTest, Transports) {
  for (std::string_view transport : {"http", "unix", "both"}) {
    StatusOr<ServeConfig> c =
        Parse("server:\n  transport: " + std::string(transport) +
              "\n  unix_socket: /run/loom/s.sock\n");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->server.transport, transport);
    EXPECT_EQ(c->server.unix_socket, "/run/loom/s.sock");
  }
  EXPECT_EQ(ServeConfig().server.unix_socket, "/tmp/loom.sock");
  EXPECT_CONTAINS(ParseError("server:\n  transport: grpc\n"),
                  "server.transport: expected one of http, unix, both, found "
                  "\"grpc\"");
  EXPECT_CONTAINS(ParseError("server:\n  unix_socket: \"\"\n"),
                  "server.unix_socket: expected a non-empty string");
  EXPECT_CONTAINS(
      ParseError("server:\n  unix_socket: /" + std::string(120, 'a') + "\n"),
      "server.unix_socket: a socket path holds at most 107 bytes, found 121");
}

TEST(ServeConfigTest, Persistence) {
  const ServeConfig defaults;
  EXPECT_FALSE(defaults.persistence.enabled);
  EXPECT_EQ(defaults.persistence.db_path, "~/.local/share/loom/experiments.db");
  EXPECT_EQ(defaults.persistence.hidden_states_dir,
            "~/.local/share/loom/hidden_states");
  EXPECT_EQ(defaults.persistence.export_dir, "~/.local/share/loom/exports");
  EXPECT_EQ(defaults.persistence.compression, "gzip");
  EXPECT_EQ(defaults.persistence.compression_level, 4);
  EXPECT_EQ(defaults.persistence.chunk_size, 1024);
  EXPECT_TRUE(defaults.persistence.auto_persist);
  StatusOr<ServeConfig> c = Parse(
      "persistence:\n  enabled: true\n  db_path: /srv/x.db\n"
      "  hidden_states_dir: /srv/h\n  export_dir: /srv/e\n"
      "  compression: null\n  compression_level: 9\n  chunk_size: 64\n"
      "  auto_persist: false\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->persistence.enabled);
  EXPECT_EQ(c->persistence.db_path, "/srv/x.db");
  EXPECT_EQ(c->persistence.hidden_states_dir, "/srv/h");
  EXPECT_EQ(c->persistence.export_dir, "/srv/e");
  EXPECT_EQ(c->persistence.compression, "");
  EXPECT_EQ(c->persistence.compression_level, 9);
  EXPECT_EQ(c->persistence.chunk_size, 64);
  EXPECT_FALSE(c->persistence.auto_persist);
  EXPECT_TRUE(c->warnings.empty());
  EXPECT_EQ(c->ToJson()["persistence"]["db_path"], "/srv/x.db");
  EXPECT_CONTAINS(ParseError("persistence:\n  compression: zstd\n"),
                  "persistence.compression: expected one of gzip, lzf, none");
  EXPECT_CONTAINS(ParseError("persistence:\n  compression_level: 10\n"),
                  "persistence.compression_level: expected an integer in 0..9");
  EXPECT_CONTAINS(ParseError("persistence:\n  chunk_size: 63\n"),
                  "persistence.chunk_size: expected an integer >= 64");
  EXPECT_CONTAINS(ParseError("persistence:\n  dbpath: x\n"),
                  "unknown key persistence.dbpath (did you mean "
                  "persistence.db_path?)");
}

TEST(ServeConfigTest, NullAndUnitsAndSpellings) {
  StatusOr<ServeConfig> c = Parse(
      "server:\n  auth_token: ~\n  max_body_bytes: 1.5 KiB\n"
      "  max_analysis_body_bytes: 1GiB\n"
      "  cors_origins:\n  cors_allow_credentials: YES\n"
      "logging:\n  file: null\n  format:\n  level: Debug\n"
      "models:\n  default_dtype: f16\n"
      "hidden_states:\n  default_layers: []\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.auth_token, "");
  EXPECT_EQ(c->server.max_body_bytes, 1536);
  EXPECT_EQ(c->server.max_analysis_body_bytes, int64_t{1} << 30);
  EXPECT_TRUE(c->server.cors_origins.empty());
  EXPECT_TRUE(c->server.cors_allow_credentials);
  EXPECT_EQ(c->logging.file, "");
  EXPECT_EQ(c->logging.level, "debug");
  EXPECT_EQ(c->models.default_dtype, "float16");
  EXPECT_TRUE(c->hidden_states.default_layers.empty());
  // String keys take any scalar as written.
  StatusOr<ServeConfig> token = Parse("server:\n  auth_token: 0123\n");
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(token->server.auth_token, "0123");
}

// A config written for TheLoom: its defaults, spelled out.
constexpr std::string_view kTheLoomConfig = R"(
server:
  transport: http
  http_host: 0.0.0.0
  http_port: 8080
  unix_socket: /run/theloom/loom.sock
  cors_origins: ["*"]
  cors_allow_credentials: false
gpu:
  devices: [0]
  default_device: 0
  memory_fraction: 0.9
models:
  cache_dir: ~/.cache/huggingface
  preload: []
  max_loaded: 3
  default_dtype: auto
  trust_remote_code: false
  auto_unload_minutes: 20
hidden_states:
  default_layers: [-1]
  include_attention: false
  precision: float32
memory:
  precision_mode: auto
  enable_gradient_checkpointing: false
  streaming_chunk_size: 512
  memory_warning_threshold: 0.85
  activation_cache_filter: []
loaders:
  fallback_order: [transformers, sentence_transformers, custom]
  transformers_default_kwargs: {}
logging:
  level: INFO
  file: null
  format: "%(asctime)s - %(name)s - %(levelname)s - %(message)s"
persistence:
  enabled: false
  compression: gzip
patching: {}
model_overrides:
  mistralai/Mistral-7B-Instruct-v0.3:
    dtype: bfloat16
)";

TEST(ServeConfigTest, TheLoomKeysThatDoNotApplyAreIgnoredWithWarnings) {
  StatusOr<ServeConfig> c = Parse(kTheLoomConfig);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.http_host, "0.0.0.0");
  EXPECT_EQ(c->server.cors_origins, std::vector<std::string>{"*"});
  EXPECT_EQ(c->gpu.devices, std::vector<int>{0});
  EXPECT_EQ(c->gpu.default_device, 0);
  EXPECT_EQ(c->logging.level, "info");
  EXPECT_EQ(c->logging.format,
            "%(asctime)s - %(name)s - %(levelname)s - %(message)s");
  const std::vector<std::string> expected = {
      "test.yaml:14:3: models.cache_dir is a TheLoom key that loom serve "
      "ignores",
      "test.yaml:18:3: models.trust_remote_code is a TheLoom key that loom "
      "serve ignores",
      "test.yaml:19:3: models.auto_unload_minutes is a TheLoom key that loom "
      "serve ignores",
      "test.yaml:22:3: hidden_states.include_attention is a TheLoom key that "
      "loom serve ignores",
      "test.yaml:26:3: memory.enable_gradient_checkpointing is a TheLoom key "
      "that loom serve ignores",
      "test.yaml:30:1: section loaders is a TheLoom section that loom serve "
      "ignores",
      "test.yaml:40:1: section patching is a TheLoom section that loom serve "
      "ignores",
      "test.yaml:41:1: section model_overrides is a TheLoom section that "
      "loom serve ignores",
  };
  EXPECT_EQ(c->warnings, expected);
  EXPECT_EQ(c->ToJson()["warnings"].size(), expected.size());
}

// ---------------------------------------------------------------------------
// Environment overrides.

// Applies `env` to the defaults; the error, if any, must have `code`.
StatusOr<ServeConfig> Env(const std::vector<std::string>& env,
                          ServeConfig config = ServeConfig()) {
  Status status = ApplyEnvOverrides(env, config);
  if (!status.ok()) return status;
  return config;
}

std::string EnvError(const std::vector<std::string>& env,
                     StatusCode code = StatusCode::kInvalidArgument) {
  ServeConfig config;
  config.server.http_port = 1234;
  Status status = ApplyEnvOverrides(env, config);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), code) << status.ToString();
  // On error the config is unchanged.
  EXPECT_EQ(config.server.http_port, 1234);
  EXPECT_TRUE(config.warnings.empty());
  return status.message();
}

TEST(ServeConfigEnvTest, SetsIntsListsAndStrings) {
  StatusOr<ServeConfig> c = Env({
      "LOOM_SERVER__HTTP_PORT=9000",
      "LOOM_GPU__DEVICES=[0,1]",
      "LOOM_GPU__DEFAULT_DEVICE=1",
      "LOOM_MEMORY__ACTIVATION_CACHE_FILTER=[\"blocks.1.hook_resid_post\"]",
      "LOOM_SERVER__HTTP_HOST=0.0.0.0",
      "LOOM_SERVER__MAX_BODY_BYTES=1MiB",
      "LOOM_SERVER__CORS_ALLOW_CREDENTIALS=true",
      "LOOM_HIDDEN_STATES__DEFAULT_LAYERS=[-1, -2]",
      "LOOM_LOGGING__LEVEL=ERROR",
  });
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.http_port, 9000);
  EXPECT_EQ(c->gpu.devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(c->gpu.default_device, 1);
  EXPECT_EQ(c->memory.activation_cache_filter,
            std::vector<std::string>{"blocks.1.hook_resid_post"});
  EXPECT_EQ(c->server.http_host, "0.0.0.0");
  EXPECT_EQ(c->server.max_body_bytes, 1 << 20);
  EXPECT_TRUE(c->server.cors_allow_credentials);
  EXPECT_EQ(c->hidden_states.default_layers, (std::vector<int64_t>{-1, -2}));
  EXPECT_EQ(c->logging.level, "error");
  EXPECT_TRUE(c->warnings.empty());
}

TEST(ServeConfigEnvTest, StringValuesAreVerbatim) {
  // YAML would read these as an alias, a map and a comment.
  for (const std::string token : {"*abc", "a: b", "x #y", "\"quoted\""}) {
    StatusOr<ServeConfig> c = Env({"LOOM_SERVER__AUTH_TOKEN=" + token});
    ASSERT_TRUE(c.ok()) << token << ": " << c.status().ToString();
    EXPECT_EQ(c->server.auth_token, token);
  }
  StatusOr<ServeConfig> empty = Env({"LOOM_SERVER__AUTH_TOKEN="});
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->server.auth_token, "");
}

TEST(ServeConfigEnvTest, NamesAreCaseInsensitive) {
  StatusOr<ServeConfig> c =
      Env({"loom_server__http_port=7000", "Loom_Models__Max_Loaded=5",
           "LOOM_hidden_STATES__precision=float16"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.http_port, 7000);
  EXPECT_EQ(c->models.max_loaded, 5);
  EXPECT_EQ(c->hidden_states.precision, "float16");
}

TEST(ServeConfigEnvTest, FlatTheLoomVariables) {
  ServeConfig base;
  base.gpu.devices = {0, 1};
  StatusOr<ServeConfig> c = Env({"LOOM_MAX_MODELS=7", "LOOM_DEFAULT_DEVICE=1",
                                 "LOOM_MEMORY_FRACTION=0.5"},
                                base);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->models.max_loaded, 7);
  EXPECT_EQ(c->gpu.default_device, 1);
  EXPECT_DOUBLE_EQ(c->gpu.memory_fraction, 0.5);
  // LOOM_<SECTION>__<KEY> wins over the flat name, wherever it stands.
  StatusOr<ServeConfig> both =
      Env({"LOOM_MODELS__MAX_LOADED=4", "LOOM_MAX_MODELS=9"});
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->models.max_loaded, 4);
  EXPECT_CONTAINS(EnvError({"LOOM_MEMORY_FRACTION=2"}),
                  "environment variable LOOM_MEMORY_FRACTION: "
                  "gpu.memory_fraction: expected a number in [0.1, 1], found "
                  "2");
}

TEST(ServeConfigEnvTest, OtherVariablesAreSkipped) {
  StatusOr<ServeConfig> c = Env({
      "PATH=/usr/bin",
      "HOME",  // no '='
      "LOOM_CPU_KERNELS=reference",
      "LOOM_SOMETHING=1",
      "LOOM_=x",
      "XLOOM_SERVER__HTTP_PORT=1",
      "MY_LOOM_SERVER__HTTP_PORT=1",
  });
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ExpectDefaults(*c);
}

TEST(ServeConfigEnvTest, UnknownSectionOrKeyNamesTheVariable) {
  std::string message = EnvError({"LOOM_SERVER__HTTP_PROT=80"});
  EXPECT_CONTAINS(message,
                  "environment variable LOOM_SERVER__HTTP_PROT: unknown key "
                  "server.http_prot (did you mean server.http_port?)");
  message = EnvError({"LOOM_SEVER__HTTP_PORT=80"});
  EXPECT_CONTAINS(message,
                  "environment variable LOOM_SEVER__HTTP_PORT: unknown "
                  "section sever");
  EXPECT_CONTAINS(EnvError({"LOOM_SERVER__HTTP__PORT=80"}),
                  "LOOM_SERVER__HTTP__PORT: unknown key server.http__port");
}

TEST(ServeConfigEnvTest, BadValuesNameTheVariableAndTheValue) {
  EXPECT_CONTAINS(EnvError({"LOOM_SERVER__HTTP_PORT=70000"}),
                  "environment variable LOOM_SERVER__HTTP_PORT: "
                  "server.http_port: expected an integer in 0..65535, found "
                  "70000");
  EXPECT_CONTAINS(EnvError({"LOOM_GPU__DEVICES=0,1"}),
                  "LOOM_GPU__DEVICES: gpu.devices: expected a list of "
                  "integers (e.g. [a, b]), found \"0,1\"");
  EXPECT_CONTAINS(EnvError({"LOOM_GPU__DEVICES=[0,"}),
                  "LOOM_GPU__DEVICES: gpu.devices: malformed value \"[0,\"");
  EXPECT_CONTAINS(EnvError({"LOOM_SERVER__HTTP_PORT="}),
                  "LOOM_SERVER__HTTP_PORT: server.http_port: expected an "
                  "integer in 0..65535, found null (no value)");
  EXPECT_CONTAINS(EnvError({"LOOM_SERVER__TRANSPORT=tcp"}),
                  "environment variable LOOM_SERVER__TRANSPORT: "
                  "server.transport: expected one of http, unix, both");
  // Relations are checked once all variables are applied.
  EXPECT_CONTAINS(EnvError({"LOOM_GPU__DEFAULT_DEVICE=2"}),
                  "after the LOOM_ environment overrides: "
                  "gpu.default_device: expected -1 (the CPU) or one of "
                  "gpu.devices [], found 2");
  StatusOr<ServeConfig> ordered =
      Env({"LOOM_GPU__DEFAULT_DEVICE=2", "LOOM_GPU__DEVICES=[2]"});
  EXPECT_TRUE(ordered.ok()) << ordered.status().ToString();
}

TEST(ServeConfigEnvTest, TheLoomKeysThatDoNotApplyWarn) {
  StatusOr<ServeConfig> c = Env({
      "LOOM_MODELS__TRUST_REMOTE_CODE=true",
      "LOOM_PERSISTENCE__ENABLED=true",
      "LOOM_PERSISTENCE__DB_PATH=x.db",
      "LOOM_SERVER__HTTP_PORT=81",
  });
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.http_port, 81);
  EXPECT_TRUE(c->persistence.enabled);
  EXPECT_EQ(c->persistence.db_path, "x.db");
  const std::vector<std::string> expected = {
      "environment variable LOOM_MODELS__TRUST_REMOTE_CODE: "
      "models.trust_remote_code is a TheLoom key that loom serve ignores",
  };
  EXPECT_EQ(c->warnings, expected);
}

// ---------------------------------------------------------------------------
// Validation of values set in code, files.

TEST(ServeConfigTest, ValidateChecksValuesSetInCode) {
  ServeConfig c;
  c.server.http_port = 70000;
  EXPECT_CONTAINS(ValidateServeConfig(c).message(),
                  "server.http_port: expected an integer in 0..65535, found "
                  "70000");
  c = ServeConfig();
  c.server.transport = "both";
  EXPECT_TRUE(ValidateServeConfig(c).ok());
  c.server.transport = "udp";
  EXPECT_CONTAINS(ValidateServeConfig(c).message(),
                  "server.transport: expected one of http, unix, both");
  c = ServeConfig();
  c.models.default_dtype = "bf16";  // the short names are valid
  c.logging.level = "WARNING";      // so is any case
  EXPECT_TRUE(ValidateServeConfig(c).ok());
  c.memory.streaming_chunk_size = 0;
  EXPECT_CONTAINS(ValidateServeConfig(c).message(),
                  "memory.streaming_chunk_size: expected an integer > 0, "
                  "found 0");
  c = ServeConfig();
  c.models.dirs = {"a", "b", "a"};
  EXPECT_CONTAINS(ValidateServeConfig(c).message(),
                  "models.dirs: \"a\" is listed twice (items 0 and 2)");
  c = ServeConfig();
  c.server.cors_origins = {""};
  EXPECT_CONTAINS(ValidateServeConfig(c).message(),
                  "server.cors_origins[0]: expected a non-empty string");
}

TEST(ServeConfigTest, LoadsFiles) {
  loom::testing::TempDir dir;
  const std::string path = dir.File("serve.yaml");
  loom::testing::WriteBytes(path, "server:\n  http_port: 9100\n");
  StatusOr<ServeConfig> c = LoadServeConfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.http_port, 9100);

  loom::testing::WriteBytes(path, "server:\n  http_port: [1]\n");
  c = LoadServeConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), path + ":2:14: server.http_port");

  const std::string missing = dir.File("missing.yaml");
  c = LoadServeConfig(missing);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(c.status().message(), missing);

  c = LoadServeConfig(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "is a directory");
}

}  // namespace
}  // namespace loom::serve
