"""PyTorch peer of `examples/bench_train.rs`: the same Qwen3 shapes, f32 on the CPU, a
log_softmax + gather loss over every position, AdamW. Prints one JSON line.

Usage: python torch_peer.py tiny|mid [--steps N] [--warmup N] [--threads N] [--batch B] [--seq T]

The model is written out in plain torch (RMSNorm, rotary embeddings, grouped-query attention with
Qwen3's per-head q/k RMSNorm, SwiGLU MLP, tied embeddings) so that the comparison needs no
`transformers`; attention uses torch's fused scaled_dot_product_attention, as transformers' "sdpa"
path does.
"""

import argparse
import json
import resource
import statistics
import time

import torch
import torch.nn.functional as F

PRESETS = {
    # Must match `model_config` in examples/bench_train.rs.
    "tiny": dict(hidden=64, inter=192, layers=3, heads=4, kv=2, head_dim=16, vocab=700),
    "mid": dict(hidden=512, inter=1536, layers=8, heads=8, kv=4, head_dim=64, vocab=32000),
}


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        h, hd = c["hidden"], c["head_dim"]
        self.c = c
        self.q = torch.nn.Linear(h, c["heads"] * hd, bias=False)
        self.k = torch.nn.Linear(h, c["kv"] * hd, bias=False)
        self.v = torch.nn.Linear(h, c["kv"] * hd, bias=False)
        self.o = torch.nn.Linear(c["heads"] * hd, h, bias=False)
        self.q_norm = RMSNorm(hd)
        self.k_norm = RMSNorm(hd)
        self.in_norm = RMSNorm(h)
        self.post_norm = RMSNorm(h)
        self.gate = torch.nn.Linear(h, c["inter"], bias=False)
        self.up = torch.nn.Linear(h, c["inter"], bias=False)
        self.down = torch.nn.Linear(c["inter"], h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        c, hd = self.c, self.c["head_dim"]
        y = self.in_norm(x)
        q = self.q_norm(self.q(y).view(b, t, c["heads"], hd)).transpose(1, 2)
        k = self.k_norm(self.k(y).view(b, t, c["kv"], hd)).transpose(1, 2)
        v = self.v(y).view(b, t, c["kv"], hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = c["heads"] // c["kv"]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, c["heads"] * hd))
        y = self.post_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Qwen3(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = torch.nn.Embedding(c["vocab"], c["hidden"])
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = torch.nn.ModuleList([Layer(c) for _ in range(c["layers"])])
        self.norm = RMSNorm(c["hidden"])
        hd = c["head_dim"]
        self.register_buffer(
            "inv_freq", 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd)), persistent=False
        )

    def forward(self, ids):
        t = ids.shape[1]
        freqs = torch.outer(torch.arange(t, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x) @ self.embed.weight.t()  # tied lm_head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = PRESETS[a.preset]
    model = Qwen3(c)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    times, cpu_times = [], []
    for step in range(a.warmup + a.steps):
        ids = torch.randint(0, c["vocab"], (a.batch, a.seq + 1))
        t0, c0 = time.perf_counter(), time.process_time()
        logits = model(ids[:, :-1])
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -logp.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if step >= a.warmup:
            times.append(dt)
            cpu_times.append(dc)
    med = statistics.median(times)
    print(
        json.dumps(
            {
                "impl": "torch",
                "torch": torch.__version__,
                "torch_cpu": torch.backends.cpu.get_cpu_capability(),
                "preset": a.preset,
                "threads": torch.get_num_threads(),
                "batch": a.batch,
                "seq": a.seq,
                "params": sum(p.numel() for p in model.parameters()),
                "step_seconds_median": med,
                "step_cpu_seconds_median": statistics.median(cpu_times),
                "tokens_per_s": a.batch * a.seq / med,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
