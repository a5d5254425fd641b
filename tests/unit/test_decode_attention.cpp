// The decode-step attention kernel (backends/cpu/attention_kernels.h) against the registry's reference of the fused
// `attention` op: every output element, for each storage dtype, grouped-query head layouts, head sizes that are not a
// multiple of the vector width, cache bounds from the first to the last position, and one or two threads.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "backends/cpu/attention_kernels.h"
#include "npusim/op_registry.h"

namespace npusim::cpu {
namespace {

Tensor random_tensor(Shape shape, uint64_t seed) {
  Tensor t(DType::Float32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    t.mutable_data<float>()[i] = static_cast<float>(seed >> 40) * 0x1.0p-23f - 1.0f;
  }
  return t;
}

// A value in storage form, and the same values back in fp32 (what the reference sees).
struct Stored {
  AlignedBuffer memory;
  Buffer buffer;
  Tensor exact;
};

Stored store(const Tensor& t, Elem elem) {
  Stored s{AlignedBuffer(static_cast<size_t>(t.numel()) * elem_size(elem)), {}, {}};
  tensor_to_storage(t, s.memory.data(), elem);
  s.buffer = Buffer{s.memory.data(), elem, {t.shape(), t.dtype()}};
  s.exact = storage_to_tensor(s.memory.data(), elem, t.shape());
  return s;
}

Node attention_node(bool has_mask, std::optional<double> scale) {
  Node node;
  node.name = "sdpa";
  node.op = "attention";
  node.def = OpRegistry::instance().find("attention");
  node.attrs.set("has_mask", has_mask);
  node.attrs.set("has_cache_position", true);
  if (scale) node.attrs.set("scale", *scale);
  OpRegistry::instance().normalize_attrs(*node.def, nullptr, node.attrs, "test");
  return node;
}

struct Case {
  int64_t q_heads, kv_heads, embed, source, position;
};

void check_case(const Case& c, Elem elem, int threads, std::optional<double> scale) {
  const std::string label = "heads " + std::to_string(c.q_heads) + "/" + std::to_string(c.kv_heads) + " embed " +
                            std::to_string(c.embed) + " position " + std::to_string(c.position) + " elem " +
                            std::to_string(static_cast<int>(elem)) + " threads " + std::to_string(threads);
  const Node node = attention_node(false, scale);
  Stored q = store(random_tensor({1, c.q_heads, 1, c.embed}, 1), elem);
  Stored k = store(random_tensor({1, c.kv_heads, c.source, c.embed}, 2), elem);
  Stored v = store(random_tensor({1, c.kv_heads, c.source, c.embed}, 3), elem);
  Tensor positions(DType::Int64, {1});
  positions.mutable_data<int64_t>()[0] = c.position;
  Stored p = store(positions, Elem::I64);
  Stored out = store(Tensor(DType::Float32, {1, c.q_heads, 1, c.embed}), elem);
  std::fill_n(reinterpret_cast<uint8_t*>(out.memory.data()), out.memory.size(), 0xff);  // NaN sentinel

  ThreadPool pool(threads);
  ScratchSpace scratch;
  const KernelContext ctx{node, {q.buffer, k.buffer, v.buffer, p.buffer}, {out.buffer}, pool, scratch, nullptr, {}};
  std::optional<Kernel> kernel = decode_attention(ctx);
  ASSERT_TRUE(kernel) << label;
  scratch.allocate(pool.size());
  kernel->run();

  const std::vector<Tensor> inputs{q.exact, k.exact, v.exact, positions};
  const std::vector<TensorMeta> metas{out.buffer.meta};
  const std::vector<Tensor> expected = node.def->reference(node.attrs, inputs, metas);
  const Tensor actual = storage_to_tensor(out.memory.data(), elem, out.buffer.meta.shape);
  const double ulp = elem == Elem::F32 ? 0.0 : elem == Elem::BF16 ? 0x1.0p-8 : 0x1.0p-11;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double want = expected[0].data<float>()[i];
    ASSERT_NEAR(actual.data<float>()[i], want, 2e-6 + std::fabs(want) * ulp) << label << " at " << i;
  }
}

TEST(DecodeAttention, MatchesTheReferenceForEveryLayout) {
  const Case cases[] = {{6, 2, 16, 40, 0}, {6, 2, 16, 40, 5},  {12, 2, 128, 40, 39}, {16, 1, 17, 33, 20},
                        {3, 3, 7, 9, 8},   {8, 2, 24, 50, 49}, {1, 1, 1, 1, 0},      {4, 2, 33, 12, 100}};
  for (Elem elem : {Elem::F32, Elem::BF16, Elem::F16})
    for (int threads : {1, 2})
      for (const Case& c : cases) {
        check_case(c, elem, threads, std::nullopt);
        if (HasFatalFailure()) return;
      }
  check_case({6, 2, 16, 40, 30}, Elem::F32, 2, 0.3);
}

TEST(DecodeAttention, LeavesOtherShapesToTheGeneralKernel) {
  ThreadPool pool(1);
  ScratchSpace scratch;
  Stored q = store(random_tensor({1, 4, 2, 8}, 1), Elem::F32);  // two query positions
  Stored k = store(random_tensor({1, 2, 10, 8}, 2), Elem::F32);
  Stored v = store(random_tensor({1, 2, 10, 8}, 3), Elem::F32);
  Tensor positions(DType::Int64, {2});
  Stored p = store(positions, Elem::I64);
  Stored out = store(Tensor(DType::Float32, {1, 4, 2, 8}), Elem::F32);
  const Node plain = attention_node(false, std::nullopt);
  EXPECT_FALSE(decode_attention({plain, {q.buffer, k.buffer, v.buffer, p.buffer}, {out.buffer}, pool, scratch}));
  Stored q1 = store(random_tensor({1, 4, 1, 8}, 1), Elem::F32);
  Stored mask = store(Tensor(DType::Float32, {1, 1, 1, 10}), Elem::F32);
  Stored out1 = store(Tensor(DType::Float32, {1, 4, 1, 8}), Elem::F32);
  const Node masked = attention_node(true, std::nullopt);
  EXPECT_FALSE(
      decode_attention({masked, {q1.buffer, k.buffer, v.buffer, mask.buffer, p.buffer}, {out1.buffer}, pool, scratch}));
  Stored odd_k = store(random_tensor({1, 3, 10, 8}, 2), Elem::F32);  // 4 query heads over 3 key heads
  EXPECT_FALSE(
      decode_attention({plain, {q1.buffer, odd_k.buffer, odd_k.buffer, p.buffer}, {out1.buffer}, pool, scratch}));
  EXPECT_TRUE(decode_attention({plain, {q1.buffer, k.buffer, v.buffer, p.buffer}, {out1.buffer}, pool, scratch}));
}

}  // namespace
}  // namespace npusim::cpu
