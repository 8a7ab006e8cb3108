//! Context::merge on the CPU backend: attention over parts of the keys, merged by the LSE, is
//! attention over all of them (causal parts through a window shifted onto each part); -inf
//! parts, half precision, buffers, and bad inputs refused with the library's status and message.
use flashattn::{Backend, Context, DType, Dims, Options, Parts, Status, ViewMut, F16};

fn rows_of(dims: &Dims, x: &[f32], begin: usize, end: usize) -> Vec<f32> {
    let row = dims.heads_kv * dims.head_dim;
    (0..dims.batch).flat_map(|b| x[(b * dims.seqlen_k + begin) * row..(b * dims.seqlen_k + end) * row].iter().copied()).collect()
}

fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

fn max_error(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() }).fold(0.0, f32::max)
}

#[test]
fn merged_parts_are_the_whole_attention() {
    let ctx = Context::new(Backend::Cpu, 0).unwrap();
    for causal in [false, true] {
        let dims = Dims { batch: 2, seqlen_q: 9, seqlen_k: 31, heads_q: 4, heads_kv: 2, head_dim: 8 };
        let q = pseudo_random(dims.batch * dims.seqlen_q * dims.heads_q * dims.head_dim, 1);
        let k = pseudo_random(dims.batch * dims.seqlen_k * dims.heads_kv * dims.head_dim, 2);
        let v = pseudo_random(k.len(), 3);
        let (whole, whole_lse) = ctx.attention(&dims, &q, &k, &v, &Options::default().causal(causal)).unwrap();
        let bounds = [0, 4, 5, 20, 31];
        let (mut outs, mut lses) = (Vec::new(), Vec::new());
        for w in bounds.windows(2) {
            let part = Dims { seqlen_k: w[1] - w[0], ..dims };
            let mut opts = Options::default();
            if causal {
                opts = opts.window(-1, (dims.seqlen_k - w[1]) as i32);
            }
            let (o, l) = ctx.attention(&part, &q, &rows_of(&dims, &k, w[0], w[1]), &rows_of(&dims, &v, w[0], w[1]), &opts).unwrap();
            outs.extend(o);
            lses.extend(l);
        }
        let (out, lse) = ctx.merge_parts(&dims, bounds.len() - 1, &outs, &lses).unwrap();
        assert!(max_error(&out, &whole) <= 1e-5, "causal {causal}: out off by {}", max_error(&out, &whole));
        assert!(max_error(&lse, &whole_lse) <= 1e-5, "causal {causal}: lse off by {}", max_error(&lse, &whole_lse));
    }
}

#[test]
fn half_precision_parts_and_rows_without_keys() {
    let ctx = Context::new(Backend::Cpu, 0).unwrap();
    let dims = Dims { batch: 1, seqlen_q: 3, seqlen_k: 1, heads_q: 1, heads_kv: 1, head_dim: 2 };
    let outs: Vec<F16> = [1.0, 3.0, f32::NAN, f32::NAN, 7.0, 7.0, 3.0, 5.0, 0.5, 0.5, 9.0, 9.0].map(F16::from_f32).to_vec();
    let inf = f32::INFINITY;
    // Row 0: equal weights; row 1: only part 1 (part 0 is -inf, its NaN output stays out);
    // row 2: every part -inf.
    let lses = [0.0, -inf, -inf, 0.0, 2.0, -inf];
    let (out, lse) = ctx.merge_parts(&dims, 2, &outs, &lses).unwrap();
    let got: Vec<f32> = out.iter().map(|h| h.to_f32()).collect();
    assert_eq!(got, [2.0, 4.0, 0.5, 0.5, 0.0, 0.0]);
    assert!((lse[0] - 2f32.ln()).abs() < 1e-6 && lse[1] == 2.0 && lse[2] == -inf, "{lse:?}");
}

#[test]
fn parts_in_buffers() {
    let ctx = Context::new(Backend::Cpu, 0).unwrap();
    let outs = ctx.buffer_from(&[1f32, 1.0, 3.0, 3.0]).unwrap();
    let lses = ctx.buffer_from(&[0f32, 0.0]).unwrap();
    let parts = Parts::of_buffers(&outs, &lses, DType::F32, 2, &[1, 1, 1, 2], &[1, 1, 1]).unwrap();
    assert_eq!(parts.count(), 2);
    let (mut out, mut lse) = ([0f32; 2], [0f32; 1]);
    ctx.merge(&parts, &mut ViewMut::new(&mut out, &[1, 1, 1, 2]).unwrap(), Some(&mut ViewMut::new(&mut lse, &[1, 1, 1]).unwrap())).unwrap();
    assert_eq!(out, [2.0, 2.0]);
    assert!((lse[0] - 2f32.ln()).abs() < 1e-6);
}

#[test]
fn bad_inputs_are_refused() {
    let ctx = Context::new(Backend::Cpu, 0).unwrap();
    let dims = Dims { batch: 1, seqlen_q: 2, seqlen_k: 1, heads_q: 1, heads_kv: 1, head_dim: 4 };
    let e = ctx.merge_parts(&dims, 0, &[0f32; 0], &[]).unwrap_err();
    assert_eq!(e.status(), Status::INVALID_ARGUMENT);
    let e = ctx.merge_parts(&dims, 2, &[0f32; 16], &[0f32; 3]).unwrap_err();
    assert_eq!((e.status(), e.message()), (Status::INVALID_SHAPE, "parts_lse: 3 values for 2 parts of shape [1, 1, 2], want 4"));
    // The library's own checks: an output of another dtype.
    let (outs, lses) = ([0f32; 16], [0f32; 4]);
    let parts = Parts::new(&outs, &lses, 2, &[1, 2, 1, 4], &[1, 1, 2]).unwrap();
    let mut half = [F16(0); 8];
    let e = ctx.merge(&parts, &mut ViewMut::new(&mut half, &[1, 2, 1, 4]).unwrap(), None).unwrap_err();
    assert_eq!(e.status(), Status::INVALID_DTYPE);
    assert!(e.message().contains("out: dtype float16 differs from parts_out's float32"), "{}", e.message());
}
