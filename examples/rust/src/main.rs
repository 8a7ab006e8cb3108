//! The small attention every binding's example computes: batch 1, seqlen 16, heads 2, head_dim 8,
//! causal, inputs from a fixed linear congruential generator, on the CPU; checked against a naive
//! f64 loop. Prints OK and the largest difference.
use flashattn::{Backend, Context, Dims, Options};

const B: usize = 1;
const N: usize = 16;
const H: usize = 2;
const D: usize = 8;

/// `n` values in [-1, 1) from x = (1103515245 x + 12345) mod 2^31.
fn lcg_values(n: usize, state: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *state = (1103515245 * *state + 12345) % (1 << 31);
            (*state as f64 / (1u64 << 30) as f64 - 1.0) as f32
        })
        .collect()
}

fn naive(q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
    let at = |x: &[f32], b: usize, s: usize, h: usize, c: usize| x[((b * N + s) * H + h) * D + c] as f64;
    let mut out = vec![0.0; B * N * H * D];
    for b in 0..B {
        for h in 0..H {
            for i in 0..N {
                // causal: keys j <= i
                let s: Vec<f64> = (0..=i).map(|j| (0..D).map(|c| at(q, b, i, h, c) * at(k, b, j, h, c)).sum::<f64>() / (D as f64).sqrt()).collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = p.iter().sum();
                for (j, pj) in p.iter().enumerate() {
                    for c in 0..D {
                        out[((b * N + i) * H + h) * D + c] += pj / sum * at(v, b, j, h, c);
                    }
                }
            }
        }
    }
    out
}

fn main() -> Result<(), flashattn::Error> {
    let mut state = 1;
    let (q, k, v) = (lcg_values(B * N * H * D, &mut state), lcg_values(B * N * H * D, &mut state), lcg_values(B * N * H * D, &mut state));

    let ctx = Context::new(Backend::Cpu, 0)?;
    let dims = Dims { batch: B, seqlen_q: N, seqlen_k: N, heads_q: H, heads_kv: H, head_dim: D };
    let (out, _lse) = ctx.attention(&dims, &q, &k, &v, &Options::default().causal(true))?;

    let worst = out.iter().zip(naive(&q, &k, &v)).map(|(&o, r)| (o as f64 - r).abs()).fold(0.0, f64::max);
    if !(worst < 1e-5) {
        eprintln!("FAILED: max error {worst:e}");
        std::process::exit(1);
    }
    println!("OK rust: max error {worst:.3e}");
    Ok(())
}
