#include "src/plan/devices.h"

#include <gtest/gtest.h>

#include "src/base/units.h"

namespace loom {
namespace {

TEST(Devices, ParsesDeclaredDetectedAndDisk) {
  auto cpu = ParseDevice("cpu", 64 * kGiB);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->capacity, 64 * kGiB);
  EXPECT_FALSE(cpu->capacity_given);
  auto cpu24 = ParseDevice("cpu=24GiB", 64 * kGiB);
  ASSERT_TRUE(cpu24.ok());
  EXPECT_EQ(cpu24->capacity, 24 * kGiB);
  auto gpu = ParseDevice("cuda:1=80GiB", 0);
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->name, "cuda:1");
  EXPECT_EQ(gpu->kind, DeviceKind::kCuda);
  auto disk = ParseDevice("disk", 0);
  ASSERT_TRUE(disk.ok());
  EXPECT_EQ(disk->kind, DeviceKind::kDisk);
}

TEST(Devices, UndeclaredGpuWithoutDetectionIsAnError) {
  auto gpu = ParseDevice("cuda:0", 0);
  ASSERT_FALSE(gpu.ok());
  EXPECT_NE(gpu.status().message().find("cuda:0=80GiB"), std::string::npos)
      << gpu.status().message();
  EXPECT_FALSE(ParseDevice("tpu:0=8GiB", 0).ok());
  EXPECT_FALSE(ParseDevice("disk=1TB", 0).ok());
}

TEST(Devices, MaxMemoryInAccelerateSyntax) {
  std::vector<DeviceSpec> ds;
  ds.push_back(*ParseDevice("cuda:0=80GiB", 0));
  ASSERT_TRUE(ApplyMaxMemory("0=38GiB,1=90GiB,cpu=50GiB", &ds).ok());
  ASSERT_TRUE(NormalizeDevices(&ds, 128 * kGiB).ok());
  ASSERT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds[0].name, "cuda:0");
  EXPECT_EQ(ds[0].usable(), 38 * kGiB);  // the budget caps the card
  EXPECT_EQ(ds[1].name, "cuda:1");
  EXPECT_EQ(ds[1].usable(), 90 * kGiB);
  EXPECT_EQ(ds[2].name, "cpu");
  EXPECT_TRUE(ds[2].compute);  // named in --max-memory: a layer tier
  EXPECT_FALSE(ApplyMaxMemory("0:38GiB", &ds).ok());
}

TEST(Devices, ReserveIsSubtractedAndHostIsAddedForStaging) {
  std::vector<DeviceSpec> ds = {*ParseDevice("cuda:0=80GiB", 0)};
  ASSERT_TRUE(NormalizeDevices(&ds, 100 * kGiB).ok());
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_FALSE(ds[1].compute);  // host only stages captures
  ASSERT_TRUE(ApplyReserve("cuda:0=2GiB", &ds).ok());
  EXPECT_EQ(ds[0].usable(), 78 * kGiB);
  ASSERT_TRUE(ApplyReserve("1GiB", &ds).ok());
  EXPECT_EQ(ds[0].usable(), 79 * kGiB);
  EXPECT_EQ(ds[1].usable(), 99 * kGiB);
  EXPECT_FALSE(ApplyReserve("cuda:3=1GiB", &ds).ok());
  std::vector<DeviceSpec> twice = {*ParseDevice("cpu", 1),
                                   *ParseDevice("cpu=2GiB", 1)};
  EXPECT_FALSE(NormalizeDevices(&twice, 1).ok());
  std::vector<DeviceSpec> none;
  ASSERT_TRUE(NormalizeDevices(&none, 8 * kGiB).ok());
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(none[0].compute);  // no device given: the host computes
}

}  // namespace
}  // namespace loom
