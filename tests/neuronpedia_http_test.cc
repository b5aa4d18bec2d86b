// Neuronpedia's routes on `loom serve` (docs/saes.md, "HTTP"):
//   - every non-transcoder SAE golden (golden/sae) through
//     /v1/activation/topk-by-token and /v1/activation/single from Loom's own
//     activations (atol/rtol 1e-4; indices where the golden's gaps decide);
//   - on the bundled model with an SAE written here: the three activation
//     routes agree with each other, /v1/activation/all ranks as stated,
//     steering by a feature is the `add` intervention of its decoder row
//     on /generate (same tokens) and DEFAULT is the plain generation;
//   - every field is validated: 400 {"error": "field `...`: ..."}.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/io/safetensors.h"
#include "src/io/safetensors_writer.h"
#include "src/io/test_util.h"
#include "src/serve/running_server.h"
#include "src/tokenizer/tokenizer.h"
#include "tests/golden_util.h"

namespace loom::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json Post(const Running& s, const std::string& path, const json& body,
          int want = 200) {
  httplib::Client c = s.Client();
  const httplib::Result r = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r) << path;
  if (!r) return json();
  EXPECT_EQ(r->status, want) << path << " " << body.dump() << ": " << r->body;
  return json::parse(r->body, nullptr, false);
}

// A standard SAELens 6 SAE (ReLU, apply_b_dec_to_input) of `d_sae`
// features reading `hook` of width `d`, weights from a fixed sequence.
void WriteSae(const std::string& dir, const std::string& hook, int64_t d,
              int64_t d_sae) {
  fs::create_directories(dir);
  std::vector<float> w_enc(d * d_sae), w_dec(d_sae * d), b_enc(d_sae), b_dec(d);
  uint32_t x = 12345;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
  };
  for (float& v : w_enc) v = next();
  for (float& v : w_dec) v = next();
  for (float& v : b_enc) v = 0.2f * next();
  for (float& v : b_dec) v = 0.1f * next();
  SafetensorsWriter w;
  ASSERT_TRUE(
      w.Add("W_enc", DType::kF32, {d, d_sae}, w_enc.data(), 4 * d * d_sae)
          .ok());
  ASSERT_TRUE(
      w.Add("W_dec", DType::kF32, {d_sae, d}, w_dec.data(), 4 * d * d_sae)
          .ok());
  ASSERT_TRUE(
      w.Add("b_enc", DType::kF32, {d_sae}, b_enc.data(), 4 * d_sae).ok());
  ASSERT_TRUE(w.Add("b_dec", DType::kF32, {d}, b_dec.data(), 4 * d).ok());
  ASSERT_TRUE(w.Write(dir + "/sae_weights.safetensors").ok());
  std::ofstream(dir + "/cfg.json") << json{
      {"architecture", "standard"},
      {"d_in", d},
      {"d_sae", d_sae},
      {"dtype", "float32"},
      {"apply_b_dec_to_input", true},
      {"metadata",
       {{"sae_lens_version", "6.18.0"},
        {"hook_name", hook}}}}.dump();
}

class NeuronpediaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteSae(dir_.File("sae"), "blocks.2.hook_resid_post", 64, 48);
    WriteSae(dir_.File("sae1"), "blocks.1.hook_resid_post", 64, 48);
    ServerOptions o;
    o.engine.precision = Precision::kF32;
    o.saes = {"2-res-test=" + dir_.File("sae"),
              "1-res-test=" + dir_.File("sae1") + "@blocks.1.hook_resid_post",
              "2-other=" + dir_.File("sae")};
    server_ = std::make_unique<Running>(o);
  }
  loom::testing::TempDir dir_;
  std::unique_ptr<Running> server_;
};

// Features by position (topk-by-token) are the largest values of each
// position that /v1/activation/single returns, and /v1/activation/all's
// values are single's; the leading BOS is dropped as asked.
TEST_F(NeuronpediaTest, TheActivationRoutesAgree) {
  const std::string prompt = "Once upon a time there was a cat";
  const json topk = Post(*server_, "/v1/activation/topk-by-token",
                         {{"prompt", prompt},
                          {"model", "stories"},
                          {"source", "2-res-test"},
                          {"topK", 4},
                          {"ignoreBos", false}});
  const json with_bos = topk["results"];
  ASSERT_GT(with_bos.size(), 3u);
  EXPECT_EQ(with_bos[0]["token"], "<s>");
  EXPECT_TRUE(with_bos[0]["isSpecial"].get<bool>());
  const json dropped = Post(*server_, "/v1/activation/topk-by-token",
                            {{"prompt", prompt},
                             {"source", "2-res-test"},
                             {"topK", 4},
                             {"ignore_bos", true}})["results"];
  ASSERT_EQ(dropped.size() + 1, with_bos.size());
  EXPECT_EQ(dropped[0]["tokenPosition"], 1);
  EXPECT_EQ(dropped[0], with_bos[1]);

  // Each position's top features as single sees them.
  for (int f : {with_bos[2]["topFeatures"][0]["featureIndex"].get<int>(),
                with_bos[3]["topFeatures"][1]["featureIndex"].get<int>()}) {
    const json single = Post(*server_, "/v1/activation/single",
                             {{"prompt", prompt},
                              {"source", "2-res-test"},
                              {"index", std::to_string(f)}});
    const json& v = single["activation"]["values"];
    ASSERT_EQ(v.size(), with_bos.size() - 1);  // the BOS dropped
    for (size_t t = 1; t < with_bos.size(); ++t) {
      const json& top = with_bos[t]["topFeatures"];
      for (const json& e : top)
        if (e["featureIndex"] == f)
          EXPECT_EQ(e["activationValue"].get<float>(), v[t - 1].get<float>());
      // No feature outside the top 4 beats the 4th.
      EXPECT_LE(v[t - 1].get<float>(), top[0]["activationValue"].get<float>());
    }
    const float max = single["activation"]["maxValue"];
    EXPECT_EQ(max, *std::max_element(v.begin(), v.end()));
  }

  const json all = Post(*server_, "/v1/activation/all",
                        {{"prompt", prompt},
                         {"sourceSet", "res-test"},
                         {"selectedSources", json::array()},
                         {"sortByTokenIndexes", json::array()},
                         {"ignoreBos", true},
                         {"numResults", 6}});
  const json& acts = all["activations"];
  ASSERT_EQ(acts.size(), 6u);
  for (size_t i = 0; i < acts.size(); ++i) {
    if (i > 0) EXPECT_GE(acts[i - 1]["maxValue"], acts[i]["maxValue"]);
    const json single = Post(*server_, "/v1/activation/single",
                             {{"prompt", prompt},
                              {"source", acts[i]["source"]},
                              {"index", acts[i]["index"]}});
    const json& v = acts[i]["values"];  // every position, the BOS zeroed
    EXPECT_EQ(v[0], 0.0);
    for (size_t t = 1; t < v.size(); ++t)
      EXPECT_EQ(v[t], single["activation"]["values"][t - 1]) << t;
  }
  const json ranked_by_sum = Post(*server_, "/v1/activation/all",
                                  {{"prompt", prompt},
                                   {"sourceSet", "res-test"},
                                   {"selectedSources", {"2-res-test"}},
                                   {"sortByTokenIndexes", {2, 3}},
                                   {"ignoreBos", true},
                                   {"numResults", 3}})["activations"];
  ASSERT_EQ(ranked_by_sum.size(), 3u);
  for (const json& a : ranked_by_sum) {
    EXPECT_EQ(a["source"], "2-res-test");
    EXPECT_NEAR(a["sumValues"].get<double>(),
                a["values"][2].get<double>() + a["values"][3].get<double>(),
                1e-6);
  }
  EXPECT_GE(ranked_by_sum[0]["sumValues"], ranked_by_sum[1]["sumValues"]);
}

// A direction's values are its dot product with the hook's rows, every
// position kept.
TEST_F(NeuronpediaTest, SingleByDirection) {
  std::vector<double> dir(64, 0.0);
  dir[5] = 1.0;
  const json r = Post(*server_, "/v1/activation/single",
                      {{"prompt", "Once upon a time"},
                       {"vector", dir},
                       {"hook", "blocks.2.hook_resid_post"}});
  const json& v = r["activation"]["values"];
  EXPECT_EQ(v.size(), r["tokens"].size());
  EXPECT_EQ(r["tokens"][0], "<s>");
}

// Steering by feature f with strength s (x strengthMultiplier) is the add
// intervention of W_dec[f] at the SAE's hook on every position: the same
// greedy tokens as /generate with it; DEFAULT is the plain generation.
TEST_F(NeuronpediaTest, SteeringIsTheAddInterventionOfTheDecoderRow) {
  const std::string prompt = "Once upon a time";
  const json steer =
      Post(*server_, "/v1/steer/completion",
           {{"prompt", prompt},
            {"model", "stories"},
            {"types", {"STEERED", "DEFAULT"}},
            {"features",
             {{{"source", "2-res-test"}, {"index", 7}, {"strength", 3.0}}}},
            {"steerMethod", "SIMPLE_ADDITIVE"},
            {"normalizeSteering", false},
            {"nCompletionTokens", 12},
            {"temperature", 0},
            {"seed", 5},
            {"strengthMultiplier", 2.0},
            {"freqPenalty", 0}});
  ASSERT_EQ(steer["outputs"].size(), 2u);
  EXPECT_EQ(steer["outputs"][0]["type"], "STEERED");
  // The decoder row, as the SAE file holds it.
  const json vectors = Post(*server_, "/v1/steer/completion",
                            {{"prompt", prompt},
                             {"types", {"DEFAULT"}},
                             {"features", json::array()},
                             {"nCompletionTokens", 12},
                             {"temperature", 0}});
  EXPECT_EQ(vectors["outputs"][0]["output"], steer["outputs"][1]["output"]);
  auto sf = SafetensorsFile::Open(dir_.File("sae/sae_weights.safetensors"));
  ASSERT_TRUE(sf.ok());
  const TensorInfo* w = (*sf)->Find("W_dec");
  ASSERT_NE(w, nullptr);
  const float* row = (*sf)->View(*w).as<float>() + 7 * 64;
  const std::vector<float> v(row, row + 64);
  // BOS put first as the steering route does.
  const json ids = Post(*server_, "/v1/tokenize", {{"text", prompt}})["tokens"];
  const json plain = Post(*server_, "/generate",
                          {{"prompt", ids},
                           {"max_tokens", 12},
                           {"temperature", 0},
                           {"return_hidden_states", false}});
  EXPECT_EQ(plain["text"], steer["outputs"][1]["output"]);
  const json edited = Post(*server_, "/generate",
                           {{"prompt", ids},
                            {"max_tokens", 12},
                            {"temperature", 0},
                            {"return_hidden_states", false},
                            {"interventions",
                             {{{"hook", "blocks.2.hook_resid_post"},
                               {"mode", "add"},
                               {"vector", v},
                               {"scale", 6.0}}}}});
  EXPECT_EQ(edited["text"], steer["outputs"][0]["output"]);
  EXPECT_NE(steer["outputs"][0]["output"], steer["outputs"][1]["output"])
      << "a strength of 6 on this SAE changes nothing: the test proves nothing";
  // The same direction sent as a vector.
  const json by_vector = Post(*server_, "/v1/steer/completion",
                              {{"prompt", prompt},
                               {"types", {"STEERED"}},
                               {"vectors",
                                {{{"steeringVector", v},
                                  {"strength", 6.0},
                                  {"hook", "blocks.2.hook_resid_post"}}}},
                               {"nCompletionTokens", 12},
                               {"temperature", 0}});
  EXPECT_EQ(by_vector["outputs"][0]["output"], steer["outputs"][0]["output"]);
}

// The chat route renders the messages with the model's template (its
// special tokens written once) and steers as the text route; with
// steerSpecialTokens false the prompt's special tokens (here the BOS) are
// left unedited.
TEST(NeuronpediaChat, SteersTheRenderedChat) {
  loom::testing::TempDir dir;
  const std::string model = dir.File("tpl");
  fs::copy(Stories(), model, fs::copy_options::recursive);
  std::ofstream(model + "/chat_template.jinja")
      << "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content "
         "}}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif "
         "%}";
  WriteSae(dir.File("sae"), "blocks.2.hook_resid_post", 64, 48);
  ServerOptions o;
  o.engine.precision = Precision::kF32;
  o.saes = {"2-res-test=" + dir.File("sae")};
  Running server(o, model);
  const json messages = {{{"role", "user"}, {"content", "Tell a story."}}};
  const json body = {
      {"prompt", messages},
      {"types", {"STEERED", "DEFAULT"}},
      {"features", {{{"source", "2-res-test"}, {"index", 7}, {"strength", 6}}}},
      {"nCompletionTokens", 10},
      {"temperature", 0}};
  const json all = Post(server, "/v1/steer/completion-chat", body);
  const std::string rendered = "<s>[user] Tell a story.\n[assistant] ";
  EXPECT_EQ(all["input"]["raw"], rendered);
  EXPECT_EQ(all["input"]["chatTemplate"], messages);
  ASSERT_EQ(all["outputs"].size(), 2u);
  const json& steered = all["outputs"][0];
  const std::string text = steered["chatTemplate"][1]["content"];
  EXPECT_EQ(steered["chatTemplate"][1]["role"], "assistant");
  EXPECT_EQ(steered["raw"], rendered + text);
  json skip = body;
  skip["steerSpecialTokens"] = false;
  const json no_special = Post(server, "/v1/steer/completion-chat", skip);
  auto tok = tok::Tokenizer::Load(model);
  ASSERT_TRUE(tok.ok());
  auto enc = (*tok)->Encode(rendered, false);
  ASSERT_TRUE(enc.ok());
  auto sf = SafetensorsFile::Open(dir.File("sae/sae_weights.safetensors"));
  ASSERT_TRUE(sf.ok());
  const float* row = (*sf)->View(*(*sf)->Find("W_dec")).as<float>() + 7 * 64;
  const std::vector<float> v(row, row + 64);
  const json add = {{"hook", "blocks.2.hook_resid_post"},
                    {"mode", "add"},
                    {"vector", v},
                    {"scale", 6.0}};
  auto generate = [&](const json& interventions) {
    return Post(server, "/generate",
                {{"prompt", enc->ids},
                 {"max_tokens", 10},
                 {"temperature", 0},
                 {"return_hidden_states", false},
                 {"interventions", interventions}})["text"];
  };
  EXPECT_EQ(
      generate(json::array()),
      all["outputs"][1]["raw"].get<std::string>().substr(rendered.size()));
  EXPECT_EQ(generate(json::array({add})), text);
  json prompt_part = add, generated_part = add;
  std::vector<int64_t> positions;
  for (size_t p = 1; p < enc->ids.size(); ++p) positions.push_back(p);
  prompt_part["positions"] = positions;
  prompt_part["apply_to"] = "prompt";
  generated_part["apply_to"] = "generated";
  EXPECT_EQ(generate(json::array({prompt_part, generated_part})),
            no_special["outputs"][0]["chatTemplate"][1]["content"]);
}

TEST_F(NeuronpediaTest, TokenizeAndCapabilities) {
  const json t = Post(*server_, "/v1/tokenize", {{"text", "Once upon"}});
  ASSERT_FALSE(t["tokens"].empty());
  EXPECT_EQ(t["tokens"].size(), t["tokenStrings"].size());
  EXPECT_TRUE(t["prependBos"].get<bool>());
  const json no_bos = Post(*server_, "/v1/tokenize",
                           {{"text", "Once upon"}, {"prependBos", false}});
  EXPECT_EQ(no_bos["tokens"].size() + 1, t["tokens"].size());
  EXPECT_FALSE(no_bos["prependBos"].get<bool>());
  httplib::Client c = server_->Client();
  const json caps = Body(c.Get("/v1/capabilities"));
  EXPECT_EQ(caps["sae_sets"], json({"res-test", "other"}));
  EXPECT_TRUE(caps["endpoints"]["activation_topk_by_token"].get<bool>());
  EXPECT_TRUE(caps["endpoints"]["lens_logit"].get<bool>());
  EXPECT_FALSE(caps["endpoints"]["lens_jacobian"].get<bool>());
  EXPECT_EQ(caps["device"], "cpu");
}

// Every field is checked: 400 {"error": "field `NAME`: ..."}.
TEST_F(NeuronpediaTest, BadFieldsAre400sNamingThem) {
  const json base = {{"prompt", "Once upon"}, {"source", "2-res-test"}};
  auto expect = [&](const std::string& path, json body,
                    const std::string& part) {
    const json r = Post(*server_, path, body, 400);
    ASSERT_TRUE(r["error"].is_string()) << r.dump();
    EXPECT_NE(r["error"].get<std::string>().find(part), std::string::npos)
        << path << " " << body.dump() << ": " << r.dump();
  };
  const std::string topk = "/v1/activation/topk-by-token";
  expect(topk, {{"prompt", "x"}, {"source", "9-nope"}}, "field `source`");
  expect(topk, {{"prompt", "x"}, {"source", "2-res-test"}, {"topK", 0}},
         "field `topK`");
  expect(topk, {{"prompt", "x"}, {"source", "2-res-test"}, {"top_k", 49}},
         "field `top_k`");
  expect(topk, {{"source", "2-res-test"}}, "field `prompt`");
  expect(topk, {{"prompt", "x"}, {"source", "2-res-test"}, {"ignoreBos", 1}},
         "field `ignoreBos`");
  const std::string all = "/v1/activation/all";
  expect(all, {{"prompt", "x"}, {"sourceSet", "nope"}}, "field `sourceSet`");
  expect(all,
         {{"prompt", "x"},
          {"sourceSet", "res-test"},
          {"selectedSources", {"2-other"}}},
         "field `selectedSources[0]`");
  expect(all,
         {{"prompt", "x"},
          {"sourceSet", "res-test"},
          {"sortByTokenIndexes", {99}}},
         "field `sortByTokenIndexes`");
  expect(all, {{"prompt", "x"}, {"sourceSet", "res-test"}, {"numResults", 0}},
         "field `numResults`");
  const std::string single = "/v1/activation/single";
  expect(single, {{"prompt", "x"}}, "exactly one of");
  expect(single, {{"prompt", "x"}, {"source", "2-res-test"}, {"index", "48"}},
         "field `index`");
  expect(single, {{"prompt", "x"}, {"source", "2-res-test"}, {"index", "a"}},
         "field `index`");
  expect(single,
         {{"prompt", "x"},
          {"vector", {1, 2}},
          {"hook", "blocks.2.hook_resid_post"}},
         "field `vector`");
  const std::string steer = "/v1/steer/completion";
  const json ok = {
      {"prompt", "x"},
      {"types", {"STEERED"}},
      {"features",
       {{{"source", "2-res-test"}, {"index", 1}, {"strength", 1}}}}};
  auto with = [&](const json& patch) {
    json b = ok;
    b.merge_patch(patch);
    return b;
  };
  expect(steer, with({{"types", {"BOTH"}}}), "field `types[0]`");
  expect(steer, with({{"types", json::array()}}), "field `types`");
  expect(steer, with({{"vectors", json::array()}}), "exactly one of");
  expect(steer, with({{"steerMethod", "ORTHOGONAL_DECOMP"}}),
         "field `steerMethod`");
  expect(steer, with({{"stream", true}}), "field `stream`");
  expect(steer, with({{"freqPenalty", 0.5}}), "field `freqPenalty`");
  expect(steer, with({{"nLogprobs", 2}}), "field `nLogprobs`");
  expect(steer, with({{"temperature", -1}}), "field `temperature`");
  expect(steer, with({{"seed", 1.5}}), "field `seed`");
  expect(steer, with({{"nCompletionTokens", 0}}), "field `nCompletionTokens`");
  expect(steer,
         with({{"features", {{{"source", "2-res-test"}, {"index", 48}}}}}),
         "field `index`");
  expect(steer,
         {{"prompt", "x"},
          {"types", {"STEERED"}},
          {"vectors",
           {{{"steeringVector", {1, 2}},
             {"strength", 1},
             {"hook", "blocks.2.hook_resid_post"}}}}},
         "field `vectors[0]`: the direction has 2 values");
  expect("/v1/steer/completion-chat", with(json::object()), "chat template");
  expect("/v1/tokenize", {{"text", 5}}, "field `text`");
}

// A bad interp.saes entry stops the server's start, naming it and the file.
TEST(NeuronpediaConfig, BadSaeEntriesAreRefusedAtStart) {
  loom::testing::TempDir dir;
  for (const auto& [spec, part] :
       std::vector<std::pair<std::string, std::string>>{
           {"no-equals-sign", "expected ID=PATH[@HOOK]"},
           {"1-x=" + dir.File("missing"), "interp.saes[0]"},
       }) {
    ServerOptions o;
    o.saes = {spec};
    auto s = Server::Create(o);
    ASSERT_FALSE(s.ok()) << spec;
    EXPECT_NE(s.status().message().find(part), std::string::npos)
        << s.status().message();
  }
  WriteSae(dir.File("sae"), "blocks.2.hook_resid_post", 64, 8);
  ServerOptions o;
  o.saes = {"1-a=" + dir.File("sae"), "1-a=" + dir.File("sae")};
  auto s = Server::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("configured twice"), std::string::npos);
}

// /v1/lens/prompt: NDJSON frames in order (meta, prompt, a frame per
// position, done), the same frames as stream: false; the last layer's top
// token at the last position is the greedy next token; cachedTokenIds skips
// the common prefix; a generation continues the prompt.
TEST_F(NeuronpediaTest, LensPromptFrames) {
  const json body = {{"model", "stories"},
                     {"type", {"LOGIT_LENS"}},
                     {"prompt", "Once upon a time"},
                     {"topN", 3},
                     {"layers", {1, 2}},
                     {"filterNonWordTokens", false}};
  httplib::Client c = server_->Client();
  const httplib::Result r =
      c.Post("/v1/lens/prompt", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/x-ndjson");
  std::vector<json> lines;
  for (size_t at = 0; at < r->body.size();) {
    size_t end = r->body.find('\n', at);
    if (end == std::string::npos) end = r->body.size();
    if (end > at) lines.push_back(json::parse(r->body.substr(at, end - at)));
    at = end + 1;
  }
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines.front()["kind"], "meta");
  EXPECT_EQ(lines.front()["layers_by_type"]["LOGIT_LENS"], json({1, 2, 4}));
  EXPECT_EQ(lines[1]["kind"], "prompt");
  EXPECT_EQ(lines.back()["kind"], "done");
  const int64_t T = lines.front()["prompt_len"];
  ASSERT_EQ(static_cast<int64_t>(lines.size()), T + 3);
  json unstreamed = body;
  unstreamed["stream"] = false;
  const json whole = Post(*server_, "/v1/lens/prompt", unstreamed);
  EXPECT_EQ(whole["meta"], lines.front());
  EXPECT_EQ(whole["done"], lines.back());
  for (int64_t t = 0; t < T; ++t) {
    const json& f = lines[static_cast<size_t>(t + 2)];
    EXPECT_EQ(f, whole["tokens"][t]);
    EXPECT_EQ(f["position"], t);
    ASSERT_EQ(f["results"][0]["top_tokens"].size(), 3u);  // layers 1, 2, 4
    for (const json& probs : f["results"][0]["top_probs"]) {
      ASSERT_EQ(probs.size(), 3u);
      EXPECT_GE(probs[0], probs[1]);
      EXPECT_LE(probs[0].get<double>(), 1.0);
    }
  }
  const json ids =
      Post(*server_, "/v1/tokenize", {{"text", "Once upon a time"}})["tokens"];
  const json next = Post(*server_, "/generate",
                         {{"prompt", ids},
                          {"max_tokens", 1},
                          {"temperature", 0},
                          {"return_hidden_states", false}});
  EXPECT_EQ(whole["tokens"][T - 1]["results"][0]["top_ids"][2][0],
            next["token_ids"][0]);
  json cached = unstreamed;
  cached["cachedTokenIds"] = {ids[0], ids[1], (ids[2].get<int>() + 1) % 512};
  const json reused = Post(*server_, "/v1/lens/prompt", cached);
  EXPECT_EQ(reused["meta"]["reuse_len"], 2);
  ASSERT_EQ(reused["tokens"].size(), static_cast<size_t>(T - 2));
  EXPECT_EQ(reused["tokens"][0], whole["tokens"][2]);
  json gen = unstreamed;
  gen["numCompletionTokens"] = 3;
  gen["temperature"] = 0;
  const json generated = Post(*server_, "/v1/lens/prompt", gen);
  EXPECT_EQ(generated["done"]["seq_len"], T + 3);
  EXPECT_TRUE(generated["tokens"][T]["is_generated"].get<bool>());
  EXPECT_FALSE(generated["tokens"][T - 1]["is_generated"].get<bool>());
  EXPECT_EQ(generated["tokens"][T]["id"], next["token_ids"][0]);
  EXPECT_EQ(generated["tokens"][T - 1], whole["tokens"][T - 1]);
  // filterNonWordTokens (the default) keeps words only, the last layer's
  // argmax aside.
  const json filtered = Post(*server_, "/v1/lens/prompt",
                             {{"type", {"LOGIT_LENS"}},
                              {"prompt", "Once upon"},
                              {"topN", 5},
                              {"stream", false}});
  for (const json& f : filtered["tokens"]) {
    const json& layers = f["results"][0]["top_tokens"];
    for (size_t l = 0; l + 1 < layers.size(); ++l)
      for (const json& w : layers[l]) {
        const std::string word = w;
        EXPECT_TRUE(std::any_of(
            word.begin(), word.end(),
            [](unsigned char ch) { return ch >= 0x80 || std::isalnum(ch); }))
            << "`" << word << "` is no word";
      }
  }
  for (const auto& [patch, part] : std::vector<std::pair<json, std::string>>{
           {{{"type", {"JACOBIAN_LENS"}}}, "field `type`"},
           {{{"type", json::array()}}, "field `type`"},
           {{{"topN", 0}}, "field `topN`"},
           {{{"layers", {99}}}, "field `layers`"},
           {{{"steerLayers", {1}}}, "field `steerLayers`"},
           {{{"chat", {{{"role", "user"}, {"content", "x"}}}}},
            "exactly one of"},
           {{{"temperature", 5}}, "field `temperature`"},
       }) {
    json b = unstreamed;
    b.merge_patch(patch);
    const json e = Post(*server_, "/v1/lens/prompt", b, 400);
    EXPECT_NE(e["error"].get<std::string>().find(part), std::string::npos)
        << patch.dump() << ": " << e.dump();
  }
}

// The logit-lens goldens (HF's residuals through the final norm and head):
// every layer's top-10 ids where the golden's gaps decide and the
// probabilities (softmax of the golden logits) within 2e-4 (rounded to 4
// decimals), from Loom's own residuals.
TEST(NeuronpediaGolden, LensPromptMatchesTheGoldens) {
  const std::string shared = loom::testing::SharedGoldenDir();
  const std::string root = shared + "/lens";
  if (shared.empty() || !fs::exists(root))
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens (golden/lens) not found";
  for (const char* name : {"llama", "qwen3", "gemma2", "olmoe"}) {
    SCOPED_TRACE(name);
    const json m =
        loom::testing::ReadJson(root + "/" + name + "/manifest.json");
    ServerOptions o;
    o.engine.precision = Precision::kF32;
    Running server(o, shared + "/tiny/" + m["model"].get<std::string>());
    auto golden = loom::testing::GoldenFile::Open(root + "/" + name +
                                                  "/golden.safetensors");
    for (const auto& [seq, info] : m["inputs"].items()) {
      SCOPED_TRACE(seq);
      const json r = Post(server, "/v1/lens/prompt",
                          {{"type", {"LOGIT_LENS"}},
                           {"inputTokenIds", info["input_ids"]},
                           {"topN", 10},
                           {"filterNonWordTokens", false},
                           {"stream", false}});
      Shape shape;
      const std::vector<float> logits =
          golden->F32(seq + ".logits_lens", &shape);
      const std::vector<int32_t> top = golden->Ids(seq + ".top10_ids");
      const std::vector<float> gap = golden->F32(seq + ".top10_gap");
      const int64_t L = shape[0], T = shape[1], V = shape[2];
      ASSERT_EQ(static_cast<int64_t>(r["tokens"].size()), T);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t l = 1; l < L; ++l) {  // golden index l: layer l - 1
          const json& res = r["tokens"][t]["results"][0];
          const json& ids = res["top_ids"][l - 1];
          const json& probs = res["top_probs"][l - 1];
          const float* row = logits.data() + (l * T + t) * V;
          const double max = *std::max_element(row, row + V);
          double z = 0;
          for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - max);
          for (int64_t j = 0; j < 10; ++j) {
            const size_t i = static_cast<size_t>((l * T + t) * 10 + j);
            if (gap[i] >= 1e-4f && (j == 0 || gap[i - 1] >= 1e-4f))
              EXPECT_EQ(ids[j].get<int32_t>(), top[i])
                  << t << "," << l << "," << j;
            const int32_t id = ids[j];
            EXPECT_NEAR(probs[j].get<double>(), std::exp(row[id] - max) / z,
                        2e-4);
          }
        }
    }
  }
}

// An SAE whose hook a model lacks (one server may serve models of several
// depths) does not stop that model's load; a request using it on that
// model is a 400 naming the source and the hook.
TEST(NeuronpediaConfig, AnSaeForADeeperModelIsARequestError) {
  loom::testing::TempDir dir;
  WriteSae(dir.File("deep"), "blocks.9.hook_resid_post", 64, 8);
  WriteSae(dir.File("sae"), "blocks.2.hook_resid_post", 64, 8);
  ServerOptions o;
  o.saes = {"9-deep=" + dir.File("deep"), "2-res=" + dir.File("sae")};
  Running server(o);
  const json bad = Post(server, "/v1/activation/topk-by-token",
                        {{"prompt", "Once"}, {"source", "9-deep"}}, 400);
  const std::string message = bad["error"];
  EXPECT_NE(message.find("source `9-deep`"), std::string::npos) << message;
  EXPECT_NE(message.find("blocks.9.hook_resid_post"), std::string::npos)
      << message;
  Post(server, "/v1/activation/topk-by-token",
       {{"prompt", "Once"}, {"source", "2-res"}});
}

// The SAE goldens (HF's activations through each library's formulas):
// topk-by-token and single from Loom's own activations, 1e-4.
TEST(NeuronpediaGolden, SaeRoutesMatchTheGoldens) {
  const std::string shared = loom::testing::SharedGoldenDir();
  const std::string root = shared + "/sae";
  if (shared.empty() || !fs::exists(root))
    GTEST_SKIP() << "SKIPPED LOUDLY: shared goldens (golden/sae) not found";
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string dir = entry.path().string();
    if (!fs::exists(dir + "/manifest.json")) continue;
    const json m = loom::testing::ReadJson(dir + "/manifest.json");
    if (m["architecture"].get<std::string>().find("transcoder") !=
        std::string::npos)
      continue;  // reads the pre-gain norm (docs/saes.md)
    SCOPED_TRACE(m["case"].get<std::string>());
    ServerOptions o;
    o.engine.precision = Precision::kF32;
    o.saes = {"0-golden=" + dir + "/" + m["sae_dir"].get<std::string>()};
    Running server(o, shared + "/tiny/" + m["model"].get<std::string>());
    auto golden = loom::testing::GoldenFile::Open(dir + "/golden.safetensors");
    const int64_t d_sae = m["dims"]["d_sae"];
    const json& seq = m["inputs"]["seq1"];
    const json topk = Post(server, "/v1/activation/topk-by-token",
                           {{"prompt", seq["input_ids"]},
                            {"source", "0-golden"},
                            {"topK", 16},
                            {"ignoreBos", false}})["results"];
    const std::vector<float> acts = golden->F32("seq1.feature_acts");
    const std::vector<float> values = golden->F32("seq1.topk_values");
    const std::vector<int32_t> ids = golden->Ids("seq1.topk_indices");
    const std::vector<float> gap = golden->F32("seq1.topk_gap");
    const size_t T = seq["input_ids"].size();
    ASSERT_EQ(topk.size(), T);
    for (size_t t = 0; t < T; ++t)
      for (size_t j = 0; j < 16; ++j) {
        const size_t i = t * 16 + j;
        const json& e = topk[t]["topFeatures"][j];
        EXPECT_NEAR(e["activationValue"].get<float>(), values[i],
                    1e-4 + 1e-4 * std::fabs(values[i]));
        if (gap[i] >= 1e-4f && (j == 0 || gap[i - 1] >= 1e-4f))
          EXPECT_EQ(e["featureIndex"].get<int32_t>(), ids[i]) << t << "," << j;
      }
    const int32_t f = ids[16];  // position 1's top feature
    const json single = Post(server, "/v1/activation/single",
                             {{"prompt", seq["input_ids"]},
                              {"source", "0-golden"},
                              {"index", std::to_string(f)}});
    const json& v = single["activation"]["values"];
    ASSERT_EQ(v.size(), T);  // token ids: no BOS put first
    for (size_t t = 0; t < T; ++t) {
      const float want = acts[t * d_sae + f];
      EXPECT_NEAR(v[t].get<float>(), want, 1e-4 + 1e-4 * std::fabs(want));
    }
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

}  // namespace
}  // namespace loom::serve
