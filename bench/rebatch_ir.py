"""Writes a copy of a torch_ir graph whose batch dimension is N instead of 1 (to benchmark batched throughput from
the batch-1 exports): the leading 1 of every graph input, graph output and node output becomes N, as do node inputs
that are produced by the graph (weights keep their shapes). Only for graphs whose batch is the leading dimension
of every activation, like the torchvision CNN exports; anything else is refused.

usage: python3 bench/rebatch_ir.py IN.json OUT.json N
"""
import json
import sys


def rebatch(meta, batch, where):
    shape = meta.get("shape")
    if not shape or shape[0] != 1:
        sys.exit(f"rebatch_ir: {where}: shape {shape} does not start with a batch of 1")
    meta["shape"] = [batch] + shape[1:]


def main():
    if len(sys.argv) != 4 or not sys.argv[3].isdigit() or int(sys.argv[3]) < 1:
        sys.exit(__doc__)
    source, target, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(source) as f:
        graph = json.load(f)
    for meta in graph["graph_inputs"]:
        rebatch(meta, batch, f"graph input {meta.get('name')}")
    for meta in graph["graph_outputs"]:
        rebatch(meta, batch, f"graph output {meta.get('name')}")
    for node in graph["nodes"]:
        for meta in node["outputs"]:
            rebatch(meta, batch, f"node {node['name']} output")
        for meta in node["inputs"]:
            if "producer_node" in meta:
                rebatch(meta, batch, f"node {node['name']} input {meta.get('name')}")
    with open(target, "w") as f:
        json.dump(graph, f)


if __name__ == "__main__":
    main()
