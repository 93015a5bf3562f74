//! With the `cuda` feature, compiles `src/ops/cuda/logprob.cu` to PTX with nvcc (from `NVCC`,
//! `$CUDA_HOME/bin/nvcc` or the `PATH`), for compute capability `CUDA_COMPUTE_CAP` (default 80;
//! PTX for a lower capability also runs on newer GPUs). Without the feature it does nothing, so
//! the default build never needs a CUDA toolkit.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/ops/cuda/logprob.cu");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("grpo_kernels.ptx");
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| match std::env::var("CUDA_HOME") {
        Ok(home) => format!("{home}/bin/nvcc"),
        Err(_) => "nvcc".into(),
    });
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let cap: String = cap.chars().filter(|c| c.is_ascii_digit()).collect();
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3", &format!("-arch=compute_{cap}"), "-o"])
        .arg(&out)
        .arg("src/ops/cuda/logprob.cu")
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            panic!("{nvcc} failed on src/ops/cuda/logprob.cu ({s}); the `cuda` feature needs nvcc")
        }
        Err(e) => panic!(
            "could not run {nvcc} ({e}); the `cuda` feature needs a CUDA toolkit (set CUDA_HOME or NVCC)"
        ),
    }
}
