// Hugging Face rotary embedding, exported as the higher-order op `wrap_with_set_grad_enabled` because the rotary
// forward runs under torch.no_grad(): inputs inv_freq [D/2] and position_ids [B, S], outputs cos and sin [B, S, D].
#include <cmath>

#include "ops/op_util.h"

namespace npusim {

namespace {

using namespace ops;

const char* const kUnsupportedForm =
    "wrap_with_set_grad_enabled: only the Hugging Face rotary-embedding form (inv_freq, position_ids) is supported";

std::vector<TensorMeta> infer_rotary_embedding(const Attrs&, std::span<const TensorMeta> inputs) {
  if (inputs.size() != 2) fail(std::string(kUnsupportedForm) + "; got " + std::to_string(inputs.size()) + " inputs");
  const TensorMeta& inv_freq = inputs[0];
  const TensorMeta& positions = inputs[1];
  if (inv_freq.shape.size() != 1 || !is_floating(inv_freq.dtype))
    fail(std::string(kUnsupportedForm) + "; inv_freq must be a 1-D float tensor, got " + shape_string(inv_freq.shape) +
         " " + std::string(dtype_name(inv_freq.dtype)));
  if (positions.shape.size() != 2 || !is_integral(positions.dtype))
    fail(std::string(kUnsupportedForm) + "; position_ids must be a 2-D integer tensor, got " +
         shape_string(positions.shape) + " " + std::string(dtype_name(positions.dtype)));
  // HF computes in fp32 and casts cos/sin to the activations' dtype, which is the dtype inv_freq was stored in.
  const TensorMeta table{{positions.shape[0], positions.shape[1], 2 * inv_freq.shape[0]}, inv_freq.dtype};
  return {table, table};
}

// freqs[b, s, i] = float(pos[b, s]) * inv_freq[i] in fp32; emb = cat(freqs, freqs); outputs cos/sin(emb) * scaling.
std::vector<Tensor> rotary_embedding_reference(const Attrs& attrs, std::span<const Tensor> inputs,
                                               std::span<const TensorMeta> outputs) {
  const auto scaling = static_cast<float>(attrs.get_float("attention_scaling"));
  const float* inv_freq = inputs[0].data<float>();
  const int64_t* positions = inputs[1].data<int64_t>();
  const int64_t half = inputs[0].numel();
  Tensor cos_table(DType::Float32, outputs[0].shape);
  Tensor sin_table(DType::Float32, outputs[1].shape);
  float* cos_out = cos_table.mutable_data<float>();
  float* sin_out = sin_table.mutable_data<float>();
  for (int64_t row = 0; row < inputs[1].numel(); ++row) {
    const auto position = static_cast<float>(positions[row]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = position * inv_freq[i];
      const float c = std::cos(angle) * scaling;
      const float s = std::sin(angle) * scaling;
      for (int64_t copy : {i, i + half}) {
        cos_out[row * 2 * half + copy] = c;
        sin_out[row * 2 * half + copy] = s;
      }
    }
  }
  return {cos_table, sin_table};
}

}  // namespace

void register_rotary_embedding_op(OpRegistry& r) {
  r.add(checked_op<infer_rotary_embedding, rotary_embedding_reference>(
      "rotary_embedding", {AtenSpelling{"wrap_with_set_grad_enabled", {}, {}}},
      {{"attention_scaling", AttrType::Float, AttrValue{1.0}}}, 0, -1));
}

}  // namespace npusim
