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
  ds.push_back(*ParseDevice("cuda:1=96GiB", 0));
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

// Without --device GPUs, the keys declare them, numbered as a machine's.
TEST(Devices, MaxMemoryAloneDeclaresGpusFromZero) {
  StatusOr<std::vector<DeviceSpec>> ds =
      DevicesFromFlags({}, "1=90GiB,0=38GiB", "", 64 * kGiB);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ASSERT_EQ(ds->size(), 3u);
  EXPECT_EQ((*ds)[0].name, "cuda:1");
  EXPECT_EQ((*ds)[0].usable(), 90 * kGiB);
  EXPECT_EQ((*ds)[1].name, "cuda:0");
  EXPECT_EQ((*ds)[2].name, "cpu");
  EXPECT_FALSE((*ds)[2].compute);
}

// A key names a device: one --device gave, or (with none) the next GPU of
// the machine. The message names the key and the devices known.
TEST(Devices, MaxMemoryForAnUnknownGpuIsAnError) {
  struct Case {
    std::vector<std::string> device;
    std::string max_memory, needle;
  };
  const std::vector<Case> cases = {
      {{},
       "5=1GiB",
       "--max-memory 5=1GiB: no device cuda:5 among the "
       "devices given (cpu); without --device, the keys "
       "declare the GPUs, numbered from 0 as a machine's are, "
       "and cuda:0 is missing"},
      {{}, "0=1GiB,2=1GiB", "--max-memory 2=1GiB: no device cuda:2"},
      {{"disk"},
       "cuda:1=1GiB",
       "no device cuda:1 among the devices given "
       "(disk, cpu)"},
      {{"cuda:0=80GiB"},
       "0=38GiB,1=90GiB",
       "--max-memory 1=90GiB: no device cuda:1 among the devices given "
       "(cuda:0, cpu); a key caps a device: declare the GPU with --device "
       "cuda:1=SIZE"},
      {{"cuda:0=80GiB,cpu=8GiB"},
       "cuda:3=1GiB",
       "no device cuda:3 among the devices given (cuda:0, cpu)"},
      {{}, "99999999999999999999=1GiB", "GPU index out of range"},
  };
  for (const Case& c : cases) {
    StatusOr<std::vector<DeviceSpec>> ds =
        DevicesFromFlags(c.device, c.max_memory, "", 64 * kGiB);
    ASSERT_FALSE(ds.ok()) << c.max_memory;
    EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ds.status().message().find(c.needle), std::string::npos)
        << ds.status().message();
  }
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
