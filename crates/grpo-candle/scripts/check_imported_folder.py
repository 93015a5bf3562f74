#!/usr/bin/env python3
"""Check that transformers loads a folder written by grpo-candle's GGUF import and that it is the
model of the GGUF file (not part of CI).

The fixture ``tests/fixtures/smollm2-135m-instruct.json`` holds what transformers computed from
the GGUF file itself (``smollm2_reference.py``). This script loads the *imported* folder with
``AutoModelForCausalLM`` / ``AutoTokenizer`` (its ``config.json``, ``model.safetensors`` and
``tokenizer.json``, nothing from the GGUF file) and compares: token ids of every fixture text,
per-token log-probs (worst absolute difference), the chat template's rendering, and the greedy
continuation. Exit status 1 on a mismatch.

Usage (any Python with torch and transformers):
    cargo run --release -p grpo-candle --example import_gguf -- \
        SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smol f32
    python3 crates/grpo-candle/scripts/check_imported_folder.py /tmp/smol
"""

import json
import sys
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "smollm2-135m-instruct.json"


def main():
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = sys.argv[1]
    ref = json.loads(FIXTURE.read_text())
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ok = True

    same = 0
    for t in ref["tokenize"]:
        ids = tok(t["text"], add_special_tokens=False)["input_ids"]
        if ids == t["token_ids"]:
            same += 1
        else:
            ok = False
            print(f"tokenize {t['name']}: differs", file=sys.stderr)
    print(f"tokenize: {same}/{len(ref['tokenize'])} texts identical")

    worst = 0.0
    with torch.inference_mode():
        for t in ref["logprobs"]:
            ids = torch.tensor([t["token_ids"]])
            logits = model(input_ids=ids).logits[0, :-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            d = (lp - torch.tensor(t["logprobs"])).abs().max().item()
            worst = max(worst, d)
    print(f"log-probs: worst |folder - gguf| {worst:.2e} over {len(ref['logprobs'])} texts")
    ok &= worst < 1e-3

    chat = ref["chat"]
    rendered = tok.apply_chat_template(chat["messages"], tokenize=False, add_generation_prompt=True)
    print(f"chat template: {'identical' if rendered == chat['rendered'] else 'differs'}")
    ok &= rendered == chat["rendered"]
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([chat["prompt_ids"]]),
            max_new_tokens=len(chat["greedy_ids"]),
            min_new_tokens=len(chat["greedy_ids"]),
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(chat["prompt_ids"]):].tolist()
    agree = next((i for i, (a, b) in enumerate(zip(out, chat["greedy_ids"])) if a != b), len(out))
    print(f"greedy: {agree}/{len(chat['greedy_ids'])} tokens identical")
    ok &= agree == len(chat["greedy_ids"])
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {'OK' if ok else 'MISMATCH'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
