// TheLoom's analysis routes over real HTTP (a server on a loopback port with
// the bundled model): /analyze/geometry with 3 rows and with 1,000 x 4,096
// rows sent as Go writes float64 (~80 MB), /analyze/bilateral with 3 + 5
// rows, the body limit of the analysis routes, TheLoom's text form of
// /analyze beside Loom's vector form, and the request bytes Weaver's Go
// client sends, replayed on a raw socket.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <random>
#include <string>

#include "src/serve/api.h"
#include "src/serve/running_server.h"
#include "src/serve/theloom_analysis.h"

namespace loom::serve {
namespace {

using nlohmann::json;

ServerOptions Defaults() {
  ServerOptions o;
  o.engine.precision = Precision::kF32;
  o.engine.slots = 2;
  o.engine.context = 128;
  return o;
}

// Rows of Gaussian values, each written as Go's encoding/json writes a
// float64 (the shortest decimal that reads back to the same double, ~18
// bytes for these).
std::string GoVectors(int64_t rows, int64_t cols, uint32_t seed,
                      theloom::Matrix* values = nullptr) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::string s = "[";
  char buf[32];
  if (values != nullptr) *values = theloom::Matrix{rows, cols, {}};
  for (int64_t i = 0; i < rows; ++i) {
    s += i ? ",[" : "[";
    for (int64_t j = 0; j < cols; ++j) {
      const double v = normal(rng) + (j % 7 == 0 ? 3.0 : 0.0);
      if (values != nullptr) values->values.push_back(static_cast<float>(v));
      if (j) s += ',';
      s.append(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
    }
    s += ']';
  }
  return s + "]";
}

void ExpectGeometryShape(const json& r, int64_t n, int64_t d) {
  // Weaver decodes these into Go ints: they must be JSON integers.
  for (const char* k : {"num_vectors", "ambient_dim"})
    EXPECT_TRUE(r[k].is_number_integer()) << k << ": " << r[k];
  EXPECT_TRUE(r["wolf_axiom"]["violation_count"].is_number_integer());
  EXPECT_TRUE(r["directional_coverage"]["ambient_dim"].is_number_integer());
  EXPECT_TRUE(r["directional_coverage"]["effective_dim"].is_number_integer());
  EXPECT_TRUE(r["grain_analysis"]["num_grains"].is_number_integer());
  EXPECT_EQ(r["num_vectors"], n);
  EXPECT_EQ(r["ambient_dim"], d);
  EXPECT_TRUE(r["overall_health"].is_string());
  EXPECT_TRUE(r["analysis_time_ms"].is_number());
  for (const char* k :
       {"max_density_ratio", "mean_density_ratio", "uniformity_p_value"})
    EXPECT_TRUE(r["wolf_axiom"][k].is_number()) << k;
}

TEST(TheLoomHttpTest, GeometryThreeRowsMatchesTheLibrary) {
  Running srv(Defaults());
  auto c = srv.Client();
  theloom::Matrix m;
  const std::string body = "{\"vectors\":" + GoVectors(3, 16, 1, &m) + "}";
  auto r = c.Post("/analyze/geometry", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  ExpectGeometryShape(j, 3, 16);
  j.erase("analysis_time_ms");
  EXPECT_EQ(j, theloom::GeometryJson(
                   theloom::AnalyzeGeometry(m, theloom::kDefaultSeed)));
  // Another seed: other Wolf regions, the same deterministic fields.
  auto r7 = c.Post("/analyze/geometry",
                   "{\"seed\": 7, \"vectors\":" + GoVectors(3, 16, 1) + "}",
                   "application/json");
  ASSERT_TRUE(r7);
  ASSERT_EQ(r7->status, 200) << r7->body;
  const json j7 = json::parse(r7->body);
  EXPECT_NE(j7["wolf_axiom"], j["wolf_axiom"]);
  EXPECT_EQ(j7["directional_coverage"], j["directional_coverage"]);
}

TEST(TheLoomHttpTest, GeometryErrors) {
  Running srv(Defaults());
  auto c = srv.Client();
  struct Case {
    std::string body;
    std::string part;
  } cases[] = {
      {"{}", "field `vectors` is required"},
      {"{\"vectors\": [[1, 2], [3, 4]]}", "need at least 3 vectors"},
      {"{\"vectors\": [[1, 2], [3], [4, 5]]}", "row 1 has 1 values"},
      {"{\"vectors\": [[1], [\"x\"], [2]]}", "expected a number"},
      {"{\"vectors\": [[1], [2], [3]], \"seed\": -1}", "field `seed`"},
      {"{\"vectors\": [[1], [2], [3]]", "JSON"},
  };
  for (const Case& k : cases) {
    auto r = c.Post("/analyze/geometry", k.body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << k.body;
    const json j = json::parse(r->body, nullptr, false);
    EXPECT_NE(j.value("detail", "").find(k.part), std::string::npos)
        << k.body << " -> " << r->body;
  }
}

TEST(TheLoomHttpTest, BilateralThreePlusFiveRows) {
  Running srv(Defaults());
  auto c = srv.Client();
  theloom::Matrix s, rv;
  const std::string body = "{\"sender_vectors\":" + GoVectors(3, 24, 2, &s) +
                           ",\"receiver_vectors\":" + GoVectors(5, 24, 3, &rv) +
                           "}";
  auto r = c.Post("/analyze/bilateral", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  for (const char* k :
       {"directional_alignment", "subspace_overlap", "grain_alignment",
        "density_similarity", "effective_dim_ratio", "overall_alignment",
        "analysis_time_ms"})
    EXPECT_TRUE(j[k].is_number()) << k << ": " << r->body;
  j.erase("analysis_time_ms");
  EXPECT_EQ(j, theloom::BilateralJson(
                   theloom::AnalyzeBilateral(s, rv, theloom::kDefaultSeed)));
  // Different widths: 400 with TheLoom's message.
  auto bad = c.Post("/analyze/bilateral",
                    "{\"sender_vectors\":" + GoVectors(3, 4, 1) +
                        ",\"receiver_vectors\":" + GoVectors(3, 5, 1) + "}",
                    "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("Dimension mismatch: sender has 4, receiver has 5"),
            std::string::npos)
      << bad->body;
  auto missing = c.Post("/analyze/bilateral",
                        "{\"sender_vectors\":" + GoVectors(3, 4, 1) + "}",
                        "application/json");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 400);
  EXPECT_NE(missing->body.find("receiver_vectors"), std::string::npos);
}

// Weaver's largest expected request: 1,000 hidden states of a 4096-wide
// model, ~80 MB of Go float64 text; over server.max_body_bytes (8 MiB) but
// within server.max_analysis_body_bytes.
TEST(TheLoomHttpTest, GeometryThousandByFourThousand) {
  ServerOptions o = Defaults();
  Running srv(o);
  auto c = srv.Client();
  const std::string body = "{\"vectors\":" + GoVectors(1000, 4096, 4) + "}";
  ASSERT_GT(body.size(), 70u << 20);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c.Post("/analyze/geometry", body, "application/json");
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body.substr(0, 500);
  const json j = json::parse(r->body);
  ExpectGeometryShape(j, 1000, 4096);
  std::printf(
      "1000 x 4096 geometry over HTTP: %.0f MB body, %.2f s "
      "(analysis_time_ms %.0f)\n",
      body.size() / 1e6, s, j["analysis_time_ms"].get<double>());
  // The general limit still holds elsewhere.
  auto other =
      c.Post("/analyze", "{\"embedding\":" + GoVectors(1, 600000, 5) + "}",
             "application/json");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 413);
  EXPECT_NE(other->body.find("server.max_body_bytes"), std::string::npos);
}

TEST(TheLoomHttpTest, AnalysisBodyLimitIsItsOwn) {
  ServerOptions o = Defaults();
  o.max_analysis_body_bytes = 1 << 20;
  Running srv(o);
  auto c = srv.Client();
  const std::string body = "{\"vectors\":" + GoVectors(40, 4096, 4) + "}";
  ASSERT_GT(body.size(), 1u << 20);
  auto r = c.Post("/analyze/geometry", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_NE(r->body.find("larger than server.max_analysis_body_bytes = "
                         "1048576"),
            std::string::npos)
      << r->body;
}

// TheLoom's /analyze: a text (and a model; "" is the only loaded one) in,
// the statistics of its unnormalised embedding out, with TheLoom's names.
TEST(TheLoomHttpTest, AnalyzeTextForm) {
  Running srv(Defaults());
  auto c = srv.Client();
  const json req = {{"model", ""},
                    {"text", "Once upon a time"},
                    {"pooling", "mean"},
                    {"normalize", true}};  // ignored, as in TheLoom
  auto r = c.Post("/analyze", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["shape"], json::array({64}));
  EXPECT_EQ(j["embedding_shape"], json::array({64}));
  EXPECT_EQ(j["layer"], -1);
  EXPECT_EQ(j["dtype"], "torch.float32");
  EXPECT_EQ(j["pooling"], "mean");
  EXPECT_EQ(j["model_id"], "stories260K");
  EXPECT_TRUE(j["input_tokens"].is_number_integer());
  EXPECT_GT(j["input_tokens"].get<int64_t>(), 0);
  EXPECT_TRUE(j["inference_time_ms"].is_number());
  // The statistics are of /embed's vector for the same text, unnormalised.
  auto e =
      c.Post("/embed",
             json({{"text", "Once upon a time"}, {"pooling", "mean"}}).dump(),
             "application/json");
  ASSERT_TRUE(e);
  ASSERT_EQ(e->status, 200) << e->body;
  const json embedded = json::parse(e->body);
  ASSERT_TRUE(embedded["embedding"].is_array()) << e->body.substr(0, 300);
  std::vector<float> v;
  for (const json& x : embedded["embedding"]) v.push_back(x.get<float>());
  ASSERT_EQ(v.size(), 64u);
  const json want = theloom::HiddenStateStatistics(v);
  for (const char* k : {"mean", "std", "min", "max", "l2_norm", "sparsity",
                        "percentile_25", "percentile_50", "percentile_75"})
    EXPECT_NEAR(j[k].get<double>(), want[k].get<double>(),
                1e-6 * (1 + std::fabs(want[k].get<double>())))
        << k;
  // Loom's vector form is unchanged.
  auto vec = c.Post("/analyze", R"({"embedding": [1.0, 2.0, 3.0, 4.0, 0.0]})",
                    "application/json");
  ASSERT_TRUE(vec);
  ASSERT_EQ(vec->status, 200);
  const json vj = json::parse(vec->body);
  EXPECT_EQ(vj["dimension"], 5);
  EXPECT_EQ(vj["quartiles"]["median"], 2.0);
  // TheLoom's errors: an unknown pooling is 400 naming it.
  auto bad = c.Post("/analyze", R"({"text": "a", "pooling": "median"})",
                    "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("pooling"), std::string::npos);
}

// The bytes Weaver's Go client sends (net/http's headers in its order,
// compact JSON from encoding/json, shortest float64 decimals), on a raw
// socket: 200 and a JSON body with integral integer fields.
std::string RawExchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t w = write(fd, request.data() + sent, request.size() - sent);
    if (w <= 0) break;
    sent += static_cast<size_t>(w);
  }
  std::string reply;
  char buf[65536];
  // Read the head, then Content-Length bytes of body.
  size_t need = std::string::npos;
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
    const size_t head = reply.find("\r\n\r\n");
    if (head != std::string::npos && need == std::string::npos) {
      const size_t cl = reply.find("Content-Length: ");
      if (cl != std::string::npos && cl < head)
        need = head + 4 + std::stoul(reply.substr(cl + 16));
    }
    if (need != std::string::npos && reply.size() >= need) break;
  }
  close(fd);
  return reply;
}

// The JSON body of a raw reply: Go's client asks for gzip (Accept-Encoding)
// and inflates transparently; so does this.
json ReplyJson(const std::string& reply) {
  const size_t head = reply.find("\r\n\r\n");
  std::string body = reply.substr(head + 4);
  if (reply.substr(0, head).find("Content-Encoding: gzip") !=
      std::string::npos) {
    z_stream z{};
    EXPECT_EQ(inflateInit2(&z, 16 + MAX_WBITS), Z_OK);
    std::string out(1 << 20, '\0');
    z.next_in = reinterpret_cast<Bytef*>(body.data());
    z.avail_in = static_cast<uInt>(body.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(inflate(&z, Z_FINISH), Z_STREAM_END);
    out.resize(z.total_out);
    inflateEnd(&z);
    body = out;
  }
  return json::parse(body);
}

std::string GoRequest(int port, const std::string& path,
                      const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: localhost:" + std::to_string(port) +
         "\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: " +
         std::to_string(body.size()) +
         "\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n" +
         body;
}

TEST(TheLoomHttpTest, WeaverRequestBytesReplayed) {
  Running srv(Defaults());
  const int port = srv.server().port();
  {
    const std::string reply = RawExchange(
        port, GoRequest(port, "/analyze/geometry",
                        "{\"vectors\":" + GoVectors(3, 32, 6) + "}"));
    ASSERT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply.substr(0, 300);
    EXPECT_NE(reply.find("Content-Type: application/json"), std::string::npos);
    const json j = ReplyJson(reply);
    ExpectGeometryShape(j, 3, 32);
  }
  {
    const std::string reply = RawExchange(
        port,
        GoRequest(port, "/analyze/bilateral",
                  "{\"sender_vectors\":" + GoVectors(3, 32, 7) +
                      ",\"receiver_vectors\":" + GoVectors(5, 32, 8) + "}"));
    ASSERT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply.substr(0, 300);
    const json j = ReplyJson(reply);
    EXPECT_TRUE(j["overall_alignment"].is_number());
    EXPECT_TRUE(j["subspace_overlap"].is_number());
  }
}

}  // namespace
}  // namespace loom::serve
