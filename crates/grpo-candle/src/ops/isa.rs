//! Which vector instructions the CPU kernels run on this machine, for benchmark output: the
//! processor's features, detected at run time, and the widest kernels the build carries. The
//! matmuls are candle's (the `gemm` crate, built without its `x86-v4` AVX-512 kernels, so at
//! most AVX2/FMA); the project's own kernels (`fused`, `rowdot`, `logprob`) dispatch through
//! `pulp`, also at most AVX2/FMA. The bench README has the measurements behind that choice.

use serde::Serialize;

/// The kernel path of this process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelPath {
    /// The processor's vector features that matter here, as detected (`avx2`, `fma`,
    /// `avx512f`, ...).
    pub cpu: Vec<&'static str>,
    /// The kernels the matmuls and the project's own ops run (one path for both:
    /// `avx2+fma`, or `sse/scalar` without AVX2/FMA).
    pub kernels: &'static str,
}

/// Detect the kernel path.
pub fn kernel_path() -> KernelPath {
    #[cfg(target_arch = "x86_64")]
    {
        let mut cpu = Vec::new();
        macro_rules! detect {
            ($($f:tt),*) => {
                $(if std::arch::is_x86_feature_detected!($f) {
                    cpu.push($f);
                })*
            };
        }
        detect!(
            "sse4.2",
            "avx",
            "avx2",
            "fma",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512bf16",
            "avx512fp16"
        );
        let v3 = cpu.contains(&"avx2") && cpu.contains(&"fma");
        KernelPath {
            cpu,
            kernels: if v3 { "avx2+fma" } else { "sse/scalar" },
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        KernelPath {
            cpu: Vec::new(),
            kernels: "portable",
        }
    }
}
