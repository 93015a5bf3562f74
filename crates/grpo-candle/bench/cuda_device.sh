#!/usr/bin/env bash
# The CUDA device check, in two halves (see ../../../../shared/cuda/README.md for the toolchain):
#
#   crates/grpo-candle/bench/cuda_device.sh build   # here: CUDA binaries into carry/ (git-ignored)
#   crates/grpo-candle/bench/cuda_device.sh run     # on the GPU machine, with carry/ carried
#
# `run` checks the log-prob op's CUDA kernels against the CPU path first (examples/cuda_check.rs:
# values and gradients, f32 and bf16), then prints the benchmark figures: the op's timings at
# Qwen3's vocabulary, and training tokens/s and model FLOP utilisation of a Qwen3-4B-shaped model
# with random weights in bf16 at 4,096 tokens per sequence (H200 bf16 dense peak: about 790
# TFLOP/s).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
carry="$root/carry"
cd "$root"

case "${1:-}" in
  build)
    toolchain="${CUDA_TOOLCHAIN:-$root/.cuda-toolchain}"
    [[ -f "$toolchain/env.sh" ]] || bash "$root/../shared/cuda/setup-toolchain.sh" "$toolchain"
    # shellcheck disable=SC1091
    source "$toolchain/env.sh"
    CARGO_PROFILE_RELEASE_STRIP=true CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_TARGET_DIR="$root/target/cuda" \
      cargo build --release -p grpo-candle --features cuda --example cuda_check --example bench_train
    mkdir -p "$carry"
    for b in cuda_check bench_train; do
      xz -T0 -c "$root/target/cuda/release/examples/$b" > "$carry/$b.xz"
    done
    ls -la "$carry"
    ;;
  run)
    nv="$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])')"
    export LD_LIBRARY_PATH="$nv/cu13/lib:${LD_LIBRARY_PATH:-}"
    bin="$(mktemp -d)"
    for b in cuda_check bench_train; do
      xz -dc "$carry/$b.xz" > "$bin/$b" && chmod +x "$bin/$b"
      if ldd "$bin/$b" | grep -q "not found"; then
        ldd "$bin/$b" | grep "not found"
        echo "missing libraries for $b"; exit 1
      fi
    done
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$bin/cuda_check"
    # 1,024 tokens first: off the CPU, attention is built from candle primitives and keeps
    # O(T^2) scores per layer, which may not fit at 4,096.
    for seq in 1024 4096; do
      "$bin/bench_train" qwen3-4b --device cuda --dtype bf16 --seq "$seq" --batch 1 \
        --steps 3 --warmup 1 --peak-tflops 790 || echo "bench_train at $seq tokens failed"
    done
    ;;
  *)
    echo "usage: $0 build|run" >&2; exit 2 ;;
esac
