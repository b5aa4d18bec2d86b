// .npz archives: stored and deflated members read back exactly; a missing
// array names the ones there; a file that is no zip and a truncated member
// are DataLoss naming them; a member whose size field claims gigabytes over
// a few stored bytes is DataLoss too, having cost only what it holds.
#include "src/io/npz.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace loom {
namespace {

namespace fs = std::filesystem;

class NpzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom_npz_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const {
    return (dir_ / name).string();
  }
  fs::path dir_;
};

TEST_F(NpzTest, StoredAndDeflatedMembersReadBack) {
  std::vector<float> a(6 * 5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i);
  const std::vector<double> b = {1.5, -2.0, 3.25};
  for (bool deflate : {false, true}) {
    SCOPED_TRACE(deflate);
    const std::string path = Path(deflate ? "z.npz" : "s.npz");
    ASSERT_TRUE(WriteNpz(path,
                         {{"W_enc", DType::kF32, {6, 5}, a.data(), 120},
                          {"b_dec", DType::kF64, {3}, b.data(), 24}},
                         deflate)
                    .ok());
    auto npz = NpzFile::Open(path);
    ASSERT_TRUE(npz.ok()) << npz.status().ToString();
    EXPECT_EQ((*npz)->names(), (std::vector<std::string>{"W_enc", "b_dec"}));
    auto w = (*npz)->Read("W_enc");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->header.shape, (std::vector<int64_t>{6, 5}));
    EXPECT_EQ(w->header.dtype, DType::kF32);
    ASSERT_EQ(w->data.size(), 120u);
    EXPECT_EQ(std::memcmp(w->data.data(), a.data(), 120), 0);
    auto v = (*npz)->Read("b_dec");
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->header.dtype, DType::kF64);
    EXPECT_EQ(std::memcmp(v->data.data(), b.data(), 24), 0);
    const Status missing = (*npz)->Read("threshold").status();
    EXPECT_EQ(missing.code(), StatusCode::kNotFound);
    EXPECT_NE(missing.message().find("no array 'threshold' (it holds: W_enc, "
                                     "b_dec)"),
              std::string::npos)
        << missing.ToString();
    const Status big = (*npz)->Read("W_enc", 64).status();
    EXPECT_NE(big.message().find("W_enc.npy: "), std::string::npos)
        << big.ToString();
  }
}

TEST_F(NpzTest, NotAZipAndTruncatedArraysAreDataLoss) {
  std::ofstream(Path("bad.npz")) << "PK but not really a zip archive";
  auto bad = NpzFile::Open(Path("bad.npz"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("bad.npz: not a readable .npz"),
            std::string::npos)
      << bad.status().ToString();
  EXPECT_EQ(NpzFile::Open(Path("absent.npz")).status().code(),
            StatusCode::kNotFound);
  const std::vector<float> a(8, 1.0f);
  auto full = NpyBytes(DType::kF32, {8}, a.data(), 32);
  ASSERT_TRUE(full.ok());
  const StatusOr<NpyArray> cut =
      ParseNpy(std::string_view(*full).substr(0, full->size() - 4), "m.npy");
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(cut.status().message().find(
                "m.npy: npy header describes 32 data bytes, the array has 28"),
            std::string::npos)
      << cut.status().ToString();
  const StatusOr<NpyArray> whole = ParseNpy(*full, "m.npy");
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->data.size(), 32u);
}

long PeakRssKb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// Overwrites the uncompressed size of the first member in the local header
// and the central directory of the zip at `path`.
void ClaimSize(const std::string& path, uint32_t size) {
  std::string z;
  {
    std::ifstream in(path, std::ios::binary);
    z.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto put = [&](size_t at) { std::memcpy(z.data() + at, &size, 4); };
  ASSERT_EQ(z.compare(0, 4, "PK\x03\x04"), 0);
  put(22);
  const size_t central = z.find("PK\x01\x02");
  ASSERT_NE(central, std::string::npos);
  put(central + 24);
  std::ofstream(path, std::ios::binary) << z;
}

TEST_F(NpzTest, AMemberClaimingMoreThanItHoldsIsDataLoss) {
  const std::vector<float> a(4, 2.0f);
  const std::string path = Path("claims.npz");
  ASSERT_TRUE(WriteNpz(path, {{"W_enc", DType::kF32, {2, 2}, a.data(), 16}},
                       /*deflate=*/false)
                  .ok());
  ClaimSize(path, 0xFFFFFF00u);
  auto npz = NpzFile::Open(path);
  if (!npz.ok()) {  // libzip may already refuse the archive: DataLoss too
    EXPECT_EQ(npz.status().code(), StatusCode::kDataLoss);
    return;
  }
  const long peak_before = PeakRssKb();
  const Status read = (*npz)->Read("W_enc").status();
  // Reading did not allocate the claimed 4 GiB (the zero-filled string an
  // allocation from the size field makes would show in the peak RSS).
  EXPECT_LT(PeakRssKb() - peak_before, 64 * 1024);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.code(), StatusCode::kDataLoss);
  EXPECT_NE(read.message().find("claims.npz: W_enc.npy: read "),
            std::string::npos)
      << read.ToString();
  EXPECT_NE(read.message().find(" of 4294967040 bytes"), std::string::npos)
      << read.ToString();
}

}  // namespace
}  // namespace loom
