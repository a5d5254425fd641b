#!/usr/bin/env python3
"""Turns a run_all.sh results directory into markdown tables, one per model.

    format_results.py RESULTS_DIR

Reads machine.txt, commands.tsv and MODEL.RUNNER.jsonl (one JSON object per line). The ratio columns are always
npusim's time over the peer's at the same thread count, best run against best run (the machine may be shared):
above 1 means npusim is slower. Where the rows carry the round they ran in, the median of the rounds' own ratios
follows (each round's npusim against the same round's peer).
"""
import json
import os
import statistics
import sys

RESNET_RUNNERS = ["npusim", "onnxruntime", "pytorch"]


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as file:
        return [json.loads(line) for line in file if line.startswith("{")]


def best_rounds(rows, time_key):
    """One row per thread count: the round with the smallest `time_key`."""
    best = {}
    for row in rows:
        kept = best.get(row["threads"])
        if kept is None or row[time_key] < kept[time_key]:
            best[row["threads"]] = row
    return [best[threads] for threads in sorted(best)]


def median_of_rounds(ours, theirs):
    """The median over the rounds both dicts (round -> time) hold of ours / theirs, as text ("" without rounds)."""
    ratios = [ours[r] / theirs[r] for r in ours if r in theirs and theirs[r] > 0]
    return f"{statistics.median(ratios):.2f}" if ratios else ""


def by_round(rows, threads, key):
    """round -> the smallest `key` of the rows with that thread count and a round."""
    out = {}
    for row in rows:
        if row.get("threads") == threads and "round" in row:
            out[row["round"]] = min(row[key], out.get(row["round"], float("inf")))
    return out


def read_commands(results):
    commands = {}
    path = os.path.join(results, "commands.tsv")
    if os.path.exists(path):
        with open(path) as file:
            for line in file:
                model, command = line.rstrip("\n").split("\t", 1)
                commands.setdefault(model, []).append(command)
    return commands


def resnet_table(results, model):
    all_rows = {runner: read_jsonl(os.path.join(results, f"{model}.{runner}.jsonl")) for runner in RESNET_RUNNERS}
    rows = {runner: best_rounds(all_rows[runner], "min_ms") for runner in RESNET_RUNNERS}
    if not any(rows.values()):
        return None
    npusim = {row["threads"]: row["min_ms"] for row in rows["npusim"]}
    lines = [
        f"| {model} batch 1, fp32 | threads | min ms | median ms | max ms | npusim/peer (min time) | "
        "median of rounds |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for runner in RESNET_RUNNERS:
        for row in rows[runner]:
            threads = row["threads"]
            ratio = rounds = ""
            if runner != "npusim" and threads in npusim:
                ratio = f"{npusim[threads] / row['min_ms']:.2f}"
                rounds = median_of_rounds(by_round(all_rows["npusim"], threads, "min_ms"),
                                          by_round(all_rows[runner], threads, "min_ms"))
            name = runner
            if runner != "npusim" and "version" in row:
                name += f" {row['version']}"
            lines.append(f"| {name} | {threads} | {row['min_ms']:.1f} | {row['median_ms']:.1f} | "
                         f"{row['max_ms']:.1f} | {ratio} | {rounds} |")
    lines.append("")
    verify = os.path.join(results, f"{model}.verify.txt")
    if os.path.exists(verify):
        with open(verify) as file:
            lines.append(f"npusim's logits against PyTorch's: `{' '.join(file.read().split())}`.")
    notes = [row for row in read_jsonl(os.path.join(results, f"{model}.onnxruntime.jsonl")) if "max_abs_diff" in row]
    if notes:
        lines.append(f"ONNX Runtime's logits differ from PyTorch's by at most {max(r['max_abs_diff'] for r in notes):.2g}.")
    return lines


def startup_table(results, model):
    """npusim run's start-up beyond its first result's run against ONNX Runtime's session creation, per thread count."""
    runs = read_jsonl(os.path.join(results, f"{model}.startup.jsonl"))
    if not runs:
        return None
    ort = {}
    for row in read_jsonl(os.path.join(results, f"{model}.onnxruntime.jsonl")):
        if "create_ms" in row:
            ort[row["threads"]] = min(row["create_ms"], ort.get(row["threads"], float("inf")))
    lines = [
        f"| {model} start-up, beyond the first result's run | threads | processes | npusim min ms | "
        "npusim median ms | prepare ms (min) | ONNX Runtime session creation ms (min) | target |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    kinds = [("off", "packing every run (`--pack-cache off`)"), ("first", "first run, packs and keeps the weights"),
             ("mapped", "later runs, weights mapped from the pack cache")]
    for threads in sorted({row["threads"] for row in runs}):
        for cache, label in kinds:
            # Files from before the pack cache had a default packed every run and carry no "cache".
            rows = [row for row in runs if row["threads"] == threads and row.get("cache", "off") == cache]
            if not rows:
                continue
            beyond = sorted(row["beyond_ms"] for row in rows)
            prepare = min(row["prepare_ms"] for row in rows)
            creation = f"{ort[threads]:.1f}" if threads in ort else ""
            lines.append(f"| npusim run, {label} | {threads} | {len(beyond)} | {beyond[0]:.1f} | "
                         f"{beyond[len(beyond) // 2]:.1f} | {prepare:.1f} | {creation} | < 100 ms |")
    lines.append("")
    lines.append("Start-up: from the process's start to its first result, less that result's run (npusim run "
                 "--iters 1 reports both); prepare is the part spent packing the weights for the kernels (or "
                 "mapping them from the pack cache).")
    return lines


LLM_SHAPES = {"qwen15": "Qwen2.5-1.5B", "qwen05": "Qwen2.5-0.5B"}


def llama_rows(results, model):
    """(weights, threads) -> {"prompt": tok/s samples, "decode": tok/s samples} from llama-bench jsonl."""
    rows = {}
    for row in read_jsonl(os.path.join(results, f"{model}.llama.cpp.jsonl")):
        weights = row["model_type"].split()[-1]  # "qwen2 1.5B F16" -> F16
        entry = rows.setdefault((weights, row["n_threads"]), {})
        kind = "prompt" if row["n_prompt"] > 0 else "decode"
        entry.setdefault(kind, []).extend(row["samples_ts"])
        entry["size_gb"] = row["model_size"] / 1e9
        if "round" in row:  # seconds a token in that round, at its best
            per_round = entry.setdefault(kind + "_rounds", {})
            per_round[row["round"]] = min(1 / max(row["samples_ts"]), per_round.get(row["round"], float("inf")))
    return rows


def linear_weights(row):
    """The form npusim read its linear weights in (older results lack the field)."""
    if "linear_weights" in row:
        return row["linear_weights"]
    return "int8" if "int8 linear weights" in row.get("session", "") else row["dtype"]


def llm_table(results, model):
    npusim_rows = read_jsonl(os.path.join(results, f"{model}.npusim.jsonl"))
    for row in npusim_rows:
        row["decode_rate"] = row["decode_run_min_ms"] / max(1, row["gen_tokens"])
    peers = llama_rows(results, model)
    if not npusim_rows and not peers:
        return None
    prompt = npusim_rows[0]["prompt_tokens"] if npusim_rows else "?"
    gen = npusim_rows[0]["gen_tokens"] if npusim_rows else "?"
    lines = [
        f"| {LLM_SHAPES[model]} shape (random weights), prompt {prompt} + decode {gen}, best run | weights | threads | "
        "prompt tok/s | decode tok/s | decode GB/s | npusim/peer prompt time | npusim/peer decode time | "
        "median of rounds: prompt / decode |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    npusim = {}  # (int8 or not, threads) -> best tok/s
    npusim_rounds = {}  # (int8 or not, threads) -> {"prompt": {round: s a token}, "decode": {...}}
    for row in npusim_rows:
        if "round" not in row:
            continue
        entry = npusim_rounds.setdefault((linear_weights(row) == "int8", row["threads"]), {})
        for kind, seconds in (("prompt", row["prompt_min_ms"] / 1e3 / row["prompt_tokens"]),
                              ("decode", row["decode_rate"] / 1e3)):
            entry.setdefault(kind, {})[row["round"]] = min(seconds, entry.get(kind, {}).get(row["round"], 1e9))
    for quantized in (False, True):
        rows = [row for row in npusim_rows if (linear_weights(row) == "int8") == quantized]
        prompt_best = {row["threads"]: row["prompt_min_ms"] for row in best_rounds(rows, "prompt_min_ms")}
        for row in best_rounds(rows, "decode_rate"):
            best = {"prompt": row["prompt_tokens"] / (prompt_best[row["threads"]] / 1e3),
                    "decode": row["gen_tokens"] / (row["decode_run_min_ms"] / 1e3)}
            npusim[(quantized, row["threads"])] = best
            # decode_gbps is one median step's bytes over its time: those bytes per token at the best run's rate.
            gbps = row["decode_gbps"] * row["median_ms"] / 1e3 * best["decode"]
            lines.append(f"| npusim | {linear_weights(row)} | {row['threads']} | {best['prompt']:.1f} | "
                         f"{best['decode']:.2f} | {gbps:.1f} | | | |")
    for (weights, threads), entry in sorted(peers.items(), key=lambda item: (item[0][1], item[0][0])):
        prompt_ts = max(entry.get("prompt", [float("nan")]))
        decode_ts = max(entry.get("decode", [float("nan")]))
        gbps = entry["size_gb"] * decode_ts
        base = npusim.get((weights.upper() == "Q8_0", threads))
        prompt_ratio = f"{prompt_ts / base['prompt']:.2f}" if base else ""
        decode_ratio = f"{decode_ts / base['decode']:.2f}" if base else ""
        ours = npusim_rounds.get((weights.upper() == "Q8_0", threads), {})
        rounds = [median_of_rounds(ours.get(kind, {}), entry.get(kind + "_rounds", {})) for kind in ("prompt", "decode")]
        lines.append(f"| llama.cpp llama-bench | {weights} | {threads} | {prompt_ts:.1f} | {decode_ts:.2f} | "
                     f"{gbps:.1f} | {prompt_ratio} | {decode_ratio} | {' / '.join(rounds) if any(rounds) else ''} |")
    lines.append("")
    lines.append("llama.cpp's decode GB/s is its file size times tokens/s; npusim's counts the weights and the KV cache "
                 "it reads. Q8_0 rows are set against npusim with int8 weights, the others against npusim's bf16.")
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: format_results.py RESULTS_DIR")
    results = sys.argv[1]
    with open(os.path.join(results, "machine.txt")) as file:
        machine = [line.rstrip("\n") for line in file if not line.startswith("probe:")]
    commands = read_commands(results)
    tables = [("resnet18", resnet_table(results, "resnet18")), ("resnet50", resnet_table(results, "resnet50")),
              ("resnet50", startup_table(results, "resnet50")),
              ("mobilenet_v2", resnet_table(results, "mobilenet_v2"))]
    tables += [(model, llm_table(results, model)) for model in LLM_SHAPES]
    for model, lines in tables:
        if lines is None:
            continue
        print("\n".join(lines))
        print()
        print("; ".join(machine))
        print()
        print("```")
        print("\n".join(commands.get(model, [])))
        print("```")
        print()


if __name__ == "__main__":
    main()
