#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets from tests/data/fixtures (standard library only).

usage: make_seeds.py FIXTURES_DIR OUT_DIR [OPS_SOURCE_DIR]

OUT_DIR/<target>/ gets small, valid inputs: libFuzzer mutates small inputs far faster than the megabyte
fixtures, so graphs are cut down to single nodes and short prefixes, and tensors to a few elements.
OUT_DIR/torch_ir.dict gets the JSON keys and every op spelling seen in the fixtures or in the op sources
(OPS_SOURCE_DIR, src/ops), for the IR fuzzer's mutations.
"""
import glob
import json
import os
import re
import struct
import sys

MAX_IR_SEED_BYTES = 16384


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
        out.write(data if isinstance(data, bytes) else data.encode())


def meta(entry):
    return {"name": entry["name"], "shape": entry["shape"], "dtype": entry["dtype"]}


def graph_of(ir, nodes, outputs):
    """A graph holding `nodes`; inputs that come from elsewhere become graph inputs or weights."""
    mapping = ir.get("weight_name_mapping") or {}
    weight_meta = {w["name"]: w for w in ir["weights"]}
    produced = {o["name"] for node in nodes for o in node["outputs"]}
    inputs, weights, used_mapping, seen = [], [], {}, set()
    for node in nodes:
        for entry in node["inputs"]:
            name = entry["name"]
            if name in produced or name in seen:
                continue
            seen.add(name)
            key = mapping.get(name)
            if key is not None and key in weight_meta:
                weights.append(meta(weight_meta[key]))
                used_mapping[name] = key
            else:
                inputs.append(meta(entry))
    graph_inputs = {i["name"] for i in inputs}
    new_nodes = []
    for node in nodes:
        node = json.loads(json.dumps(node))
        for entry in node["inputs"]:
            if entry["name"] in graph_inputs or entry["name"] in used_mapping:
                entry.pop("producer_node", None)
                entry.pop("producer_output_idx", None)
        new_nodes.append(node)
    return {"model_name": ir.get("model_name", "seed"), "pytorch_version": ir.get("pytorch_version", ""),
            "graph_inputs": inputs, "graph_outputs": [meta(o) for o in outputs], "weights": weights,
            "weight_name_mapping": used_mapping, "nodes": new_nodes}


def ir_seeds(fixtures, out, dictionary):
    files = ["ir/resnet18_ir.json", "ir/resnet50_ir.json", "qwen_tiny/prefill_ir.json", "qwen_tiny/decode_ir.json",
             "ir/qwen15_decode_ir.json"]
    count = 0
    seen_signatures = set()
    for name in files:
        ir = json.load(open(os.path.join(fixtures, name)))
        stem = os.path.basename(name).replace(".json", "").replace("_ir", "")
        if name.startswith("qwen_tiny"):
            stem = "tiny_" + stem
        for node in ir["nodes"]:
            dictionary.add(node["op_type"])
            dictionary.update(node.get("attrs", {}).keys())
            signature = (node["op_type"], tuple(sorted(node.get("attrs", {}).keys())), len(node["inputs"]))
            if signature in seen_signatures:
                continue
            seen_signatures.add(signature)
            text = json.dumps(graph_of(ir, [node], node["outputs"]))
            if len(text) <= MAX_IR_SEED_BYTES:
                write(os.path.join(out, "torch_ir", "node_%03d_%s.json" % (count, stem)), text)
                count += 1
        for length in (2, 4, 8, 16, 32):
            nodes = ir["nodes"][:length]
            text = json.dumps(graph_of(ir, nodes, nodes[-1]["outputs"]))
            if len(text) <= MAX_IR_SEED_BYTES:
                write(os.path.join(out, "torch_ir", "prefix_%s_%02d.json" % (stem, length)), text)
    # The optional top-level keys the fixtures lack.
    with_constants = {
        "graph_inputs": [{"name": "x", "shape": [2, 2], "dtype": "float32"}],
        "graph_outputs": [{"name": "add", "shape": [2, 2], "dtype": "float32"}],
        "weights": [{"name": "bias", "shape": [2, 2], "dtype": "float32"}],
        "weight_name_mapping": {"c_bias": "bias"},
        "constants": {"bias": {"data": [[1.0, 2.0], [3.0, 4.0]], "dtype": "float32"}},
        "nodes": [{"name": "add", "op_type": "aten.add.Tensor",
                   "inputs": [{"name": "x", "shape": [2, 2], "dtype": "float32"},
                              {"name": "c_bias", "shape": [2, 2], "dtype": "float32"}],
                   "outputs": [{"name": "add", "shape": [2, 2], "dtype": "float32"}], "attrs": {"alpha": 2}}]}
    write(os.path.join(out, "torch_ir", "constants.json"), json.dumps(with_constants))
    dictionary.update(["graph_inputs", "graph_outputs", "weights", "weight_name_mapping", "nodes", "constants",
                       "name", "shape", "dtype", "op_type", "inputs", "outputs", "attrs", "producer_node",
                       "producer_output_idx", "data", "float32", "float16", "bfloat16", "int64", "int32", "bool",
                       "_tensor_list_sizes", "_tensor_list_none_masks", "9223372036854775807", "-1", "null",
                       "true", "false", "1e308", "-0.0"])


def safetensors_bytes(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, offset, payload = {}, 0, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        payload += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + payload


def read_safetensors(path):
    data = open(path, "rb").read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    return header, data[8 + length:]


SIZES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors_seeds(fixtures, out):
    target = os.path.join(out, "safetensors")
    for name in ("qwen_tiny/model.safetensors", "qwen_tiny/reference.safetensors",
                 "qwen_tiny/decode_reference.safetensors"):
        header, data = read_safetensors(os.path.join(fixtures, name))
        entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
        # The real header (names, dtypes, shapes) over a few bytes each: a 1-element view of every tensor.
        tensors = []
        for key, entry in entries[:8]:
            begin = entry["data_offsets"][0]
            size = SIZES[entry["dtype"]]
            tensors.append((key, entry["dtype"], [1] * min(len(entry["shape"]), 2), data[begin:begin + size]))
        stem = os.path.basename(name).replace(".safetensors", "")
        write(os.path.join(target, stem + "_views.safetensors"), safetensors_bytes(tensors, header.get("__metadata__")))
        # The smallest real tensor in full.
        key, entry = min(entries, key=lambda item: item[1]["data_offsets"][1] - item[1]["data_offsets"][0])
        begin, end = entry["data_offsets"]
        write(os.path.join(target, stem + "_smallest.safetensors"),
              safetensors_bytes([(key, entry["dtype"], entry["shape"], data[begin:end])]))
    every_dtype = [("t_" + dtype.lower(), dtype, [2], bytes(range(2 * size))) for dtype, size in SIZES.items()]
    write(os.path.join(target, "every_dtype.safetensors"),
          safetensors_bytes(sorted(every_dtype, key=lambda t: -SIZES[t[1]]), {"format": "pt"}))
    write(os.path.join(target, "empty_tensor.safetensors"),
          safetensors_bytes([("empty", "F32", [0, 4], b""), ("scalar", "F32", [], b"\x00\x00\x80\x3f")]))
    write(os.path.join(target, "no_tensors.safetensors"), safetensors_bytes([]))


def npy_bytes(descr, shape, raw, version=1, fortran=False):
    shape_text = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False",
                                                                      shape_text)
    length_bytes = 2 if version == 1 else 4
    preamble = 6 + 2 + length_bytes
    header += " " * ((64 - (preamble + len(header) + 1) % 64) % 64) + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode("latin1") + raw


def npy_seeds(out):
    target = os.path.join(out, "npy")
    descrs = {"<f4": 4, "<f8": 8, "<f2": 2, "<i8": 8, "<i4": 4, "<i2": 2, "|i1": 1, "|u1": 1, "|b1": 1}
    for descr, size in descrs.items():
        write(os.path.join(target, "v1_%s.npy" % descr[1:]), npy_bytes(descr, [2, 3], bytes(range(6 * size))))
    write(os.path.join(target, "v2_scalar.npy"), npy_bytes("<f4", [], b"\x00\x00\x80\x3f", version=2))
    write(os.path.join(target, "v3_empty.npy"), npy_bytes("<i8", [0, 5], b"", version=3))
    write(os.path.join(target, "rank4.npy"), npy_bytes("<f4", [1, 2, 1, 2], bytes(16)))


def config_seeds(fixtures, out):
    target = os.path.join(out, "model_config")
    for name in ("qwen_tiny/config.json", "qwen2.5-1.5b-instruct/config.json"):
        text = open(os.path.join(fixtures, name)).read()
        write(os.path.join(target, name.replace("/", "_")), text)
    base = json.load(open(os.path.join(fixtures, "qwen2.5-1.5b-instruct/config.json")))
    scalings = {
        "linear": {"type": "linear", "factor": 2.0},
        "dynamic": {"type": "dynamic", "factor": 2.0},
        "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192},
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.5},
    }
    for kind, scaling in scalings.items():
        config = dict(base, rope_scaling=scaling)
        write(os.path.join(target, "rope_%s.json" % kind), json.dumps(config))
    nested = dict(base, rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    nested.pop("rope_theta", None)
    write(os.path.join(target, "rope_per_attention.json"), json.dumps(nested))


def registry_spellings(ops_dir):
    spellings = set()
    for path in glob.glob(os.path.join(ops_dir, "*.cpp")):
        spellings.update(re.findall(r'"(aten\.[A-Za-z0-9_.]+)"', open(path).read()))
    return spellings


def byte_spelling(byte):
    """GPT-2's byte-level spelling: printable Latin-1 bytes stand for themselves, the others for U+0100 + rank."""
    printable = lambda b: 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE
    if printable(byte):
        return chr(byte)
    return chr(0x100 + sum(1 for b in range(byte) if not printable(b)))


def tokenizer_seeds(out):
    """Byte-level BPE tokenizer.json files in the Qwen2 and Llama 3 shapes, with a few merges."""
    spelled = lambda text: "".join(byte_spelling(b) for b in text.encode())
    qwen2_regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                   r"\s*[\r\n]+|\s+(?!\S)|\s+")
    llama3_regex = qwen2_regex.replace(r"\p{N}|", r"\p{N}{1,3}|")
    pairs = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (" ", "w"), ("o", "r"), (" w", "or"),
             ("l", "d"), (" wor", "ld"), ("i", "n"), ("1", "2")]
    vocab = {byte_spelling(b): b for b in range(256)}
    for left, right in pairs:
        vocab.setdefault(spelled(left + right), len(vocab))
    merges = [spelled(left) + " " + spelled(right) for left, right in pairs]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    added = [{"id": 300 + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, content in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    for name, regex, normalizer, post in [
        ("qwen2", qwen2_regex, {"type": "NFC"}, {"type": "ByteLevel", "add_prefix_space": False,
                                                "trim_offsets": False}),
        ("llama3", llama3_regex, None,
         {"type": "TemplateProcessing",
          "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
          "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [300], "tokens": ["<|endoftext|>"]}}}),
    ]:
        tokenizer = {
            "version": "1.0", "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}, byte_level]},
            "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": merges}}
        write(os.path.join(out, "tokenizer", name + ".json"), json.dumps(tokenizer, ensure_ascii=False))
        pairs = dict(tokenizer, model=dict(tokenizer["model"], merges=[m.split(" ") for m in merges]))
        write(os.path.join(out, "tokenizer", name + "_pair_merges.json"), json.dumps(pairs))


MODEL_DIR_SEPARATOR = b"\n==> next file <==\n"


def model_dir_seeds(fixtures, out):
    """Directories as fuzz_model_dir reads them: config, generation config, index, shard 1, shard 2."""
    target = os.path.join(out, "model_dir")
    config = open(os.path.join(fixtures, "qwen_tiny", "config.json"), "rb").read()
    generation = json.dumps({"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                             "eos_token_id": [2, 3], "bos_token_id": 1}).encode()
    header, data = read_safetensors(os.path.join(fixtures, "qwen_tiny", "model.safetensors"))
    entries = sorted((k, v) for k, v in header.items() if k != "__metadata__")
    small = []
    for key, entry in entries[:4]:
        begin = entry["data_offsets"][0]
        size = SIZES[entry["dtype"]]
        small.append((key, entry["dtype"], [1], data[begin:begin + size]))
    one_file = safetensors_bytes(small, {"format": "pt"})
    first, second = safetensors_bytes(small[:2]), safetensors_bytes(small[2:])
    index = json.dumps({"metadata": {"total_size": 8},
                        "weight_map": dict([(t[0], "model.safetensors") for t in small[:2]] +
                                           [(t[0], "model-00002-of-00002.safetensors") for t in small[2:]])}).encode()

    def seed(name, parts):
        write(os.path.join(target, name), MODEL_DIR_SEPARATOR.join(parts))

    seed("single_file", [config, generation, b"", one_file, b""])
    seed("sharded", [config, generation, index, first, second])
    seed("no_generation_config", [config, b"", b"", one_file, b""])


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    fixtures, out = sys.argv[1], sys.argv[2]
    dictionary = registry_spellings(sys.argv[3]) if len(sys.argv) == 4 else set()
    ir_seeds(fixtures, out, dictionary)
    safetensors_seeds(fixtures, out)
    npy_seeds(out)
    config_seeds(fixtures, out)
    tokenizer_seeds(out)
    model_dir_seeds(fixtures, out)
    lines = ['"%s"' % word.replace("\\", "\\\\").replace('"', '\\"') for word in sorted(dictionary)]
    write(os.path.join(out, "torch_ir.dict"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
