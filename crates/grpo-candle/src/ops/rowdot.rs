//! `x @ wᵀ` as dot products of rows, for the few rows of a decoding step, and the step's
//! attention on the same kernel.
//!
//! A decoding step multiplies one row per sequence by every weight matrix. The `gemm` crate
//! behind candle's CPU matmul first packs the whole right-hand matrix into panels, so at a few
//! rows it reads and writes every weight before the product reads it again: in a `perf` profile
//! of `examples/bench_sample.rs` decoding at batch 8, gemm's packing and dispatch frames
//! (`V3::vectorize`) took 32% of the samples and its microkernels 13%. Here `w`
//! stays `[out, in]`, as checkpoints store it, each output is the dot product of an input row and
//! a weight row, and every weight is read once per call.
//!
//! Each output's sum runs in one fixed order (SIMD-wide partial sums along the input, reduced in
//! a fixed pattern, then the remainder), whatever the number of rows multiplied together and
//! however the outputs are split between threads. A row's result therefore does not depend on
//! the other rows of its batch (gemm's does when a call has a single row).

use candle_core::{DType, Storage, Tensor};
use pulp::{Arch, Simd, WithSimd};

use crate::error::{Error, Result};
use crate::ops::fused::{cpu_slice, par_each, softmax_in_place};

/// Output columns per parallel unit: with 512 inputs, 128 KiB of weights.
const COLS_PER_UNIT: usize = 64;

/// Rows multiplied together against each pair of weight rows (register tile).
const ROW_TILE: usize = 4;

/// Whether [`linear_rows`] runs its own kernel for `x` and `w`: both f32 on the CPU. Otherwise
/// it is candle's matmul.
pub fn has_kernel(x: &Tensor, w: &Tensor) -> bool {
    x.device().is_cpu() && w.device().is_cpu() && x.dtype() == DType::F32 && w.dtype() == DType::F32
}

/// `x @ wᵀ` for `x` `[m, k]` and `w` `[n, k]`: `[m, n]`.
pub fn linear_rows(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if !has_kernel(x, w) {
        return Ok(x.matmul(&w.t()?)?);
    }
    let (m, k) = x.dims2()?;
    let (n, kw) = w.dims2()?;
    if k != kw {
        return Err(Error::Msg(format!(
            "linear_rows: input rows of {k} against weight rows of {kw}"
        )));
    }
    // Per unit of columns, its outputs column by column: `[cols, m]`.
    let mut by_col = vec![0f32; n * m];
    cpu_slice::<f32, _>(x, |xs| {
        cpu_slice::<f32, _>(w, |ws| {
            let units: Vec<(usize, &mut [f32])> = by_col
                .chunks_mut(COLS_PER_UNIT * m.max(1))
                .enumerate()
                .map(|(u, out)| (u * COLS_PER_UNIT, out))
                .collect();
            par_each(units, |_, (c0, out)| {
                let cols = out.len() / m.max(1);
                Arch::new().dispatch(Dots {
                    x: xs,
                    w: &ws[c0 * k..(c0 + cols) * k],
                    k,
                    m,
                    out,
                });
            });
            Ok(())
        })
    })?;
    let mut out = vec![0f32; m * n];
    for (c, col) in by_col.chunks_exact(m.max(1)).enumerate() {
        for (r, &v) in col.iter().enumerate() {
            out[r * n + c] = v;
        }
    }
    Ok(Tensor::from_vec(out, (m, n), x.device())?)
}

/// Attention of one new query per sequence to its cached keys and values: a decoding step's.
///
/// `q` is `[B, heads, 1, d]` (rotated, not yet scaled); `k` and `v` are `[B, kv_heads, >= len,
/// d]` with rows of `d` contiguous (views of a cache's buffers); row `b` sees columns
/// `first[b]..len` (`first[b]`: its left padding). Returns `[B, 1, heads * d]`, or `None` when
/// the inputs are not f32 CPU tensors of that layout (the caller then runs tensor ops).
///
/// Through gemm, each step would pack every cached key and value before multiplying them by a
/// couple of query rows: the whole cache copied once more per layer and step. Here the scores
/// are dot products of the query heads with the key rows, read in place, and the output sums the
/// value rows weighted by the probabilities, one pass each.
pub fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    len: usize,
    first: &[usize],
    scale: f64,
) -> Result<Option<Tensor>> {
    let (b, heads, t, d) = q.dims4()?;
    let (kb, kv_heads, cap, kd) = k.dims4()?;
    let f32_cpu = |x: &Tensor| x.device().is_cpu() && x.dtype() == DType::F32;
    if !(f32_cpu(q) && f32_cpu(k) && f32_cpu(v))
        || t != 1
        || kb != b
        || kd != d
        || v.dims() != k.dims()
        || cap < len
        || first.len() != b
        || kv_heads == 0
        || heads % kv_heads != 0
        || first.iter().any(|&f| f >= len)
    {
        return Ok(None);
    }
    let rows_of = |x: &Tensor| {
        let st = x.layout().stride();
        (st[3] == 1 && st[2] == d).then(|| (x.layout().start_offset(), st[0], st[1]))
    };
    let (Some(kl), Some(vl)) = (rows_of(k), rows_of(v)) else {
        return Ok(None);
    };
    let groups = heads / kv_heads;
    let q: Vec<f32> = q.flatten_all()?.to_vec1()?;
    let scale = scale as f32;
    let (ks, _) = k.storage_and_layout();
    let (vs, _) = v.storage_and_layout();
    let (Storage::Cpu(ks), Storage::Cpu(vs)) = (&*ks, &*vs) else {
        return Ok(None);
    };
    let (ks, vs) = (ks.as_slice::<f32>()?, vs.as_slice::<f32>()?);
    let mut out = vec![0f32; b * heads * d];
    let units: Vec<&mut [f32]> = out.chunks_mut(groups * d).collect();
    par_each(units, |unit, out| {
        let (row, h) = (unit / kv_heads, unit % kv_heads);
        let cols = len - first[row];
        let at =
            |(start, s0, s1): (usize, usize, usize)| start + row * s0 + h * s1 + first[row] * d;
        let keys = &ks[at(kl)..at(kl) + cols * d];
        let values = &vs[at(vl)..at(vl) + cols * d];
        let queries = &q[unit * groups * d..(unit + 1) * groups * d];
        let mut by_col = vec![0f32; cols * groups];
        Arch::new().dispatch(Dots {
            x: queries,
            w: keys,
            k: d,
            m: groups,
            out: &mut by_col,
        });
        let mut probs = vec![0f32; cols];
        for (g, acc) in out.chunks_exact_mut(d).enumerate() {
            for (p, c) in probs.iter_mut().zip(by_col.chunks_exact(groups)) {
                *p = c[g] * scale;
            }
            softmax_in_place(&mut probs);
            for (p, value) in probs.iter().zip(values.chunks_exact(d)) {
                for (a, x) in acc.iter_mut().zip(value) {
                    *a += p * x;
                }
            }
        }
    });
    Ok(Some(Tensor::from_vec(out, (b, 1, heads * d), k.device())?))
}

/// One unit: every row of `x` against the weight rows of `w`, into `out` `[cols, m]`.
struct Dots<'a> {
    x: &'a [f32],
    w: &'a [f32],
    k: usize,
    m: usize,
    out: &'a mut [f32],
}

impl WithSimd for Dots<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Dots { x, w, k, m, out } = self;
        if m == 0 || k == 0 {
            out.fill(0.0);
            return;
        }
        let rows: Vec<&[f32]> = x.chunks_exact(k).collect();
        let mut pairs = w.chunks_exact(2 * k).zip(out.chunks_exact_mut(2 * m));
        for (wp, op) in &mut pairs {
            let (w0, w1) = wp.split_at(k);
            let (o0, o1) = op.split_at_mut(m);
            tile::<S, 2>(simd, &rows, [w0, w1], [o0, o1]);
        }
        let done = w.len() / (2 * k) * 2;
        if done * k < w.len() {
            tile::<S, 1>(simd, &rows, [&w[done * k..]], [&mut out[done * m..]]);
        }
    }
}

/// The outputs of every row against `C` weight rows.
#[inline(always)]
fn tile<S: Simd, const C: usize>(simd: S, rows: &[&[f32]], w: [&[f32]; C], out: [&mut [f32]; C]) {
    let mut r = 0;
    while r + ROW_TILE <= rows.len() {
        let got = block::<S, ROW_TILE, C>(simd, std::array::from_fn(|i| rows[r + i]), w);
        for (i, g) in got.iter().enumerate() {
            for c in 0..C {
                out[c][r + i] = g[c];
            }
        }
        r += ROW_TILE;
    }
    while r < rows.len() {
        let got = block::<S, 1, C>(simd, [rows[r]], w);
        for c in 0..C {
            out[c][r] = got[0][c];
        }
        r += 1;
    }
}

/// `R x C` dot products. Each one accumulates SIMD lanes in input order, reduces the lanes, then
/// adds the inputs past the last full SIMD vector in order: the same steps for any `R` and `C`.
#[inline(always)]
fn block<S: Simd, const R: usize, const C: usize>(
    simd: S,
    x: [&[f32]; R],
    w: [&[f32]; C],
) -> [[f32; C]; R] {
    let xs: [(&[S::f32s], &[f32]); R] = std::array::from_fn(|r| S::as_simd_f32s(x[r]));
    let ws: [(&[S::f32s], &[f32]); C] = std::array::from_fn(|c| S::as_simd_f32s(w[c]));
    // Every vector slice cut to one length, so the loop below runs without bounds checks.
    let len = ws[0].0.len();
    let xv: [&[S::f32s]; R] = std::array::from_fn(|r| &xs[r].0[..len]);
    let wv: [&[S::f32s]; C] = std::array::from_fn(|c| &ws[c].0[..len]);
    let mut acc = [[simd.splat_f32s(0.0); C]; R];
    for i in 0..len {
        for c in 0..C {
            let wi = wv[c][i];
            for r in 0..R {
                acc[r][c] = simd.mul_add_f32s(xv[r][i], wi, acc[r][c]);
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut s = simd.reduce_sum_f32s(acc[r][c]);
            for (a, b) in xs[r].1.iter().zip(ws[c].1) {
                s = a.mul_add(*b, s);
            }
            out[r][c] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn random(shape: (usize, usize), seed: u64) -> Tensor {
        let n = shape.0 * shape.1;
        let v: Vec<f32> = (0..n)
            .map(|i| {
                let h = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                ((h >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn matches_the_matmul() {
        // Odd sizes: remainders in rows, weight rows, units and SIMD lanes.
        for &(m, k, n) in &[
            (1, 8, 1),
            (3, 13, 5),
            (8, 512, 130),
            (9, 70, 257),
            (5, 1, 3),
        ] {
            let x = random((m, k), 1);
            let w = random((n, k), 2);
            let want: Vec<Vec<f32>> = x.matmul(&w.t().unwrap()).unwrap().to_vec2().unwrap();
            let got: Vec<Vec<f32>> = linear_rows(&x, &w).unwrap().to_vec2().unwrap();
            for (a, b) in want.iter().flatten().zip(got.iter().flatten()) {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                    "{m}x{k}x{n}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn a_row_gets_the_same_bits_in_any_batch() {
        let (k, n) = (200, 300);
        let x = random((11, k), 3);
        let w = random((n, k), 4);
        let all: Vec<Vec<f32>> = linear_rows(&x, &w).unwrap().to_vec2().unwrap();
        for m in [1, 2, 3, 4, 5, 7, 11] {
            for start in [0, 11 - m] {
                let part: Vec<Vec<f32>> = linear_rows(&x.narrow(0, start, m).unwrap(), &w)
                    .unwrap()
                    .to_vec2()
                    .unwrap();
                for (r, row) in part.iter().enumerate() {
                    assert_eq!(row, &all[start + r], "rows {start}..{} of 11", start + m);
                }
            }
        }
    }

    #[test]
    fn decode_attention_matches_the_softmax_over_each_rows_columns() {
        let (b, heads, kv_heads, d, cap, len) = (3, 4, 2, 8, 12, 9);
        let q = random((b * heads, d), 5).reshape((b, heads, 1, d)).unwrap();
        let k = random((b * kv_heads * cap, d), 6)
            .reshape((b, kv_heads, cap, d))
            .unwrap();
        let v = random((b * kv_heads * cap, d), 7)
            .reshape((b, kv_heads, cap, d))
            .unwrap();
        // Views of the first `len` columns of buffers with spare capacity, as the cache holds.
        let (kn, vn) = (k.narrow(2, 0, len).unwrap(), v.narrow(2, 0, len).unwrap());
        let first = [0, 3, 8];
        let scale = 0.35;
        let got: Vec<f32> = decode_attention(&q, &kn, &vn, len, &first, scale)
            .unwrap()
            .expect("f32 on the CPU takes the kernel")
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let qv: Vec<f32> = q.flatten_all().unwrap().to_vec1().unwrap();
        let kv: Vec<f32> = k.flatten_all().unwrap().to_vec1().unwrap();
        let vv: Vec<f32> = v.flatten_all().unwrap().to_vec1().unwrap();
        for r in 0..b {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let col = |j: usize| ((r * kv_heads + g) * cap + j) * d;
                let qh = &qv[(r * heads + h) * d..(r * heads + h + 1) * d];
                let scores: Vec<f64> = (first[r]..len)
                    .map(|j| {
                        let kj = &kv[col(j)..col(j) + d];
                        qh.iter().zip(kj).map(|(a, b)| (a * b) as f64).sum::<f64>() * scale
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for e in 0..d {
                    let want: f64 = (first[r]..len)
                        .zip(&scores)
                        .map(|(j, s)| (s - m).exp() / z * vv[col(j) + e] as f64)
                        .sum();
                    let at = (r * heads + h) * d + e;
                    assert!(
                        (got[at] as f64 - want).abs() < 1e-5,
                        "row {r} head {h}: {} vs {want}",
                        got[at]
                    );
                }
            }
        }
        // Not one query per row, or a row without a visible column: not this kernel's case.
        let two = Tensor::cat(&[&q, &q], 2).unwrap();
        assert!(
            decode_attention(&two, &kn, &vn, len, &first, scale)
                .unwrap()
                .is_none()
        );
        assert!(
            decode_attention(&q, &kn, &vn, len, &[0, 0, len], scale)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let err = linear_rows(&random((2, 4), 0), &random((3, 5), 0)).unwrap_err();
        assert!(
            err.to_string()
                .contains("rows of 4 against weight rows of 5"),
            "{err}"
        );
    }
}
