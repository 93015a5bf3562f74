#!/usr/bin/env bash
# Training throughput of grpo-candle vs a PyTorch peer (same Qwen3 shapes, f32, CPU, 2 threads,
# AdamW), in one run, plus the peak memory of the chunked log-prob op vs the naive path.
#
#   crates/grpo-candle/bench/compare_torch.sh [tiny|mid|logprob|all]   (default: all)
#
# Sets up bench/.venv with torch from PyPI on first use (not part of CI). Prints one JSON line
# per measurement and a summary line per config with the ratio of training tokens/s.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
what="${1:-all}"
threads="${THREADS:-2}"
venv="$here/.venv"

if [[ "$what" != logprob ]]; then
  if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q torch numpy
  fi
fi

cd "$root"
cargo build --release -q -p grpo-candle --example bench_train --example bench_logprob
bin="${CARGO_TARGET_DIR:-$root/target}/release/examples"

compare() {
  local preset="$1" steps="$2"
  local ours theirs
  theirs="$("$venv/bin/python" "$here/torch_peer.py" "$preset" --steps "$steps" --threads "$threads")"
  echo "$theirs"
  # MIMALLOC_PURGE_DELAY=-1: keep freed pages instead of returning them to the OS, which otherwise
  # costs a page fault and a zeroed huge page per re-allocation (about a quarter of a CPU step).
  # Headline: the trainer's default CPU mode with candle's elementwise pool off: one micro-batch
  # per thread, run at once on $threads rayon threads.
  ours="$(MIMALLOC_PURGE_DELAY=-1 RAYON_NUM_THREADS=$threads CANDLE_NUM_THREADS=1 "$bin/bench_train" "$preset" --steps "$steps" 2>/dev/null)"
  echo "$ours"
  # Also: one micro-batch with every op split across $threads threads, and a single thread.
  oursop="$(MIMALLOC_PURGE_DELAY=-1 RAYON_NUM_THREADS=$threads CANDLE_NUM_THREADS=$threads "$bin/bench_train" "$preset" --steps "$steps" 2>/dev/null)"
  echo "$oursop"
  ours1="$(MIMALLOC_PURGE_DELAY=-1 RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1 "$bin/bench_train" "$preset" --steps "$steps" 2>/dev/null)"
  echo "$ours1"
  python3 - "$ours" "$theirs" "$oursop" "$ours1" <<'PY'
import json, sys
o, t, op, o1 = (json.loads(a) for a in sys.argv[1:5])
for label, r in (("ops split across threads", op), ("1 thread", o1)):
    print(f"SUMMARY {o['preset']} ({label}): grpo-candle {r['tokens_per_s']:.0f} tok/s "
          f"({r['step_seconds_median']:.3f} s/step): ratio to torch {r['tokens_per_s']/t['tokens_per_s']:.2f}x")
print(f"SUMMARY {o['preset']}: grpo-candle {o['tokens_per_s']:.0f} tok/s ({o['step_seconds_median']:.3f} s/step, "
      f"peak {o['peak_rss_bytes']/2**20:.0f} MiB) vs torch {t['tokens_per_s']:.0f} tok/s "
      f"({t['step_seconds_median']:.3f} s/step, peak {t['peak_rss_bytes']/2**20:.0f} MiB): "
      f"ratio {o['tokens_per_s']/t['tokens_per_s']:.2f}x; cpu-s/step {o['step_cpu_seconds_median']:.2f} vs "
      f"{t['step_cpu_seconds_median']:.2f} (ratio {t['step_cpu_seconds_median']/o['step_cpu_seconds_median']:.2f}x)")
PY
}

logprob_memory() {
  local tokens="$1" out_c out_n
  out_c="$(CANDLE_NUM_THREADS=$threads "$bin/bench_logprob" chunked --tokens "$tokens" --vocab 151936 --hidden 1024)"
  echo "$out_c"
  # The naive path needs about 25 GB at 8,192 tokens (five [tokens, vocab] f32 tensors live at
  # once): more than this 24 GB machine. It runs only up to NAIVE_MAX_TOKENS (default 2048); its
  # memory is linear in the token count.
  if (( tokens > ${NAIVE_MAX_TOKENS:-2048} )); then
    echo "SUMMARY logprob $tokens tokens: chunked peak $(python3 -c "import json,sys; print(json.loads(sys.argv[1])['peak_rss_bytes']>>20)" "$out_c") MiB; naive path skipped (over NAIVE_MAX_TOKENS)"
    return
  fi
  if out_n="$(CANDLE_NUM_THREADS=$threads "$bin/bench_logprob" naive --tokens "$tokens" --vocab 151936 --hidden 1024)"; then
    echo "$out_n"
    python3 - "$out_c" "$out_n" <<'PY'
import json, sys
c, n = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"SUMMARY logprob {c['tokens']} tokens x vocab {c['vocab']}: extra memory chunked "
      f"{c['extra_bytes']/2**20:.0f} MiB vs naive {n['extra_bytes']/2**20:.0f} MiB "
      f"(ratio {c['extra_bytes']/n['extra_bytes']:.3f}); peak {c['peak_rss_bytes']/2**20:.0f} vs "
      f"{n['peak_rss_bytes']/2**20:.0f} MiB; time {c['seconds']:.2f} s vs {n['seconds']:.2f} s")
PY
  else
    echo "SUMMARY logprob $tokens tokens: naive path failed (out of memory?)"
  fi
}

case "$what" in
  tiny) compare tiny 10 ;;
  mid) compare mid 3 ;;
  logprob) logprob_memory 1024; logprob_memory 2048; logprob_memory 8192 ;;
  all) compare tiny 10; compare mid 3; logprob_memory 1024; logprob_memory 2048; logprob_memory 8192 ;;
  *) echo "usage: $0 [tiny|mid|logprob|all]" >&2; exit 2 ;;
esac
