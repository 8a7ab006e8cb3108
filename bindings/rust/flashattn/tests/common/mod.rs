//! The naive algorithm in f64 arithmetic, every materialized value (S, P, O; dP, dS and the
//! gradients) passed through a rounding: the identity gives the float64 truth; rounding to a
//! dtype gives the standard algorithm in that precision, whose error sets the tolerance:
//! max|ours - ref64| <= 2 * max|standard - ref64| + atol.
#![allow(dead_code)]

use flashattn::{DType, Dims, Element, BF16, F16};

pub type Rounding = fn(f64) -> f64;

pub fn exact(x: f64) -> f64 {
    x
}

pub fn rounding(dtype: DType) -> Rounding {
    match dtype {
        DType::F32 => |x| x as f32 as f64,
        DType::F16 => |x| F16::from_f32(x as f32).to_f32() as f64,
        DType::BF16 => |x| BF16::from_f32(x as f32).to_f32() as f64,
        DType::I32 => |x| x.round(),
    }
}

pub fn atol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 2e-2,
        DType::I32 => 0.0,
    }
}

/// Values of an element type as f64 and back.
pub trait Value: Element {
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
}

impl Value for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl Value for F16 {
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    fn from_f64(x: f64) -> Self {
        F16::from_f32(x as f32)
    }
}

impl Value for BF16 {
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    fn from_f64(x: f64) -> Self {
        BF16::from_f32(x as f32)
    }
}

pub fn to_f64<T: Value>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

pub fn from_f64<T: Value>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::from_f64(v)).collect()
}

/// Standard normal values from a fixed xorshift generator (Box-Muller), exact in T.
pub fn random<T: Value>(n: usize, seed: u64) -> Vec<T> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| T::from_f64((-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos()))
        .collect()
}

fn qi(d: &Dims, b: usize, i: usize, h: usize, c: usize) -> usize {
    ((b * d.seqlen_q + i) * d.heads_q + h) * d.head_dim + c
}

fn ki(d: &Dims, b: usize, j: usize, h: usize, c: usize) -> usize {
    ((b * d.seqlen_k + j) * d.heads_kv + h) * d.head_dim + c
}

/// P of row (b, h, i) (rounded) and the row's LSE; no unmasked key: P = 0, LSE = -inf.
fn probabilities(d: &Dims, q: &[f64], k: &[f64], b: usize, h: usize, i: usize, causal: bool, scale: f64, r: Rounding) -> (Vec<f64>, f64) {
    let hk = h / (d.heads_q / d.heads_kv);
    let mut s = vec![f64::NEG_INFINITY; d.seqlen_k];
    let mut m = f64::NEG_INFINITY;
    for (j, sj) in s.iter_mut().enumerate() {
        if causal && j + d.seqlen_q > i + d.seqlen_k {
            continue;
        }
        let acc: f64 = (0..d.head_dim).map(|c| q[qi(d, b, i, h, c)] * k[ki(d, b, j, hk, c)]).sum();
        *sj = r(acc * scale);
        m = m.max(*sj);
    }
    if m == f64::NEG_INFINITY {
        return (vec![0.0; d.seqlen_k], m);
    }
    let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let l: f64 = p.iter().sum();
    (p.iter().map(|x| r(x / l)).collect(), m + l.ln())
}

pub fn naive(d: &Dims, q: &[f64], k: &[f64], v: &[f64], causal: bool, scale: f64, r: Rounding) -> (Vec<f64>, Vec<f64>) {
    let g = d.heads_q / d.heads_kv;
    let mut out = vec![0.0; q.len()];
    let mut lse = vec![0.0; d.batch * d.heads_q * d.seqlen_q];
    for b in 0..d.batch {
        for h in 0..d.heads_q {
            for i in 0..d.seqlen_q {
                let (p, l) = probabilities(d, q, k, b, h, i, causal, scale, r);
                lse[(b * d.heads_q + h) * d.seqlen_q + i] = l;
                for c in 0..d.head_dim {
                    out[qi(d, b, i, h, c)] = r(p.iter().enumerate().map(|(j, pj)| pj * v[ki(d, b, j, h / g, c)]).sum());
                }
            }
        }
    }
    (out, lse)
}

#[allow(clippy::too_many_arguments)]
pub fn naive_backward(d: &Dims, q: &[f64], k: &[f64], v: &[f64], dout: &[f64], causal: bool, scale: f64, r: Rounding) -> [Vec<f64>; 3] {
    let (out, _) = naive(d, q, k, v, causal, scale, r);
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let g = d.heads_q / d.heads_kv;
    for b in 0..d.batch {
        for h in 0..d.heads_q {
            let hk = h / g;
            for i in 0..d.seqlen_q {
                let (p, _) = probabilities(d, q, k, b, h, i, causal, scale, r);
                let delta: f64 = (0..d.head_dim).map(|c| dout[qi(d, b, i, h, c)] * out[qi(d, b, i, h, c)]).sum();
                for (j, &pj) in p.iter().enumerate() {
                    if pj == 0.0 {
                        continue;
                    }
                    let dp: f64 = (0..d.head_dim).map(|c| dout[qi(d, b, i, h, c)] * v[ki(d, b, j, hk, c)]).sum();
                    let ds = r(pj * (r(dp) - delta));
                    for c in 0..d.head_dim {
                        dq[qi(d, b, i, h, c)] += scale * ds * k[ki(d, b, j, hk, c)];
                        dk[ki(d, b, j, hk, c)] += scale * ds * q[qi(d, b, i, h, c)];
                        dv[ki(d, b, j, hk, c)] += pj * dout[qi(d, b, i, h, c)];
                    }
                }
            }
        }
    }
    [dq, dk, dv].map(|g| g.into_iter().map(r).collect())
}

/// max|a - b|, equal infinities counting as 0 and NaN as infinite.
pub fn max_error(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0.0, |m, (x, y)| {
        if x == y {
            m
        } else if (x - y).is_nan() {
            f64::INFINITY
        } else {
            m.max((x - y).abs())
        }
    })
}

pub fn assert_within(what: &str, ours: &[f64], reference: &[f64], standard: &[f64], atol: f64) {
    let (err, std) = (max_error(ours, reference), max_error(standard, reference));
    assert!(err <= 2.0 * std + atol, "{what}: max error {err:.3e} exceeds 2 x standard's {std:.3e} + {atol}");
}
