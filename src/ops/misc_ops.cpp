// Identity-like ops: metadata checks, aliases, copies, dtype conversion, dropout in eval mode, getitem.
#include "ops/op_util.h"

namespace npusim {

namespace {

using namespace ops;

std::vector<Tensor> pass_first(const Attrs&, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
  return {inputs[0].reshaped(outputs[0].shape)};
}

std::vector<TensorMeta> infer_same(const Attrs&, std::span<const TensorMeta> inputs) { return {inputs[0]}; }

OpDef identity_op(std::string name, std::vector<AtenSpelling> spellings, std::vector<AttrSpec> attrs = {}) {
  return OpDef{std::move(name), std::move(spellings), std::move(attrs), 1, 1, infer_same, pass_first};
}

}  // namespace

void register_misc_ops(OpRegistry& r) {
  // Checks done at export time; nothing to compute and no outputs.
  r.add(
      OpDef{"assert_metadata",
            {{"aten._assert_tensor_metadata.default"},
             {"aten._assert_scalar.default"},
             {"aten.sym_constrain_range_for_size.default"}},
            {},
            0,
            -1,
            [](const Attrs&, std::span<const TensorMeta>) { return std::vector<TensorMeta>{}; },
            [](const Attrs&, std::span<const Tensor>, std::span<const TensorMeta>) { return std::vector<Tensor>{}; }});

  r.add(identity_op(
      "alias",
      {{"aten.alias.default"}, {"aten.detach.default"}, {"aten.detach_.default"}, {"aten.lift_fresh_copy.default"}}));
  r.add(identity_op("clone", {{"aten.clone.default"}, {"aten.contiguous.default"}},
                    {{"memory_format", AttrType::String, std::nullopt}}));
  r.add(identity_op("dropout",
                    {{"aten.dropout.default"},
                     {"aten.dropout_.default"},
                     {"aten.feature_dropout.default"},
                     {"aten.alpha_dropout.default"}},
                    {{"p", AttrType::Float, AttrValue{0.5}}, {"train", AttrType::Bool, AttrValue{false}}}));

  // Dtype conversion. The reference computes every float in fp32, so float-to-float conversion is the identity.
  r.add(OpDef{"to",
              {{"aten.to.dtype"},
               {"aten.to.dtype_layout"},
               {"aten.to.device"},
               {"aten._to_copy.default"},
               {"aten.to.other"},
               {"aten.type_as.default"}},
              {{"dtype", AttrType::DTypeName, std::nullopt}},
              1,
              2,
              [](const Attrs& attrs, std::span<const TensorMeta> inputs) {
                TensorMeta out = inputs[0];
                if (inputs.size() == 2)
                  out.dtype = inputs[1].dtype;  // to.other / type_as
                else if (!attrs.is_none("dtype"))
                  out.dtype = *parse_dtype(attrs.get_string("dtype"));
                return std::vector<TensorMeta>{out};
              },
              [](const Attrs&, std::span<const Tensor> inputs, std::span<const TensorMeta> outputs) {
                return std::vector<Tensor>{inputs[0].to(reference_dtype(outputs[0].dtype))};
              }});

  // Selects one output of a multi-output producer; the IR lists all of the producer's outputs as inputs.
  r.add(OpDef{"getitem",
              {{"<built-in function getitem>"}},
              {{"index", AttrType::Int, std::nullopt, true}},
              1,
              -1,
              [](const Attrs& attrs, std::span<const TensorMeta> inputs) {
                const int64_t index = attrs.get_int("index");
                if (index < 0 || index >= static_cast<int64_t>(inputs.size()))
                  fail("getitem index " + std::to_string(index) + " is out of range for " +
                       std::to_string(inputs.size()) + " inputs");
                return std::vector<TensorMeta>{inputs[static_cast<size_t>(index)]};
              },
              [](const Attrs& attrs, std::span<const Tensor> inputs, std::span<const TensorMeta>) {
                return std::vector<Tensor>{inputs[static_cast<size_t>(attrs.get_int("index"))]};
              }});
}

}  // namespace npusim
