#!/usr/bin/env bash
# Rollout speed of grpo-candle's sampler vs transformers' `generate`, on the same shapes, back to
# back in one run:
#
#   crates/grpo-candle/bench/compare_generate.sh sample                 # bench_sample shapes
#   crates/grpo-candle/bench/compare_generate.sh replay TRAJECTORIES    # recorded episodes
#   crates/grpo-candle/bench/compare_generate.sh model DIR              # a real checkpoint
#
# `sample`: a random Qwen3 of hidden 512, 8 layers, vocab 32k, batch 8, prompt 256, 128 new tokens
# (the shapes of issue 16); prefill and decode tokens/s on both sides and their ratios.
# `replay`: `bench_replay --trajectories` (K = 8 rollouts per task, with and without the prefix
# cache) and `hf_generate_peer.py replay` on the batches it dumps; episodes/s, policy tokens/s
# and prefill tokens computed, as ratios.
# `model`: a Hugging Face checkpoint folder (e.g. SmolLM2-135M-Instruct imported from GGUF by
# `examples/import_gguf.rs`) loaded by both sides: sampling at batch 8, prompt 512, 128 new
# tokens, and training steps of batch 4 x 512 (bench_train --model vs transformers forward,
# backward and AdamW); tokens/s and ratios.
#
# PYTHON: an interpreter with torch and transformers (default /work/venv-hf/bin/python). Extra
# arguments after the mode go to both sides (model shape flags such as `--hidden 512`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
what="${1:-sample}"
shift || true
threads="${THREADS:-2}"
python="${PYTHON:-/work/venv-hf/bin/python}"

cd "$root"
cargo build --release -q -p grpo-candle --example bench_sample --example bench_replay --example bench_train
bin="${CARGO_TARGET_DIR:-$root/target}/release/examples"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"

case "$what" in
  sample)
    ours="$(MIMALLOC_PURGE_DELAY=-1 RAYON_NUM_THREADS=$threads "$bin/bench_sample" "$@")"
    echo "$ours"
    theirs="$("$python" "$here/hf_generate_peer.py" sample --threads "$threads" "$@")"
    echo "$theirs"
    python3 - "$ours" "$theirs" <<'PY'
import json, sys
o, t = (json.loads(a) for a in sys.argv[1:3])
print(f"SUMMARY sample batch {o['batch']} prompt {o['prompt']} new {o['new']}: "
      f"prefill {o['prefill_tokens_per_s']:.0f} vs {t['prefill_tokens_per_s']:.0f} tok/s "
      f"({o['prefill_tokens_per_s']/t['prefill_tokens_per_s']:.2f}x); "
      f"decode {o['decode_tokens_per_s']:.0f} vs {t['decode_tokens_per_s']:.0f} tok/s "
      f"({o['decode_tokens_per_s']/t['decode_tokens_per_s']:.2f}x)")
PY
    ;;
  replay)
    file="${1:?usage: $0 replay TRAJECTORIES [model flags]}"
    shift
    shapes="$(mktemp --suffix .json)"
    ours="$(MIMALLOC_PURGE_DELAY=-1 RAYON_NUM_THREADS=$threads "$bin/bench_replay" --trajectories "$file" --dump-shapes "$shapes" "$@")"
    echo "$ours"
    theirs="$("$python" "$here/hf_generate_peer.py" replay "$shapes" --threads "$threads" "$@")"
    echo "$theirs"
    rm -f "$shapes"
    python3 - "$ours" "$theirs" <<'PY'
import json, sys
lines = [json.loads(l) for l in sys.argv[1].splitlines() if l.startswith("{")]
modes = {l["mode"]: l for l in lines}
t = json.loads(sys.argv[2])
u, c = modes["uncached"], modes["cached"]
def r(a, b):
    return a / b if b else float("nan")
print(f"SUMMARY replay: episodes/s cached {c['episodes_per_s']:.3f}, uncached {u['episodes_per_s']:.3f}, "
      f"transformers {t['episodes_per_s']:.3f} (cached/uncached {r(c['episodes_per_s'], u['episodes_per_s']):.2f}x, "
      f"cached/transformers {r(c['episodes_per_s'], t['episodes_per_s']):.2f}x, "
      f"uncached/transformers {r(u['episodes_per_s'], t['episodes_per_s']):.2f}x); "
      f"policy tok/s {c['policy_tokens_per_s']:.0f} / {u['policy_tokens_per_s']:.0f} / {t['policy_tokens_per_s']:.0f}; "
      f"prefill tokens computed {c['prefill_tokens_computed']} / {u['prefill_tokens_computed']} / {t['prefill_tokens_computed']}")
PY
    ;;
  model)
    dir="${1:?usage: $0 model DIR}"
    shift
    ours="$(MIMALLOC_PURGE_DELAY=-1 RAYON_NUM_THREADS=$threads "$bin/bench_sample" --model "$dir" --batch 8 --prompt 512 --new 128 "$@")"
    echo "$ours"
    theirs="$("$python" "$here/hf_generate_peer.py" sample --model "$dir" --batch 8 --prompt 512 --new 128 --threads "$threads" "$@")"
    echo "$theirs"
    ours_t="$(MIMALLOC_PURGE_DELAY=-1 RAYON_NUM_THREADS=$threads CANDLE_NUM_THREADS=1 "$bin/bench_train" --model "$dir" --batch 4 --seq 512 --steps 3 --warmup 1)"
    echo "$ours_t"
    theirs_t="$("$python" "$here/hf_generate_peer.py" train --model "$dir" --batch 4 --seq 512 --steps 3 --threads "$threads")"
    echo "$theirs_t"
    python3 - "$ours" "$theirs" "$ours_t" "$theirs_t" <<'PY'
import json, sys
o, t, ot, tt = (json.loads(a) for a in sys.argv[1:5])
print(f"SUMMARY model {o['params']} params: sample batch 8 prompt 512 new 128: "
      f"prefill {o['prefill_tokens_per_s']:.0f} vs {t['prefill_tokens_per_s']:.0f} tok/s "
      f"({o['prefill_tokens_per_s']/t['prefill_tokens_per_s']:.2f}x), "
      f"decode {o['decode_tokens_per_s']:.1f} vs {t['decode_tokens_per_s']:.1f} tok/s "
      f"({o['decode_tokens_per_s']/t['decode_tokens_per_s']:.2f}x); "
      f"train batch 4 x 512: {ot['tokens_per_s']:.0f} vs {tt['tokens_per_s']:.0f} tok/s "
      f"({ot['tokens_per_s']/tt['tokens_per_s']:.2f}x), peak RSS {ot['peak_rss_bytes']/2**30:.2f} vs {tt['peak_rss_bytes']/2**30:.2f} GiB")
PY
    ;;
  *) echo "usage: $0 sample|replay TRAJECTORIES|model DIR [model flags]" >&2; exit 2 ;;
esac
