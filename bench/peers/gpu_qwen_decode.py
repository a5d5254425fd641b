"""Qwen2.5-1.5B-shaped bf16 greedy decode on the GPU with transformers (random init, static KV cache, the step
captured as a CUDA graph by torch.compile(mode="reduce-overhead") when --compile is given).

usage: python3 bench/peers/gpu_qwen_decode.py [--compile] [--context 128]
"""
import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, StaticCache


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    config = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    max_length = args.context + args.tokens + 8
    cache = StaticCache(config=config, max_batch_size=1, max_cache_len=max_length, device="cuda",
                        dtype=torch.bfloat16)
    step = model.forward
    if args.compile:
        step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    ids = torch.randint(0, config.vocab_size, (1, args.context), device="cuda")
    with torch.inference_mode():
        positions = torch.arange(args.context, device="cuda")
        prefill_times = []
        for _ in range(5):  # the prompt, eager, logits of the last position only (time to first token)
            cache.reset()
            torch.cuda.synchronize()
            start = time.perf_counter()
            logits = model(ids, past_key_values=cache, cache_position=positions, use_cache=True,
                           logits_to_keep=1).logits
            token = logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            prefill_times.append((time.perf_counter() - start) * 1000)
        prefill_ms = sorted(prefill_times)[len(prefill_times) // 2]

        def decode(position):
            nonlocal token
            pos = torch.tensor([position], device="cuda")
            out = step(token, past_key_values=cache, cache_position=pos, position_ids=pos[None], use_cache=True)
            token = out.logits[:, -1:].argmax(-1).clone()

        for i in range(8):  # warm-up (and compilation)
            decode(args.context + i)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(8, 8 + args.tokens):
            decode(args.context + i)
        torch.cuda.synchronize()
        per_token = (time.perf_counter() - start) / args.tokens * 1000
    mode = "torch.compile reduce-overhead" if args.compile else "eager"
    print(f"PEER qwen2.5-1.5b-shape bf16 prefill of {args.context} tokens transformers eager: {prefill_ms:.3f} ms "
          f"(median of 5, last-token logits)")
    print(f"PEER qwen2.5-1.5b-shape bf16 decode at context {args.context} transformers {mode}: "
          f"{per_token:.3f} ms/token = {1000 / per_token:.1f} tok/s ({torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
