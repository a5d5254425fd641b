#include "backends/cpu/storage.h"

#include <cstdlib>

#include "core/cpu_features.h"
#include "core/zeroed_memory.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NPUSIM_CPU_X86 1
#endif

namespace npusim::cpu {

size_t elem_size(Elem elem) {
  switch (elem) {
    case Elem::F32:
      return 4;
    case Elem::F16:
    case Elem::BF16:
      return 2;
    case Elem::I64:
      return 8;
    case Elem::Bool:
      return 1;
  }
  return 1;
}

Elem float_storage(DType compute_dtype) {
  switch (compute_dtype) {
    case DType::Float32:
      return Elem::F32;
    case DType::Float16:
      return Elem::F16;
    case DType::BFloat16:
      return Elem::BF16;
    default:
      fail("cpu backend: compute dtype must be float32, float16 or bfloat16, got " +
           std::string(dtype_name(compute_dtype)));
  }
}

Elem storage_elem(DType dtype, Elem floats) {
  if (is_floating(dtype)) return floats;
  return dtype == DType::Bool ? Elem::Bool : Elem::I64;
}

std::vector<Elem> value_storage_elems(const Graph& graph, Elem floats) {
  std::vector<Elem> elems(graph.values.size());
  for (size_t i = 0; i < graph.values.size(); ++i) elems[i] = storage_elem(graph.values[i].meta.dtype, floats);
  for (const Node& node : graph.nodes) {
    if (node.op != "rotary_embedding" || node.inputs.empty()) continue;
    const ValueId frequencies = node.inputs[0];
    if (graph.value(frequencies).kind == ValueKind::Weight && is_floating(graph.value(frequencies).meta.dtype))
      elems[static_cast<size_t>(frequencies)] = Elem::F32;
  }
  return elems;
}

DType reference_dtype_of(Elem elem) {
  if (is_float_elem(elem)) return DType::Float32;
  return elem == Elem::Bool ? DType::Bool : DType::Int64;
}

namespace {

template <typename T>
T read_as(const std::byte* data, int64_t i) {
  T value;
  std::memcpy(&value, data + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
void write_as(std::byte* data, int64_t i, T value) {
  std::memcpy(data + static_cast<size_t>(i) * sizeof(T), &value, sizeof(T));
}

// ---- bulk conversions: portable loops the compiler vectorizes, and AVX2/F16C clones picked at run time ----

inline uint16_t bf16_round(uint32_t word) {
  const bool nan = (word & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? ((word >> 16) | 0x40u) : ((word + 0x7fffu + ((word >> 16) & 1u)) >> 16));
}

[[gnu::always_inline]] inline void bf16_to_f32_body(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &word, sizeof word);
  }
}

[[gnu::always_inline]] inline void f32_to_bf16_body(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t word;
    std::memcpy(&word, src + i, sizeof word);
    dst[i] = bf16_round(word);
  }
}

void bf16_to_f32_plain(const uint16_t* src, float* dst, int64_t n) { bf16_to_f32_body(src, dst, n); }
void f32_to_bf16_plain(const float* src, uint16_t* dst, int64_t n) { f32_to_bf16_body(src, dst, n); }
void f16_to_f32_plain(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(src[i]);
}
void f32_to_f16_plain(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_fp16(src[i]);
}

#ifdef NPUSIM_CPU_X86
__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint16_t* src, float* dst, int64_t n) {
  bf16_to_f32_body(src, dst, n);
}
__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* src, uint16_t* dst, int64_t n) {
  f32_to_bf16_body(src, dst, n);
}
__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = fp16_to_float(src[i]);
}
__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = float_to_fp16(src[i]);
}
#endif

struct Converters {
  void (*bf16_to_f32)(const uint16_t*, float*, int64_t);
  void (*f32_to_bf16)(const float*, uint16_t*, int64_t);
  void (*f16_to_f32)(const uint16_t*, float*, int64_t);
  void (*f32_to_f16)(const float*, uint16_t*, int64_t);
};

const Converters& converters() {
  static const Converters selected = [] {
    Converters c{bf16_to_f32_plain, f32_to_bf16_plain, f16_to_f32_plain, f32_to_f16_plain};
#ifdef NPUSIM_CPU_X86
    if (cpu_features().avx2) {
      c.bf16_to_f32 = bf16_to_f32_avx2;
      c.f32_to_bf16 = f32_to_bf16_avx2;
      if (cpu_features().f16c) {
        c.f16_to_f32 = f16_to_f32_f16c;
        c.f32_to_f16 = f32_to_f16_f16c;
      }
    }
#endif
    return c;
  }();
  return selected;
}

}  // namespace

float load_float(const std::byte* data, Elem elem, int64_t i) {
  switch (elem) {
    case Elem::F32:
      return read_as<float>(data, i);
    case Elem::F16:
      return fp16_to_float(read_as<uint16_t>(data, i));
    case Elem::BF16:
      return bf16_bits_to_float(read_as<uint16_t>(data, i));
    case Elem::I64:
      return static_cast<float>(read_as<int64_t>(data, i));
    case Elem::Bool:
      return read_as<uint8_t>(data, i) ? 1.0f : 0.0f;
  }
  return 0.0f;
}

int64_t load_int(const std::byte* data, Elem elem, int64_t i) {
  switch (elem) {
    case Elem::I64:
      return read_as<int64_t>(data, i);
    case Elem::Bool:
      return read_as<uint8_t>(data, i) ? 1 : 0;
    default:
      return float_to_int64(load_float(data, elem, i));
  }
}

void store_float(std::byte* data, Elem elem, int64_t i, float value) {
  switch (elem) {
    case Elem::F32:
      write_as<float>(data, i, value);
      return;
    case Elem::F16:
      write_as<uint16_t>(data, i, float_to_fp16(value));
      return;
    case Elem::BF16:
      write_as<uint16_t>(data, i, float_to_bf16(value));
      return;
    case Elem::I64:
      write_as<int64_t>(data, i, float_to_int64(value));
      return;
    case Elem::Bool:
      write_as<uint8_t>(data, i, value != 0.0f ? 1 : 0);
      return;
  }
}

void store_int(std::byte* data, Elem elem, int64_t i, int64_t value) {
  switch (elem) {
    case Elem::I64:
      write_as<int64_t>(data, i, value);
      return;
    case Elem::Bool:
      write_as<uint8_t>(data, i, value != 0 ? 1 : 0);
      return;
    default:
      store_float(data, elem, i, static_cast<float>(value));
      return;
  }
}

void to_float(const std::byte* src, Elem elem, float* dst, int64_t count) {
  if (count <= 0) return;
  switch (elem) {
    case Elem::F32:
      std::memmove(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case Elem::F16:
      converters().f16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, count);
      return;
    case Elem::BF16:
      converters().bf16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, count);
      return;
    case Elem::I64: {
      const auto* values = reinterpret_cast<const int64_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(values[i]);
      return;
    }
    case Elem::Bool: {
      const auto* values = reinterpret_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = values[i] ? 1.0f : 0.0f;
      return;
    }
  }
}

void from_float(const float* src, std::byte* dst, Elem elem, int64_t count) {
  if (count <= 0) return;
  switch (elem) {
    case Elem::F32:
      std::memmove(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case Elem::F16:
      converters().f32_to_f16(src, reinterpret_cast<uint16_t*>(dst), count);
      return;
    case Elem::BF16:
      converters().f32_to_bf16(src, reinterpret_cast<uint16_t*>(dst), count);
      return;
    case Elem::I64: {
      auto* values = reinterpret_cast<int64_t*>(dst);
      for (int64_t i = 0; i < count; ++i) values[i] = float_to_int64(src[i]);
      return;
    }
    case Elem::Bool: {
      auto* values = reinterpret_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < count; ++i) values[i] = src[i] != 0.0f ? 1 : 0;
      return;
    }
  }
}

void to_int(const std::byte* src, Elem elem, int64_t* dst, int64_t count) {
  if (count <= 0) return;
  if (elem == Elem::I64) {
    std::memmove(dst, src, static_cast<size_t>(count) * sizeof(int64_t));
  } else if (elem == Elem::Bool) {
    const auto* values = reinterpret_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < count; ++i) dst[i] = values[i] ? 1 : 0;
  } else {
    for (int64_t i = 0; i < count; ++i) dst[i] = float_to_int64(load_float(src, elem, i));
  }
}

void from_int(const int64_t* src, std::byte* dst, Elem elem, int64_t count) {
  if (count <= 0) return;
  if (elem == Elem::I64) {
    std::memmove(dst, src, static_cast<size_t>(count) * sizeof(int64_t));
  } else if (elem == Elem::Bool) {
    auto* values = reinterpret_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < count; ++i) values[i] = src[i] != 0 ? 1 : 0;
  } else {
    for (int64_t i = 0; i < count; ++i) store_float(dst, elem, i, static_cast<float>(src[i]));
  }
}

void convert(const std::byte* src, Elem from, std::byte* dst, Elem to, int64_t count) {
  if (count <= 0) return;
  if (from == to) {
    if (src != dst) std::memmove(dst, src, static_cast<size_t>(count) * elem_size(from));
    return;
  }
  constexpr int64_t kBlock = 512;
  if (is_float_elem(from)) {
    float block[kBlock];
    for (int64_t start = 0; start < count; start += kBlock) {
      const int64_t n = std::min(kBlock, count - start);
      to_float(src + static_cast<size_t>(start) * elem_size(from), from, block, n);
      from_float(block, dst + static_cast<size_t>(start) * elem_size(to), to, n);
    }
    return;
  }
  int64_t block[kBlock];
  for (int64_t start = 0; start < count; start += kBlock) {
    const int64_t n = std::min(kBlock, count - start);
    to_int(src + static_cast<size_t>(start) * elem_size(from), from, block, n);
    from_int(block, dst + static_cast<size_t>(start) * elem_size(to), to, n);
  }
}

void tensor_to_storage(const Tensor& tensor, std::byte* dst, Elem elem) {
  const Tensor reference = tensor.to_reference();
  const int64_t count = reference.numel();
  switch (reference.dtype()) {
    case DType::Float32:
      from_float(reference.data<float>(), dst, elem, count);
      return;
    case DType::Int64:
      from_int(reference.data<int64_t>(), dst, elem, count);
      return;
    default:
      convert(reference.bytes(), Elem::Bool, dst, elem, count);
      return;
  }
}

Tensor storage_to_tensor(const std::byte* src, Elem elem, const Shape& shape) {
  Tensor out(reference_dtype_of(elem), shape);
  const int64_t count = out.numel();
  switch (out.dtype()) {
    case DType::Float32:
      to_float(src, elem, out.mutable_data<float>(), count);
      break;
    case DType::Int64:
      to_int(src, elem, out.mutable_data<int64_t>(), count);
      break;
    default:
      convert(src, elem, out.mutable_bytes(), Elem::Bool, count);
      break;
  }
  return out;
}

AlignedBuffer::AlignedBuffer(size_t bytes, Pages pages) : size_(bytes) {
  if (bytes > physical_memory_bytes())
    fail("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes, more than this machine's " +
         std::to_string(physical_memory_bytes()) + " bytes of memory");
  data_ = allocate_zeroed(bytes, "a cpu backend buffer", pages);
}

}  // namespace npusim::cpu
