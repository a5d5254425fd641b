// Memory laid out at prepare time: prefault maps pages in without changing them, the packing arena hands out aligned
// zeroed blocks and counts them, and a prepared program's first run pays no page faults for its activations.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/packed_gemm.h"
#include "compiler/memory_plan.h"
#include "core/zeroed_memory.h"
#include "unit/graph_test_util.h"

namespace npusim {
namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

constexpr size_t kPage = 4096;

// AddressSanitizer's shadow memory takes page faults of its own when the test touches memory, so fault counts are
// asserted only in builds without it (the contents are checked in both).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kFaultsCounted = false;
#else
constexpr bool kFaultsCounted = true;
#endif

TEST(PrepareMemory, PrefaultKeepsTheContentsAndMapsThePages) {
  const size_t bytes = (size_t{4} << 20) + 3 * kPage + 100;  // a mapping of its own, not a whole number of pages
  ZeroedMemory memory = allocate_zeroed(bytes, "a test buffer");
  std::byte* data = memory.get();
  for (size_t i = 0; i < 64; ++i) data[kPage * 5 + i] = static_cast<std::byte>(i + 1);  // one page already written
  prefault(data + 17, bytes - 17);  // ends inside a page, starts inside one
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(data[kPage * 5 + i], static_cast<std::byte>(i + 1)) << i;
  const long before = minor_faults();
  size_t nonzero = 0;
  for (size_t at = 0; at < bytes; at += kPage) {
    nonzero += data[at] != std::byte{0} && at != kPage * 5;
    data[at] = std::byte{7};
  }
  if (kFaultsCounted) EXPECT_LT(minor_faults() - before, 8) << "the pages were not mapped in";
  EXPECT_EQ(nonzero, 0u);
  // Empty ranges and null are nothing to do.
  prefault(nullptr, 0);
  prefault(data, 0);
}

TEST(PrepareMemory, ArenaBlocksAreAlignedZeroedAndCounted) {
  ZeroedArena arena;
  std::byte* small = arena.allocate(1, "a test block").data;
  std::byte* odd = arena.allocate(100, "a test block").data;
  std::byte* large = arena.allocate(size_t{40} << 20, "a test block").data;  // larger than a chunk
  for (std::byte* block : {small, odd, large}) EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % 64, 0u);
  EXPECT_EQ(odd, small + 64);
  EXPECT_EQ(arena.used_bytes(), 64u + 128u + (size_t{40} << 20));
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(odd[i], std::byte{0}) << i;
  EXPECT_EQ(large[(size_t{40} << 20) - 1], std::byte{0});
}

// Packed operands made inside a packing arena are mapped in over the pool before they are written.
TEST(PrepareMemory, PackedStorageIsMappedInBeforeItIsWritten) {
  auto arena = std::make_shared<ZeroedArena>();
  const cpu::PackingArenaScope scope(arena);
  cpu::ThreadPool pool(2);
  for (cpu::ThreadPool* threads : {static_cast<cpu::ThreadPool*>(nullptr), &pool}) {
    cpu::PackedMatrix a = cpu::PackedMatrix::zeroed(cpu::GemmSide::A, cpu::Elem::F32, 601, 1000);  // 2.4 MB
    cpu::PackedMatrix b = cpu::PackedMatrix::zeroed(cpu::GemmSide::B, cpu::Elem::F32, 333, 77);
    cpu::prefault_storage({&a, &b}, threads);
    const long before = minor_faults();
    size_t nonzero = 0;
    for (cpu::PackedMatrix* m : {&a, &b})
      for (size_t at = 0; at < m->bytes(); at += kPage) {
        nonzero += m->mutable_panel(0)[at] != std::byte{0};
        m->mutable_panel(0)[at] = std::byte{1};
      }
    if (kFaultsCounted) EXPECT_LT(minor_faults() - before, 8) << (threads ? "2 threads" : "1 thread");
    EXPECT_EQ(nonzero, 0u);
  }
  EXPECT_GT(arena->used_bytes(), size_t{2} << 20);
}

// A convolution whose activations need a few MB: after prepare, the first run touches memory already mapped.
TEST(PrepareMemory, FirstRunPaysNoPageFaultsForItsActivations) {
  test::GraphBuilder builder;
  const ValueId x = builder.input("x", {1, 16, 128, 128});
  const ValueId w = builder.weight("conv.weight", {64, 16, 3, 3});
  Attrs attrs;
  attrs.set("padding", std::vector<int64_t>{1});
  const ValueId conv = builder.op("conv2d", {x, w}, attrs);
  const ValueId relu = builder.op("relu", {conv});
  Attrs mean;
  mean.set("dim", std::vector<int64_t>{2, 3});
  builder.output(builder.op("mean", {relu}, mean));  // a small output: the run allocates little for it
  Graph graph = builder.graph();
  Program program;
  program.compute_dtype = DType::Float32;
  program.plan = compiler::plan_memory(graph, DType::Float32);
  program.graph = std::move(graph);
  ASSERT_GE(program.plan.arena_bytes, int64_t{4} << 20);

  Tensor weight(DType::Float32, {64, 16, 3, 3}), input(DType::Float32, {1, 16, 128, 128});
  for (int64_t i = 0; i < weight.numel(); ++i) weight.mutable_data<float>()[i] = static_cast<float>(i % 7) - 3.0f;
  for (int64_t i = 0; i < input.numel(); ++i) input.mutable_data<float>()[i] = static_cast<float>(i % 5) * 0.5f;
  for (int threads : {1, 2}) {
    cpu::CpuBackend backend({.threads = threads});
    const auto prepared = backend.prepare(program, {{w, weight}});
    const long before = minor_faults();
    const NamedTensors outputs = prepared->run({{"x", input}});
    const long faults = minor_faults() - before;
    ASSERT_EQ(outputs.size(), 1u);
    // The arena alone is over 1000 pages; what remains is the output and other small allocations.
    if (kFaultsCounted) EXPECT_LT(faults, 100) << threads << " threads";
  }
}

}  // namespace
}  // namespace npusim
