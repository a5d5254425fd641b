#include "runtime/machine_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/zeroed_memory.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NPUSIM_PROBE_X86 1
#endif

namespace npusim {

namespace {

using Clock = std::chrono::steady_clock;

std::string cpu_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "unknown CPU";
}

// Runs work(index) on `threads` threads at once (index 0 on the caller) and returns the seconds from the common
// start to the last one done; starting the threads is not timed.
double run_timed(int threads, const std::function<void(int)>& work) {
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::vector<std::thread> helpers;
  for (int index = 1; index < threads; ++index)
    helpers.emplace_back([&, index] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      work(index);
    });
  while (ready.load() != threads - 1) std::this_thread::yield();
  const auto start = Clock::now();
  go.store(true, std::memory_order_release);
  work(0);
  for (std::thread& helper : helpers) helper.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double best_of(int repeats, int threads, const std::function<void(int)>& work) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(1, repeats); ++i) best = std::min(best, run_timed(threads, work));
  return best;
}

// Keeps results alive so that the measured loops are not optimized away.
std::atomic<uint64_t> g_sink{0};

uint64_t read_generic(const uint64_t* data, size_t words) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    a ^= data[i];
    b ^= data[i + 1];
    c ^= data[i + 2];
    d ^= data[i + 3];
  }
  for (; i < words; ++i) a ^= data[i];
  return a ^ b ^ c ^ d;
}

float fma_generic(int64_t iterations) {
  float acc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const float scale = 0.999999f, offset = 1e-7f;
  for (int64_t i = 0; i < iterations; ++i)
    for (float& value : acc) value = value * scale + offset;
  float sum = 0;
  for (float value : acc) sum += value;
  return sum;
}
constexpr double kGenericFlopsPerIteration = 8 * 2;

#ifdef NPUSIM_PROBE_X86
__attribute__((target("avx2"))) uint64_t read_avx2(const uint64_t* data, size_t words) {
  const auto* vectors = reinterpret_cast<const __m256i*>(data);
  const size_t count = words / 4;
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 4 <= count; i += 4) {
    a = _mm256_xor_si256(a, _mm256_load_si256(vectors + i));
    b = _mm256_xor_si256(b, _mm256_load_si256(vectors + i + 1));
    c = _mm256_xor_si256(c, _mm256_load_si256(vectors + i + 2));
    d = _mm256_xor_si256(d, _mm256_load_si256(vectors + i + 3));
  }
  const __m256i all = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
  return static_cast<uint64_t>(_mm256_extract_epi64(all, 0)) ^ read_generic(data + i * 4, words - i * 4);
}

// Twelve independent chains cover FMA latency times throughput (4 cycles x 2 pipes on Zen 3 and most Intel cores)
// with room to spare, and stay within the 16 ymm registers.
__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iterations) {
  const __m256 scale = _mm256_set1_ps(0.999999f), offset = _mm256_set1_ps(1e-7f);
  __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2), a3 = _mm256_set1_ps(3);
  __m256 a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5), a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7);
  __m256 a8 = _mm256_set1_ps(8), a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
  for (int64_t i = 0; i < iterations; ++i) {
    a0 = _mm256_fmadd_ps(a0, scale, offset);
    a1 = _mm256_fmadd_ps(a1, scale, offset);
    a2 = _mm256_fmadd_ps(a2, scale, offset);
    a3 = _mm256_fmadd_ps(a3, scale, offset);
    a4 = _mm256_fmadd_ps(a4, scale, offset);
    a5 = _mm256_fmadd_ps(a5, scale, offset);
    a6 = _mm256_fmadd_ps(a6, scale, offset);
    a7 = _mm256_fmadd_ps(a7, scale, offset);
    a8 = _mm256_fmadd_ps(a8, scale, offset);
    a9 = _mm256_fmadd_ps(a9, scale, offset);
    a10 = _mm256_fmadd_ps(a10, scale, offset);
    a11 = _mm256_fmadd_ps(a11, scale, offset);
  }
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))),
                                   _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  return _mm256_cvtss_f32(sum);
}
constexpr double kAvx2FlopsPerIteration = 12 * 8 * 2;

// Twelve independent chains of `Step` (a 512-bit multiply-add) on zmm registers, summed.
template <typename Step>
__attribute__((target("avx512f,avx512bf16"))) float chains_avx512(int64_t iterations) {
  const Step step;
  __m512 a[12];
  for (int r = 0; r < 12; ++r) a[r] = _mm512_set1_ps(static_cast<float>(r));
  for (int64_t i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int r = 0; r < 12; ++r) a[r] = step(a[r]);
  __m512 sum = a[0];
  for (int r = 1; r < 12; ++r) sum = _mm512_add_ps(sum, a[r]);
  return _mm512_cvtss_f32(sum);
}

// fp32 FMAs on 512-bit vectors: twice the work per instruction where the core runs them whole (Intel's AVX-512 cores,
// Zen 5's server and desktop cores), the same where it splits them in two (Zen 4).
struct Fma512 {
  __attribute__((target("avx512f"))) __m512 operator()(__m512 a) const {
    return _mm512_fmadd_ps(a, _mm512_set1_ps(0.999999f), _mm512_set1_ps(1e-7f));
  }
};
constexpr double kAvx512FlopsPerIteration = 12 * 16 * 2;

// bf16 pair products (vdpbf16ps: 16 lanes, two multiply-adds each).
struct Bf16Dot512 {
  __attribute__((target("avx512f,avx512bf16"))) __m512 operator()(__m512 a) const {
    const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));  // bf16 1.0 twice
    const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33d633d6));  // bf16 1e-7 twice
    return _mm512_dpbf16_ps(a, x, y);
  }
};
constexpr double kBf16DotFlopsPerIteration = 12 * 16 * 2 * 2;
#endif

// Bytes per second of reading `words` 64-bit words split evenly over `threads` threads.
double read_bandwidth(const uint64_t* data, size_t words, int threads, int repeats, bool avx2) {
  constexpr size_t kChunkWords = 16;  // 128 bytes: four ymm loads, keeps every slice 32-byte aligned
  const size_t chunks = words / kChunkWords;
  const auto work = [&](int index) {
    const size_t begin = chunks * static_cast<size_t>(index) / static_cast<size_t>(threads) * kChunkWords;
    const size_t end = chunks * static_cast<size_t>(index + 1) / static_cast<size_t>(threads) * kChunkWords;
#ifdef NPUSIM_PROBE_X86
    const uint64_t value = avx2 ? read_avx2(data + begin, end - begin) : read_generic(data + begin, end - begin);
#else
    (void)avx2;
    const uint64_t value = read_generic(data + begin, end - begin);
#endif
    g_sink.fetch_xor(value, std::memory_order_relaxed);
  };
  const double seconds = best_of(repeats, threads, work);
  return static_cast<double>(chunks * kChunkWords * sizeof(uint64_t)) / seconds;
}

// FLOPs per second with every one of `threads` threads running a register-resident loop of `kernel`.
double flop_rate(int threads, int repeats, const std::function<float(int64_t)>& kernel, double flops_per_iteration) {
  // About 0.4 GFLOP per thread and pass: a few milliseconds on a current core.
  const auto iterations = static_cast<int64_t>(4e8 / flops_per_iteration);
  const auto work = [&](int) {
    const float value = kernel(iterations);
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    g_sink.fetch_xor(bits, std::memory_order_relaxed);
  };
  const double seconds = best_of(repeats, threads, work);
  return static_cast<double>(threads) * static_cast<double>(iterations) * flops_per_iteration / seconds;
}

}  // namespace

MachineProbe probe_machine(const ProbeOptions& options) {
  const auto start = Clock::now();
  MachineProbe probe;
  probe.cpu_name = cpu_name();
  probe.hardware_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  probe.threads = options.threads > 0 ? options.threads : probe.hardware_threads;
  probe.features = cpu_features();
  const bool avx2_fma = probe.features.avx2 && probe.features.fma;
  probe.fma_kernel = avx2_fma ? "avx2+fma" : "scalar";

  // On huge pages, as the weights a decode step streams are.
  const size_t words = std::max<size_t>(options.buffer_bytes / sizeof(uint64_t), 1024);
  ZeroedMemory memory = allocate_zeroed(words * sizeof(uint64_t), "the bandwidth probe's buffer", Pages::Huge);
  auto* buffer = reinterpret_cast<uint64_t*>(memory.get());
  for (size_t i = 0; i < words; ++i) buffer[i] = i * 0x9E3779B97F4A7C15ull;

  probe.read_gbps_1 = read_bandwidth(buffer, words, 1, options.repeats, probe.features.avx2) / 1e9;
  probe.read_gbps_n = read_bandwidth(buffer, words, probe.threads, options.repeats, probe.features.avx2) / 1e9;
  memory.reset();
  std::function<float(int64_t)> fma = fma_generic;
  double fma_flops = kGenericFlopsPerIteration;
#ifdef NPUSIM_PROBE_X86
  if (avx2_fma) {
    fma = fma_avx2;
    fma_flops = kAvx2FlopsPerIteration;
  }
  if (probe.features.avx512()) {
    fma = chains_avx512<Fma512>;
    fma_flops = kAvx512FlopsPerIteration;
    probe.fma_kernel = "avx512f";
  }
  if (probe.features.avx512bf16) {
    probe.bf16_dot_gflops_1 = flop_rate(1, options.repeats, chains_avx512<Bf16Dot512>, kBf16DotFlopsPerIteration) / 1e9;
    probe.bf16_dot_gflops_n =
        flop_rate(probe.threads, options.repeats, chains_avx512<Bf16Dot512>, kBf16DotFlopsPerIteration) / 1e9;
  }
#endif
  probe.fma_gflops_1 = flop_rate(1, options.repeats, fma, fma_flops) / 1e9;
  probe.fma_gflops_n = flop_rate(probe.threads, options.repeats, fma, fma_flops) / 1e9;
  probe.probe_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return probe;
}

std::string probe_json(const MachineProbe& probe) {
  const nlohmann::json json = {
      {"cpu", probe.cpu_name},
      {"hardware_threads", probe.hardware_threads},
      {"threads", probe.threads},
      {"features",
       {{"avx2", probe.features.avx2},
        {"fma", probe.features.fma},
        {"f16c", probe.features.f16c},
        {"avx512f", probe.features.avx512f},
        {"avx512bf16", probe.features.avx512bf16},
        {"avx512vnni", probe.features.avx512vnni},
        {"amx", probe.features.amx},
        {"avx512_halved", probe.features.avx512_halved}}},
      {"fma_kernel", probe.fma_kernel},
      {"read_gbps_1", probe.read_gbps_1},
      {"read_gbps_n", probe.read_gbps_n},
      {"fma_gflops_1", probe.fma_gflops_1},
      {"fma_gflops_n", probe.fma_gflops_n},
      {"bf16_dot_gflops_1", probe.bf16_dot_gflops_1},
      {"bf16_dot_gflops_n", probe.bf16_dot_gflops_n},
      {"probe_ms", probe.probe_ms},
  };
  return json.dump();
}

std::string format_probe(const MachineProbe& probe) {
  std::string features;
  const std::pair<const char*, bool> named[] = {{"avx2", probe.features.avx2},
                                                {"fma", probe.features.fma},
                                                {"f16c", probe.features.f16c},
                                                {"avx512f", probe.features.avx512f},
                                                {"avx512bf16", probe.features.avx512bf16},
                                                {"avx512vnni", probe.features.avx512vnni},
                                                {"amx", probe.features.amx},
                                                {"avx512-halved", probe.features.avx512_halved}};
  for (const auto& [name, present] : named) {
    if (!present) continue;
    if (!features.empty()) features += ' ';
    features += name;
  }
  char text[1024];
  int length =
      std::snprintf(text, sizeof(text),
                    "cpu: %s (%d hardware threads)\n"
                    "features: %s\n"
                    "memory read: %.1f GB/s on 1 thread, %.1f GB/s on %d\n"
                    "fp32 FMA peak (%s): %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %d\n",
                    probe.cpu_name.c_str(), probe.hardware_threads, features.empty() ? "(none)" : features.c_str(),
                    probe.read_gbps_1, probe.read_gbps_n, probe.threads, probe.fma_kernel.c_str(), probe.fma_gflops_1,
                    probe.fma_gflops_n, probe.threads);
  if (probe.bf16_dot_gflops_1 > 0 && length > 0 && length < static_cast<int>(sizeof(text)))
    length += std::snprintf(text + length, sizeof(text) - static_cast<size_t>(length),
                            "bf16 dot-product peak (avx512bf16): %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %d\n",
                            probe.bf16_dot_gflops_1, probe.bf16_dot_gflops_n, probe.threads);
  if (length > 0 && length < static_cast<int>(sizeof(text)))
    std::snprintf(text + length, sizeof(text) - static_cast<size_t>(length), "probe took %.0f ms\n", probe.probe_ms);
  return text;
}

}  // namespace npusim
