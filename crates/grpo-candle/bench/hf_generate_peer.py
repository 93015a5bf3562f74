"""transformers `generate` on the shapes of bench_sample and bench_replay (the peer of
compare_generate.sh).

    python hf_generate_peer.py sample [--hidden 512] [--layers 8] [--heads 8] [--kv-heads 4]
        [--vocab 32000] [--batch 8] [--prompt 256] [--new 128] [--reps 3] [--threads 2]
    python hf_generate_peer.py replay SHAPES.json [model flags] [--threads 2]
    python hf_generate_peer.py train --model DIR [--batch 4] [--seq 512] [--steps 3] [--threads 2]

`--model DIR` (sample, replay, train) loads a Hugging Face checkpoint folder with
`AutoModelForCausalLM` in f32 instead of building a random Qwen3; `train` is the peer of
`bench_train --model`: forward, log_softmax + gather loss over every position, backward, gradient
clipping at 1 and AdamW, on random token ids, median seconds of the timed steps.

A random Qwen3 (transformers' Qwen3ForCausalLM, f32, CPU, tied embeddings, q/k norms) with the
same shape as the Rust benchmark's. `sample`: prefill tokens/s (a call generating one token) and
decode tokens/s (the rest of a call generating `--new`; each the median of `--reps` calls), batch of `--batch` prompts, sampling
at temperature 1 over the full vocabulary, no end-of-sequence token. `replay`: SHAPES.json is
what `bench_replay --dump-shapes` writes: per batch (the rollouts of one task at one turn) the
prompt token ids of each row and the tokens each generated; every batch is one left-padded
`generate` call of the batch's longest generation (transformers keeps no cache across calls, so
each turn prefills its whole context). Prints one JSON line.
"""

import json
import statistics
import sys
import time


def arg(args, name, default, cast=int):
    if name in args:
        return cast(args[args.index(name) + 1])
    return default


def build(args):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if "--model" in args:
        model = AutoModelForCausalLM.from_pretrained(
            args[args.index("--model") + 1], dtype=torch.float32
        ).eval()
        return model, model.config

    hidden = arg(args, "--hidden", 512)
    heads = arg(args, "--heads", 8)
    config = Qwen3Config(
        vocab_size=arg(args, "--vocab", 32000),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=arg(args, "--layers", 8),
        num_attention_heads=heads,
        num_key_value_heads=arg(args, "--kv-heads", 4),
        head_dim=hidden // heads,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    return model, config


def generate(model, ids, mask, new):
    import torch

    with torch.inference_mode():
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            eos_token_id=None,
            pad_token_id=0,
        )


def sample(args):
    import torch
    import transformers

    model, config = build(args)
    batch, prompt, new = arg(args, "--batch", 8), arg(args, "--prompt", 256), arg(args, "--new", 128)
    ids = torch.tensor(
        [[(i * 7919) % config.vocab_size for i in range(b * prompt, (b + 1) * prompt)] for b in range(batch)]
    )
    mask = torch.ones_like(ids)
    reps = max(arg(args, "--reps", 3), 1)

    def timed(n):
        t = time.perf_counter()
        generate(model, ids, mask, n)
        return time.perf_counter() - t

    generate(model, ids, mask, 1)  # warm up
    # The median of `reps` runs each, as bench_sample does.
    prefill = statistics.median(timed(1) for _ in range(reps))
    total = statistics.median(timed(new) for _ in range(reps))
    decode = max(total - prefill, 1e-9)
    print(json.dumps({
        "peer": "transformers", "transformers": transformers.__version__,
        "torch": torch.__version__, "torch_cpu": torch.backends.cpu.get_cpu_capability(),
        "batch": batch, "prompt": prompt, "new": new, "reps": reps,
        "prefill_s": prefill, "prefill_tokens_per_s": batch * prompt / prefill,
        "decode_s": decode, "decode_tokens_per_s": batch * (new - 1) / decode,
    }))


def replay(args):
    import torch

    with open(args[0]) as f:
        shapes = json.load(f)
    model, config = build(args[1:])
    generated = 0
    prefill_tokens = 0
    started = time.perf_counter()
    for b in shapes["batches"]:
        rows = b["prompts"]
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        new = max(b["generated"])
        if new > 0:
            generate(model, ids, mask, new)
        generated += sum(b["generated"])
        prefill_tokens += sum(len(r) for r in rows)
    seconds = time.perf_counter() - started
    print(json.dumps({
        "mode": "transformers", "seconds": seconds, "episodes": shapes["episodes"],
        "episodes_per_s": shapes["episodes"] / seconds,
        "policy_tokens_per_s": generated / seconds,
        "prefill_tokens_computed": prefill_tokens,
    }))


def train(args):
    import resource
    import statistics

    import torch

    model, config = build(args)
    model.train()
    batch, seq = arg(args, "--batch", 4), arg(args, "--seq", 512)
    steps, warmup = arg(args, "--steps", 3), arg(args, "--warmup", 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    torch.manual_seed(0)
    times = []
    for step in range(warmup + steps):
        ids = torch.randint(0, config.vocab_size, (batch, seq + 1))
        t0 = time.perf_counter()
        logits = model(input_ids=ids[:, :-1]).logits
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -logp.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        print(f"step {step}: {dt:.3f} s, loss {loss.item():.5f}", file=sys.stderr)
        if step >= warmup:
            times.append(dt)
    med = statistics.median(times)
    print(json.dumps({
        "peer": "transformers", "batch": batch, "seq": seq,
        "params": sum(p.numel() for p in model.parameters()),
        "step_seconds_median": med, "tokens_per_s": batch * seq / med,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


def main():
    import torch

    args = sys.argv[1:]
    torch.set_num_threads(arg(args, "--threads", 2))
    if args and args[0] == "sample":
        sample(args[1:])
    elif args and args[0] == "replay":
        replay(args[1:])
    elif args and args[0] == "train":
        train(args[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
