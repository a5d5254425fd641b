// The machine probe: finite positive measurements, the thread count asked for, and CPU features that agree with
// the compiler's own detection. Speeds are never asserted: the machine may be busy.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/machine_probe.h"

namespace npusim {
namespace {

ProbeOptions small_probe(int threads) {
  ProbeOptions options;
  options.threads = threads;
  options.buffer_bytes = size_t{8} << 20;
  options.repeats = 1;
  return options;
}

void expect_positive_finite(double value, const char* name) {
  EXPECT_TRUE(std::isfinite(value)) << name << " = " << value;
  EXPECT_GT(value, 0.0) << name;
}

TEST(MachineProbe, MeasurementsArePositiveAndFinite) {
  const MachineProbe probe = probe_machine(small_probe(2));
  EXPECT_EQ(probe.threads, 2);
  EXPECT_GE(probe.hardware_threads, 1);
  expect_positive_finite(probe.read_gbps_1, "read_gbps_1");
  expect_positive_finite(probe.read_gbps_n, "read_gbps_n");
  expect_positive_finite(probe.fma_gflops_1, "fma_gflops_1");
  expect_positive_finite(probe.fma_gflops_n, "fma_gflops_n");
  if (probe.features.avx512bf16) {
    expect_positive_finite(probe.bf16_dot_gflops_1, "bf16_dot_gflops_1");
    expect_positive_finite(probe.bf16_dot_gflops_n, "bf16_dot_gflops_n");
  } else {
    EXPECT_EQ(probe.bf16_dot_gflops_1, 0.0);
    EXPECT_EQ(probe.bf16_dot_gflops_n, 0.0);
  }
  expect_positive_finite(probe.probe_ms, "probe_ms");
  EXPECT_FALSE(probe.cpu_name.empty());
}

TEST(MachineProbe, DefaultThreadsAreTheHardwareThreads) {
  const MachineProbe probe = probe_machine(small_probe(0));
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(probe.hardware_threads, hardware);
  EXPECT_EQ(probe.threads, hardware);
}

TEST(MachineProbe, OddBufferSizeAndOneThread) {
  ProbeOptions options = small_probe(1);
  options.buffer_bytes = 1000003;  // not a multiple of the 128-byte slices
  const MachineProbe probe = probe_machine(options);
  EXPECT_EQ(probe.threads, 1);
  expect_positive_finite(probe.read_gbps_1, "read_gbps_1");
  expect_positive_finite(probe.read_gbps_n, "read_gbps_n");
}

TEST(MachineProbe, FeaturesAgreeWithTheCompiler) {
  const CpuFeatures& features = cpu_features();
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  EXPECT_EQ(features.avx2, static_cast<bool>(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(features.fma, static_cast<bool>(__builtin_cpu_supports("fma")));
  EXPECT_EQ(features.f16c, static_cast<bool>(__builtin_cpu_supports("f16c")));
  EXPECT_EQ(features.avx512f, static_cast<bool>(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(features.avx512bw, static_cast<bool>(__builtin_cpu_supports("avx512bw")));
  EXPECT_EQ(features.avx512vl, static_cast<bool>(__builtin_cpu_supports("avx512vl")));
  // Every CPU with AMX tiles or AVX-512 BF16 also has AVX-512.
  if (features.amx || features.avx512bf16 || features.avx512vnni) EXPECT_TRUE(features.avx512f);
#else
  EXPECT_FALSE(features.avx2 || features.fma || features.f16c || features.avx512f || features.amx);
#endif
  const MachineProbe probe = probe_machine(small_probe(1));
  EXPECT_EQ(probe.fma_kernel, features.avx512() ? "avx512f" : features.avx2 && features.fma ? "avx2+fma" : "scalar");
  if (!features.avx512f || !features.amd) EXPECT_FALSE(features.avx512_halved);
  EXPECT_EQ(probe.features.avx2, features.avx2);
  EXPECT_EQ(probe.features.amx, features.amx);
}

TEST(MachineProbe, AmdCoresThatSplit512BitOperationsInTwo) {
  EXPECT_TRUE(amd_splits_avx512(0x19, 0x11));   // Zen 4 server (Genoa)
  EXPECT_TRUE(amd_splits_avx512(0x19, 0x61));   // Zen 4 desktop (Raphael)
  EXPECT_FALSE(amd_splits_avx512(0x1A, 0x02));  // Zen 5 server (Turin)
  EXPECT_FALSE(amd_splits_avx512(0x1A, 0x11));  // Zen 5c server (Turin dense)
  EXPECT_FALSE(amd_splits_avx512(0x1A, 0x44));  // Zen 5 desktop (Granite Ridge)
  EXPECT_TRUE(amd_splits_avx512(0x1A, 0x24));   // Zen 5 laptop (Strix Point)
  EXPECT_TRUE(amd_splits_avx512(0x1A, 0x60));   // Zen 5 laptop (Krackan Point)
  EXPECT_FALSE(amd_splits_avx512(0x1A, 0x70));  // Strix Halo
  EXPECT_FALSE(amd_splits_avx512(0x1B, 0x00));  // later families: full width
}

TEST(MachineProbe, JsonAndTextCarryEveryField) {
  const MachineProbe probe = probe_machine(small_probe(2));
  const nlohmann::json json = nlohmann::json::parse(probe_json(probe));
  EXPECT_EQ(json["threads"], 2);
  EXPECT_EQ(json["cpu"], probe.cpu_name);
  EXPECT_EQ(json["fma_kernel"], probe.fma_kernel);
  EXPECT_DOUBLE_EQ(json["read_gbps_1"].get<double>(), probe.read_gbps_1);
  EXPECT_DOUBLE_EQ(json["read_gbps_n"].get<double>(), probe.read_gbps_n);
  EXPECT_DOUBLE_EQ(json["fma_gflops_1"].get<double>(), probe.fma_gflops_1);
  EXPECT_DOUBLE_EQ(json["fma_gflops_n"].get<double>(), probe.fma_gflops_n);
  EXPECT_DOUBLE_EQ(json["bf16_dot_gflops_1"].get<double>(), probe.bf16_dot_gflops_1);
  EXPECT_DOUBLE_EQ(json["bf16_dot_gflops_n"].get<double>(), probe.bf16_dot_gflops_n);
  for (const char* feature : {"avx2", "fma", "f16c", "avx512f", "amx"})
    EXPECT_TRUE(json["features"][feature].is_boolean()) << feature;
  EXPECT_EQ(json["features"]["avx2"].get<bool>(), probe.features.avx2);

  const std::string text = format_probe(probe);
  EXPECT_NE(text.find("memory read:"), std::string::npos) << text;
  EXPECT_NE(text.find("GFLOP/s on 2"), std::string::npos) << text;
  EXPECT_NE(text.find(probe.fma_kernel), std::string::npos) << text;
}

}  // namespace
}  // namespace npusim
