#!/usr/bin/env python3
"""Build the PyTorch reference fixtures of grpo-candle (not part of CI).

Creates a virtualenv beside this script (``.venv``) with torch (CPU use only) and transformers
from PyPI, then writes two tiny random checkpoints with ``transformers`` into
``crates/grpo-candle/tests/fixtures/``:

* ``tiny-qwen3``: Qwen3, tied embeddings, config as this transformers version writes it,
  one ``model.safetensors``.
* ``tiny-qwen2``: Qwen2 (q/k/v biases), untied lm_head, config rewritten in the older hub
  style (``rope_theta`` and ``torch_dtype`` at the top level), weights sharded with
  ``model.safetensors.index.json``.

Each folder gets a ``tokenizer.json`` (a small byte-level BPE trained here) and a
``reference.json``: the token ids of a fixed text, PyTorch's log-prob of every token after the
first, the mean negative log-likelihood of those tokens and the global L2 norm of its gradient
over all parameters (a tied matrix counted once).

Usage:
    python3 crates/grpo-candle/scripts/make_reference.py            # write the fixtures
    python3 crates/grpo-candle/scripts/make_reference.py --chat-template DIR
        # render fixed conversations with the chat template saved in DIR/tokenizer_config.json
        # (e.g. by `cargo run -p grpo-candle --example tiny_policy -- DIR`) through transformers'
        # apply_chat_template, into tests/fixtures/chat_template_reference.json
    python3 crates/grpo-candle/scripts/make_reference.py --check DIR TEXT
        # print per-token log-probs of TEXT under the HF checkpoint DIR (e.g. one saved by
        # grpo-candle's `save_hf`), in the JSON shape of the `logprobs` example
"""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"
FIXTURES = HERE.parent / "tests" / "fixtures"
TEXT = (
    "The agent calls <tool_call>\n{\"name\": \"execute_sql\", \"arguments\": "
    "{\"query\": \"SELECT count(*) FROM users\"}}\n</tool_call> and reads 42 rows."
)
CORPUS = [
    "You are a helpful assistant. Use the tools to solve the task, then answer.",
    "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"the answer\"}}\n</tool_call>",
    "SELECT name, count(*) FROM users WHERE id = 1 GROUP BY name;",
    "The result of the call is in the table; read the rows and give the final answer.",
    "def test_function(): return the value of the input and the result",
]


def ensure_venv() -> None:
    """Re-run this script inside .venv, creating it and installing the packages when needed."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
        subprocess.check_call([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    # Installing is a no-op when they are present.
    subprocess.check_call(
        [str(python), "-m", "pip", "install", "-q", "torch", "transformers", "safetensors", "tokenizers"]
    )
    os.execv(str(python), [str(python), __file__, *sys.argv[1:]])


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def randomize(model, seed: int) -> None:
    """Random weights everywhere, norms and biases included, so every parameter matters."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def reference(model, tokenizer) -> dict:
    import torch

    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids])
    model.zero_grad()
    logits = model(input_ids=x).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    target = x[0, 1:]
    chosen = logp.gather(1, target[:, None])[:, 0]
    loss = -chosen.mean()
    loss.backward()
    seen, sq = set(), 0.0
    for p in model.parameters():
        if id(p) in seen or p.grad is None:
            continue
        seen.add(id(p))
        sq += float(p.grad.double().pow(2).sum())
    return {
        "text": TEXT,
        "token_ids": ids,
        "tokens": tokenizer.convert_ids_to_tokens(ids),
        "logprobs": [float(v) for v in chosen.detach()],
        "loss": float(loss.detach()),
        "grad_norm": sq**0.5,
    }


def make(arch: str, out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    vocab = ((len(tokenizer) + 63) // 64) * 64
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
    )
    if arch == "qwen3":
        cfg = Qwen3Config(head_dim=8, tie_word_embeddings=True, rope_theta=1_000_000.0, **common)
        model = Qwen3ForCausalLM(cfg)
    else:
        cfg = Qwen2Config(tie_word_embeddings=False, rope_theta=10_000.0, **common)
        model = Qwen2ForCausalLM(cfg)
    model = model.float().eval()
    model.config._attn_implementation = "eager"
    randomize(model, seed=1 if arch == "qwen3" else 2)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*"):
        old.unlink()
    shard = "40KB" if arch == "qwen2" else "50MB"
    model.save_pretrained(out, safe_serialization=True, max_shard_size=shard)
    tokenizer.save_pretrained(out)
    if arch == "qwen2":
        # The older hub style of config.json.
        path = out / "config.json"
        c = json.loads(path.read_text())
        rope = c.pop("rope_parameters", None) or {}
        c["rope_theta"] = rope.get("rope_theta", c.get("rope_theta", 10_000.0))
        c["rope_scaling"] = None
        c["torch_dtype"] = c.pop("dtype", "float32")
        path.write_text(json.dumps(c, indent=2) + "\n")
        # It must still load in transformers.
        reloaded = Qwen2ForCausalLM.from_pretrained(out, attn_implementation="eager").float().eval()
        model = reloaded
    ref = reference(model, tokenizer)
    ref["torch"] = torch.__version__
    import transformers

    ref["transformers"] = transformers.__version__
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    files = sorted(p.name for p in out.iterdir())
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: {files} ({size} bytes), loss {ref['loss']:.6f}, grad norm {ref['grad_norm']:.6f}")


def check(model_dir: str, text: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").float().eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    out = []
    for i, t in enumerate(ids[1:]):
        out.append({"token_id": t, "token": tok.convert_ids_to_tokens(t), "logprob": float(logp[i, t])})
    print(json.dumps(out))


def chat_template_reference(model_dir: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    system = {"role": "system", "content": "Solve the task. Be brief."}
    user = {"role": "user", "content": "How many users are there? (ünïcode ✓)"}
    call = {
        "role": "assistant",
        "content": "<tool_call>\n{\"name\": \"execute_sql\", \"arguments\": "
        "{\"query\": \"SELECT count(*) FROM users\"}}\n</tool_call>",
    }
    tool1 = {"role": "tool", "content": "[[3]]"}
    tool2 = {"role": "tool", "content": "{\"status\": \"ok\"}"}
    answer = {"role": "assistant", "content": "There are 3 users."}
    follow = {"role": "user", "content": "Thanks!"}
    # Keys sorted, as serde_json (without preserve_order) writes them on the Rust side.
    tools = [
        {
            "type": "function",
            "function": {
                "name": "execute_sql",
                "description": "Run one \"SQL\" statement.",
                "parameters": {
                    "properties": {"query": {"description": "SQL", "type": "string"}},
                    "required": ["query"],
                    "type": "object",
                },
            },
        },
        {
            "type": "function",
            "function": {"name": "finish", "description": "Submit.", "parameters": {"type": "object"}},
        },
    ]
    conversations = [
        [system, user, call, tool1, tool2, answer, follow],
        [user, call, tool1],
        [system, user],
        [user],
    ]
    cases = []
    for messages in conversations:
        for with_tools in (True, False):
            for generation in (True, False):
                rendered = tok.apply_chat_template(
                    messages,
                    tools=tools if with_tools else None,
                    tokenize=False,
                    add_generation_prompt=generation,
                )
                cases.append(
                    {
                        "messages": messages,
                        "tools": tools if with_tools else [],
                        "add_generation_prompt": generation,
                        "rendered": rendered,
                        "token_ids": tok(rendered, add_special_tokens=False)["input_ids"],
                    }
                )
    chat_template = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())["chat_template"]
    out = FIXTURES / "chat_template_reference.json"
    import transformers

    out.write_text(
        json.dumps(
            {"transformers": transformers.__version__, "chat_template": chat_template, "cases": cases},
            indent=1,
            ensure_ascii=False,
        )
        + "\n"
    )
    print(f"{out}: {len(cases)} cases")


def main() -> None:
    ensure_venv()
    import torch

    torch.set_num_threads(2)
    if len(sys.argv) >= 2 and sys.argv[1] == "--check":
        check(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) >= 2 and sys.argv[1] == "--chat-template":
        chat_template_reference(sys.argv[2])
        return
    make("qwen3", FIXTURES / "tiny-qwen3")
    make("qwen2", FIXTURES / "tiny-qwen2")


if __name__ == "__main__":
    main()
