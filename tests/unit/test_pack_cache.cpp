// Packed weights kept in files between preparations: an arena that starts with written blocks hands them out by tag
// and size; a program prepared again with the same weights maps the file its first preparation saved and computes
// the same bits; other weights, another program or a damaged file are never taken for it.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/pack_cache.h"
#include "backends/cpu/packed_gemm.h"
#include "compiler/memory_plan.h"
#include "compiler/pass.h"
#include "core/content_hash.h"
#include "unit/graph_test_util.h"
#include "unit/random_values.h"
#include "work_dir.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace npusim {
namespace {

namespace fs = std::filesystem;

TEST(PackCache, ArenaHandsOutWrittenBlocksByTagAndSize) {
  std::vector<std::byte> file(256, std::byte{7});
  const std::vector<ArenaBlock> written = {
      {file.data(), 64, 11}, {file.data() + 64, 100, 12}, {file.data() + 192, 8, 0}};
  ZeroedArena arena(written, nullptr);
  const ZeroedArena::Allocation first = arena.allocate(64, "a test", 11);
  EXPECT_TRUE(first.written);
  EXPECT_EQ(first.data, file.data());
  const ZeroedArena::Allocation other_size = arena.allocate(99, "a test", 12);
  EXPECT_FALSE(other_size.written);
  EXPECT_NE(other_size.data, file.data() + 64);
  for (size_t i = 0; i < 99; ++i) ASSERT_EQ(other_size.data[i], std::byte{0}) << i;
  const ZeroedArena::Allocation untagged = arena.allocate(8, "a test");  // tag 0 names no block
  EXPECT_FALSE(untagged.written);
  const ZeroedArena::Allocation again = arena.allocate(64, "a test", 11);  // a kernel made again
  EXPECT_TRUE(again.written);
  EXPECT_EQ(again.data, file.data());
  const ZeroedArena::Allocation unknown = arena.allocate(100, "a test", 13);
  EXPECT_FALSE(unknown.written);
  EXPECT_EQ(arena.written_bytes(), 128u);
  EXPECT_EQ(arena.used_bytes(), 64u + 128u + 64u + 64u + 128u);
  const std::vector<ArenaBlock> blocks = arena.blocks();
  ASSERT_EQ(blocks.size(), 5u);
  EXPECT_EQ(blocks[0].data, file.data());
  EXPECT_EQ(blocks[1].tag, 12u);
  EXPECT_EQ(blocks[1].bytes, 99u);
  EXPECT_EQ(blocks[4].tag, 13u);
}

// Blocks are tagged by owner, place and shape: the same owner packing again gets its blocks back, another owner or
// shape does not.
TEST(PackCache, PackedMatricesAreTaggedByOwnerPlaceAndShape) {
  auto first = std::make_shared<ZeroedArena>();
  {
    cpu::PackingArenaScope scope(first);
    scope.set_owner("conv_a");
    const float values[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    cpu::PackedMatrix::pack(cpu::GemmSide::A, reinterpret_cast<const std::byte*>(values), cpu::Elem::F32, 3, 4);
    cpu::PackedMatrix::zeroed(cpu::GemmSide::B, cpu::Elem::F32, 4, 3);
    scope.set_owner("conv_b");
    cpu::PackedMatrix::zeroed(cpu::GemmSide::B, cpu::Elem::F32, 4, 3);
  }
  const std::vector<ArenaBlock> blocks = first->blocks();
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_NE(blocks[0].tag, blocks[1].tag);
  EXPECT_NE(blocks[1].tag, blocks[2].tag);  // same shape, another owner
  for (const ArenaBlock& block : blocks) EXPECT_NE(block.tag, 0u);

  auto second = std::make_shared<ZeroedArena>(blocks, first);
  cpu::PackingArenaScope scope(second);
  scope.set_owner("conv_b");
  const cpu::PackedMatrix b = cpu::PackedMatrix::zeroed(cpu::GemmSide::B, cpu::Elem::F32, 4, 3);
  EXPECT_TRUE(b.prewritten());
  EXPECT_EQ(b.panel(0), blocks[2].data);
  scope.set_owner("conv_a");
  const float other[12] = {};
  const cpu::PackedMatrix a =
      cpu::PackedMatrix::pack(cpu::GemmSide::A, reinterpret_cast<const std::byte*>(other), cpu::Elem::F32, 3, 4);
  EXPECT_TRUE(a.prewritten());
  EXPECT_EQ(reinterpret_cast<const float*>(a.panel(0))[0], 1.0f);  // what was packed first, not packed again
  const cpu::PackedMatrix wider = cpu::PackedMatrix::zeroed(cpu::GemmSide::B, cpu::Elem::F32, 4, 5);
  EXPECT_FALSE(wider.prewritten());
  scope.set_owner("conv_c");
  EXPECT_FALSE(cpu::PackedMatrix::zeroed(cpu::GemmSide::A, cpu::Elem::F32, 3, 4).prewritten());
}

using test::random_tensor;

// x [1, 16, 10, 10] -> conv 3x3 (Winograd) -> BatchNorm (folded while packing) -> relu -> conv 1x1 -> grouped conv
// 3x3 (a packed product per group) -> [1, 20, 10, 10].
struct Net {
  Program program;
  std::vector<std::pair<ValueId, Tensor>> weights;
  Tensor input;
};

Net small_net(uint32_t seed, bool last_relu = false) {
  test::GraphBuilder builder;
  Net net;
  const auto weight = [&](const std::string& name, const Shape& shape, float low = -1.0f) {
    const ValueId id = builder.weight(name, shape);
    net.weights.emplace_back(id, random_tensor(shape, seed + static_cast<uint32_t>(net.weights.size()), low, 2.0f));
    return id;
  };
  const auto conv = [&](ValueId x, ValueId w, int64_t padding, int64_t groups) {
    Attrs attrs;
    attrs.set("padding", std::vector<int64_t>{padding});
    attrs.set("groups", groups);
    return builder.op("conv2d", {x, w}, attrs);
  };
  const ValueId x = builder.input("x", {1, 16, 10, 10});
  ValueId y = conv(x, weight("c1.weight", {24, 16, 3, 3}), 1, 1);
  std::vector<ValueId> bn{y, weight("bn.weight", {24}), weight("bn.bias", {24}), weight("bn.mean", {24}),
                          weight("bn.var", {24}, 0.1f)};
  Attrs eps;
  eps.set("eps", 1e-3);
  y = builder.op("relu", {builder.op("batch_norm", bn, eps)});
  y = conv(y, weight("c2.weight", {20, 24, 1, 1}), 0, 1);
  y = conv(y, weight("c3.weight", {20, 5, 3, 3}), 1, 4);
  if (last_relu) y = builder.op("relu", {y});
  builder.output(y);
  Graph graph = builder.graph();
  compiler::PassContext context;
  compiler::fold_batchnorm(graph, context);
  net.program.compute_dtype = DType::Float32;
  net.program.plan = compiler::plan_memory(graph, DType::Float32);
  net.program.graph = std::move(graph);
  net.input = random_tensor({1, 16, 10, 10}, seed + 100);
  return net;
}

struct Prepared {
  Tensor out;
  PrepareCost cost;
};

// Prepares and runs the net, then keeps its packed weights; the cost's notes end with what keeping them did.
Prepared run_net(const Net& net, const std::string& cache, int threads = 2) {
  cpu::CpuBackend backend({.threads = threads, .poison_memory = true, .pack_cache = cache});
  const auto prepared = backend.prepare(net.program, net.weights);
  Prepared result{prepared->run({{"x", net.input}})[0].second, prepared->prepare_cost()};
  for (std::string& note : prepared->keep_packed_weights()) result.cost.notes.push_back(std::move(note));
  EXPECT_TRUE(prepared->keep_packed_weights().empty()) << "kept twice";
  return result;
}

void expect_same_bits(const Tensor& actual, const Tensor& expected, const std::string& label) {
  ASSERT_EQ(actual.shape(), expected.shape()) << label;
  ASSERT_EQ(std::memcmp(actual.bytes(), expected.bytes(), expected.nbytes()), 0) << label;
}

bool has_note(const PrepareCost& cost, const std::string& fragment) {
  for (const std::string& note : cost.notes)
    if (note.find(fragment) != std::string::npos) return true;
  return false;
}

std::vector<fs::path> pack_files(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  return files;
}

TEST(PackCache, BuildCarriesAnId) { EXPECT_GE(cpu::build_id().size(), 8u); }

// The widest vectors give XXH3's values: the empty input's published hash, and the portable build's on every size
// around its stripe and block lengths.
TEST(PackCache, ContentHashIsXxh3) {
  EXPECT_EQ(hash_bytes(nullptr, 0), 0x2D06800538D394C2ull);
  std::vector<uint8_t> bytes(3 << 20);
  std::mt19937 rng(7);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  for (size_t size : {1, 3, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4096, 65537, 3 << 20})
    for (size_t offset : {0, 1, 13})
      if (offset + size <= bytes.size())
        ASSERT_EQ(hash_bytes(bytes.data() + offset, size), XXH3_64bits(bytes.data() + offset, size)) << size;
  ContentHasher hasher;
  hasher.add(bytes.data(), 1000);
  hasher.add(bytes.data() + 1000, 24);
  const XXH128_hash_t whole = XXH3_128bits(bytes.data(), 1024);
  EXPECT_EQ(hasher.digest().high, whole.high64);
  EXPECT_EQ(hasher.digest().low, whole.low64);
}

TEST(PackCache, SecondPreparationMapsWhatTheFirstSavedAndComputesTheSameBits) {
  const Net net = small_net(3);
  const Prepared plain = run_net(net, "");
  ASSERT_GT(plain.cost.packed_bytes, 0);
  EXPECT_EQ(plain.cost.mapped_bytes, 0);
  EXPECT_TRUE(plain.cost.notes.empty());

  const std::string dir = test::fresh_work_dir("cache") + "/packed";  // made by the first save
  const Prepared first = run_net(net, dir);
  EXPECT_TRUE(has_note(first.cost, "saved " + dir + "/")) << ::testing::PrintToString(first.cost.notes);
  EXPECT_EQ(first.cost.mapped_bytes, 0);
  expect_same_bits(first.out, plain.out, "first");
  ASSERT_EQ(pack_files(dir).size(), 1u);
  EXPECT_EQ(pack_files(dir)[0].extension(), ".npupack");

  for (int threads : {1, 2}) {
    const Prepared again = run_net(net, dir, threads);
    EXPECT_EQ(again.cost.mapped_bytes, again.cost.packed_bytes) << threads;
    EXPECT_EQ(again.cost.packed_bytes, plain.cost.packed_bytes) << threads;
    EXPECT_TRUE(has_note(again.cost, "mapped " + pack_files(dir)[0].string()))
        << ::testing::PrintToString(again.cost.notes);
    expect_same_bits(again.out, plain.out, "mapped, threads " + std::to_string(threads));
  }
  EXPECT_EQ(pack_files(dir).size(), 1u);
}

TEST(PackCache, OtherWeightsOrAnotherProgramGetFilesOfTheirOwn) {
  const std::string dir = test::fresh_work_dir("cache");
  const Net net = small_net(5);
  run_net(net, dir);
  Net changed = net;
  Tensor c2 = changed.weights[5].second.to(DType::Float32);  // c2.weight, one value changed
  c2.mutable_data<float>()[7] += 0.5f;
  changed.weights[5].second = c2;
  const Prepared other = run_net(changed, dir);
  EXPECT_EQ(other.cost.mapped_bytes, 0);
  expect_same_bits(other.out, run_net(changed, "").out, "changed weights");
  EXPECT_EQ(pack_files(dir).size(), 2u);

  const Net relu = small_net(5, true);
  const Prepared program = run_net(relu, dir);
  EXPECT_EQ(program.cost.mapped_bytes, 0);
  expect_same_bits(program.out, run_net(relu, "").out, "another program");
  EXPECT_EQ(pack_files(dir).size(), 3u);
}

void flip_byte(const fs::path& file, uint64_t at) {
  std::fstream io(file, std::ios::binary | std::ios::in | std::ios::out);
  io.seekg(static_cast<std::streamoff>(at));
  const char byte = static_cast<char>(io.get() ^ 0x10);
  io.seekp(static_cast<std::streamoff>(at));
  io.put(byte);
}

// The net's outputs without a cache, and the one file its first preparation saved in a fresh directory.
struct SavedPack {
  Tensor expected;
  std::string dir;
  fs::path file;
};

SavedPack saved_pack(const Net& net) {
  SavedPack saved{run_net(net, "").out, test::fresh_work_dir("cache"), {}};
  run_net(net, saved.dir);
  saved.file = pack_files(saved.dir).at(0);
  return saved;
}

TEST(PackCache, DamagedFilesAreIgnoredAndWrittenAgain) {
  const Net net = small_net(9);
  const auto [expected, dir, file] = saved_pack(net);
  const auto size = fs::file_size(file);
  const std::vector<std::pair<std::string, std::function<void()>>> damages = {
      {"truncated", [&] { fs::resize_file(file, size - 100); }},
      {"shorter than its header", [&] { fs::resize_file(file, 10); }},
      {"not a packed-weights file", [&] { std::ofstream(file, std::ios::binary) << std::string(5000, 'x'); }},
      {"empty", [&] { std::ofstream(file, std::ios::binary).flush(); }},
      {"checksum", [&] { flip_byte(file, size - 3); }},  // a value of the last block
  };
  for (const auto& [label, damage] : damages) {
    damage();
    const Prepared repaired = run_net(net, dir);
    EXPECT_EQ(repaired.cost.mapped_bytes, 0) << label;
    EXPECT_TRUE(has_note(repaired.cost, "ignored " + file.string()))
        << label << ": " << ::testing::PrintToString(repaired.cost.notes);
    EXPECT_TRUE(has_note(repaired.cost, "saved " + file.string())) << label;
    expect_same_bits(repaired.out, expected, label);
    EXPECT_EQ(fs::file_size(file), size) << label;
    const Prepared mapped = run_net(net, dir);
    EXPECT_EQ(mapped.cost.mapped_bytes, mapped.cost.packed_bytes) << label;
    expect_same_bits(mapped.out, expected, label + ", mapped");
  }
}

// Any damage to the header, the block table or a block's bytes: the program computes the same bits, from the file
// when the damage missed everything the file is read for, else from packing again.
TEST(PackCache, RandomDamageNeverChangesTheResult) {
  const Net net = small_net(17);
  const auto [expected, dir, file] = saved_pack(net);
  std::ifstream in(file, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937 rng(3);
  int ignored = 0;
  for (int round = 0; round < 60; ++round) {
    std::string damaged = good;
    // Mostly the header and block table (its first 1000 bytes here), sometimes anywhere.
    const size_t region = round % 4 == 3 ? damaged.size() : 1000;
    for (int flips = 1 + static_cast<int>(rng() % 3); flips > 0; --flips)
      damaged[rng() % region] ^= static_cast<char>(1 << (rng() % 8));
    std::ofstream(file, std::ios::binary | std::ios::trunc) << damaged;
    const Prepared prepared = run_net(net, dir);
    expect_same_bits(prepared.out, expected, "round " + std::to_string(round));
    ignored += prepared.cost.mapped_bytes == 0;
  }
  EXPECT_GT(ignored, 45);  // nearly every flip lands on something read (a few on padding)
}

// Saving removes the least recently used files beyond PackCache::kMaxDirectoryBytes; mapping a file renews it.
TEST(PackCache, SavingRemovesTheLeastRecentlyUsedFilesBeyondTheDirectorysLimit) {
  const Net net = small_net(21), other = small_net(23);
  const auto [expected, dir, file] = saved_pack(net);
  const auto long_ago = fs::file_time_type::clock::now() - std::chrono::hours(24 * 365 * 10);
  fs::last_write_time(file, long_ago);
  // A sparse file that leaves less room than the other net's file needs, used after `file` was.
  const fs::path filler = dir + "/00000000000000000000000000000000.npupack";
  std::ofstream(filler).flush();
  fs::resize_file(filler, cpu::PackCache::kMaxDirectoryBytes - fs::file_size(file) - 64);
  fs::last_write_time(filler, long_ago + std::chrono::hours(24));
  const fs::path unrelated = dir + "/notes.txt";
  std::ofstream(unrelated) << "not a pack file";
  fs::last_write_time(unrelated, long_ago - std::chrono::hours(24));

  const Prepared mapped = run_net(net, dir);  // renews `file`: now the filler is the least recently used
  EXPECT_EQ(mapped.cost.mapped_bytes, mapped.cost.packed_bytes);
  EXPECT_GT(fs::last_write_time(file), fs::last_write_time(filler));
  const Prepared saved = run_net(other, dir);
  EXPECT_TRUE(has_note(saved.cost, "removed the 1 least recently used file(s)"))
      << ::testing::PrintToString(saved.cost.notes);
  EXPECT_FALSE(fs::exists(filler));
  EXPECT_TRUE(fs::exists(file));
  EXPECT_TRUE(fs::exists(unrelated));
  EXPECT_EQ(pack_files(dir).size(), 3u);  // both nets' files and the unrelated one
  expect_same_bits(run_net(net, dir).out, expected, "kept file");
}

TEST(PackCache, UnwritableDirectoryIsReportedAndTheProgramStillRuns) {
  const Net net = small_net(13);
  const std::string not_a_dir = test::fresh_work_dir("cache") + "/a_file";
  std::ofstream(not_a_dir) << "x";
  const Prepared prepared = run_net(net, not_a_dir);
  EXPECT_TRUE(has_note(prepared.cost, "not saved to " + not_a_dir + "/"))
      << ::testing::PrintToString(prepared.cost.notes);
  expect_same_bits(prepared.out, run_net(net, "").out, "unwritable");
}

}  // namespace
}  // namespace npusim
