#!/usr/bin/env python3
"""Converts a Qwen2 model directory (config.json + model.safetensors, as `bench_llm write DIR` makes it) to GGUF
for llama.cpp, without a vocabulary (llama-bench feeds random token ids).

    PYTHONPATH=LLAMA_CPP/gguf-py /usr/bin/python3 qwen_to_gguf.py DIR OUT.gguf --type f16|bf16

Matrices are stored in --type, norms and biases in f32 (as llama.cpp's own converter does). Needs only numpy and
the gguf-py package inside the llama.cpp tree; the safetensors file is read through a memory map.
"""
import argparse
import json
import os
import struct

import numpy
import gguf

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
FILE_TYPES = {"f16": gguf.LlamaFileType.MOSTLY_F16, "bf16": gguf.LlamaFileType.MOSTLY_BF16}


def gguf_name(name):
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    parts = name.split(".", 3)  # model, layers, N, rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_NAMES:
        return f"blk.{parts[2]}.{LAYER_NAMES[parts[3]]}"
    raise ValueError(f"no llama.cpp name for tensor '{name}'")


def read_safetensors(path):
    """name -> (dtype name, numpy memmap of the raw elements in their stored shape)."""
    with open(path, "rb") as file:
        header_length = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(header_length))
    element = {"BF16": numpy.uint16, "F16": numpy.float16, "F32": numpy.float32}
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = element[entry["dtype"]]
        count = (end - begin) // numpy.dtype(dtype).itemsize
        array = numpy.memmap(path, dtype=dtype, mode="r", offset=8 + header_length + begin, shape=(count,))
        tensors[name] = (entry["dtype"], array.reshape(entry["shape"]))
    return tensors


def as_float32(dtype, array):
    if dtype == "BF16":
        return (array.astype(numpy.uint32) << 16).view(numpy.float32)
    return numpy.asarray(array, dtype=numpy.float32)


def add_tensor(writer, name, dtype, array, target):
    if array.ndim < 2:
        writer.add_tensor(name, as_float32(dtype, array))
    elif target == "bf16" and dtype == "BF16":
        writer.add_tensor(name, numpy.asarray(array).view(numpy.uint8), raw_dtype=gguf.GGMLQuantizationType.BF16)
    elif target == "bf16":
        bits = as_float32(dtype, array).view(numpy.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(numpy.uint16)
        writer.add_tensor(name, rounded.view(numpy.uint8), raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        writer.add_tensor(name, as_float32(dtype, array).astype(numpy.float16))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("out")
    parser.add_argument("--type", choices=sorted(FILE_TYPES), default="f16")
    args = parser.parse_args()

    with open(os.path.join(args.model_dir, "config.json")) as file:
        config = json.load(file)
    if config.get("model_type") != "qwen2":
        raise SystemExit(f"{args.model_dir}: model_type {config.get('model_type')!r}, expected 'qwen2'")
    arch = "qwen2"
    writer = gguf.GGUFWriter(args.out, arch)
    writer.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads", config["num_attention_heads"]))
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_tokenizer_model("none")
    writer.add_file_type(FILE_TYPES[args.type])

    tensors = read_safetensors(os.path.join(args.model_dir, "model.safetensors"))
    for name, (dtype, array) in tensors.items():
        add_tensor(writer, gguf_name(name), dtype, array, args.type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    print(f"wrote {args.out}: {len(tensors)} tensors, {args.type}")


if __name__ == "__main__":
    main()
