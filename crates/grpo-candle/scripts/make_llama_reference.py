#!/usr/bin/env python3
"""Build the Llama-family reference fixtures of grpo-candle (not part of CI).

Writes two tiny random checkpoints with ``transformers`` into ``crates/grpo-candle/tests/fixtures/``,
in the layout and with the ``reference.json`` of ``make_reference.py`` (whose tokenizer,
randomisation and reference computation it reuses):

* ``tiny-llama``: ``LlamaForCausalLM``, tied embeddings, q/k/v biases (``attention_bias``),
  Llama 3.1 rotary scaling (``rope_type: "llama3"``) with an original context (200) at which the
  four frequencies of a head fall one in the kept, one in the blended and two in the scaled band.
* ``tiny-mistral``: ``MistralForCausalLM``, untied lm_head, no biases, ``head_dim`` set apart from
  ``hidden_size / num_attention_heads``, no sliding window.

Usage (any Python with torch, transformers, safetensors and tokenizers; without them it makes the
same ``.venv`` as ``make_reference.py``):
    python3 crates/grpo-candle/scripts/make_llama_reference.py
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_reference as mr  # noqa: E402


def make(kind: str, out: Path) -> None:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    tokenizer = mr.build_tokenizer()
    vocab = ((len(tokenizer) + 63) // 64) * 64
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
    )
    if kind == "llama":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 200,
        }
        cfg = LlamaConfig(tie_word_embeddings=True, attention_bias=True, rope_parameters=rope, **common)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = MistralConfig(
            tie_word_embeddings=False, head_dim=16, sliding_window=None, rope_theta=10_000.0, **common
        )
        model = MistralForCausalLM(cfg)
    model = model.float().eval()
    model.config._attn_implementation = "eager"
    mr.randomize(model, seed=3 if kind == "llama" else 4)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*"):
        old.unlink()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # What is on disk must load back in transformers and give the reference.
    auto = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").float().eval()
    ref = mr.reference(auto, tokenizer)
    ref["torch"] = torch.__version__
    ref["transformers"] = transformers.__version__
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    files = sorted(p.name for p in out.iterdir())
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: {files} ({size} bytes), loss {ref['loss']:.6f}, grad norm {ref['grad_norm']:.6f}")


def main() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        mr.ensure_venv()
    make("llama", mr.FIXTURES / "tiny-llama")
    make("mistral", mr.FIXTURES / "tiny-mistral")


if __name__ == "__main__":
    main()
