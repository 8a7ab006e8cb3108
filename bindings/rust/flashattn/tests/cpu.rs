//! The safe crate on the CPU backend, against f64 attention.
mod common;

use common::*;
use flashattn::{Algorithm, Backend, BF16, Context, DType, Dims, Options, Status, View, ViewMut, F16};

// No tile multiples, GQA and MQA, seqlen_q > seqlen_k (a causal mask then leaves the first rows
// no key at all).
const DIMS: [Dims; 3] = [
    Dims { batch: 2, seqlen_q: 37, seqlen_k: 53, heads_q: 4, heads_kv: 2, head_dim: 32 },
    Dims { batch: 1, seqlen_q: 64, seqlen_k: 64, heads_q: 2, heads_kv: 2, head_dim: 16 },
    Dims { batch: 1, seqlen_q: 70, seqlen_k: 30, heads_q: 3, heads_kv: 1, head_dim: 40 },
];

fn cpu() -> Context {
    Context::new(Backend::Cpu, 0).expect("a CPU context")
}

fn len(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn check_forward_backward<T: Value>(ctx: &Context, d: &Dims, causal: bool, seed: u64) {
    let dtype = T::DTYPE;
    let (q, k, v, dout) = (
        random::<T>(len(&d.q_shape()), seed),
        random::<T>(len(&d.k_shape()), seed + 1),
        random::<T>(len(&d.k_shape()), seed + 2),
        random::<T>(len(&d.q_shape()), seed + 3),
    );
    let (qf, kf, vf, df) = (to_f64(&q), to_f64(&k), to_f64(&v), to_f64(&dout));
    let scale = 1.0 / (d.head_dim as f64).sqrt();
    let options = Options::default().causal(causal);

    let (out, lse) = ctx.attention(d, &q, &k, &v, &options).expect("forward");
    let (ref_out, ref_lse) = naive(d, &qf, &kf, &vf, causal, scale, exact);
    let (std_out, _) = naive(d, &qf, &kf, &vf, causal, scale, rounding(dtype));
    assert_within("out", &to_f64(&out), &ref_out, &std_out, atol(dtype));
    let lse_err = max_error(&lse.iter().map(|&x| x as f64).collect::<Vec<_>>(), &ref_lse);
    assert!(lse_err < 1e-4, "lse: max error {lse_err}");

    let (dq, dk, dv) = ctx.attention_backward(d, &q, &k, &v, &out, &dout, &lse, &options).expect("backward");
    let refs = naive_backward(d, &qf, &kf, &vf, &df, causal, scale, exact);
    let stds = naive_backward(d, &qf, &kf, &vf, &df, causal, scale, rounding(dtype));
    for (name, ours, r, s) in [("dq", &dq, &refs[0], &stds[0]), ("dk", &dk, &refs[1], &stds[1]), ("dv", &dv, &refs[2], &stds[2])] {
        assert_within(name, &to_f64(ours), r, s, atol(dtype));
    }
}

#[test]
fn f32_matches_f64() {
    let ctx = cpu();
    for d in &DIMS {
        for causal in [false, true] {
            check_forward_backward::<f32>(&ctx, d, causal, 1);
        }
    }
}

#[test]
fn f16_and_bf16_match_f64() {
    let ctx = cpu();
    check_forward_backward::<F16>(&ctx, &DIMS[0], true, 2);
    check_forward_backward::<BF16>(&ctx, &DIMS[0], true, 3);
}

#[test]
fn fully_masked_rows_give_zero_and_minus_infinity() {
    let ctx = cpu();
    let d = Dims { batch: 1, seqlen_q: 8, seqlen_k: 4, heads_q: 2, heads_kv: 2, head_dim: 16 };
    let q = random::<f32>(256, 4);
    let k = random::<f32>(128, 5);
    let (out, lse) = ctx.attention(&d, &q, &k, &k, &Options::default().causal(true)).unwrap();
    for h in 0..2 {
        for i in 0..8 {
            assert_eq!(lse[h * 8 + i] == f32::NEG_INFINITY, i < 4, "row {i} head {h}");
            if i < 4 {
                assert!(out[(i * 2 + h) * 16..(i * 2 + h + 1) * 16].iter().all(|&x| x == 0.0));
            }
        }
    }
}

/// Strided views of a packed QKV slice, read in place, give what contiguous copies give; the
/// standard algorithm agrees within the tolerance.
#[test]
fn strided_views_and_the_standard_algorithm() {
    let ctx = cpu();
    let (b, n, h, dim) = (2, 33, 4, 32);
    let packed = random::<f32>(b * n * 3 * h * dim, 6); // [b, n, 3, h, dim]
    let strides = [n * 3 * h * dim, 3 * h * dim, dim, 1];
    let shape = [b, n, h, dim];
    let part = |i: usize| View::strided(&packed[i * h * dim..], &shape, Some(&strides)).unwrap();
    let mut out = vec![0f32; b * n * h * dim];
    let options = Options::default().causal(true);
    ctx.forward(&part(0), &part(1), &part(2), &mut ViewMut::new(&mut out, &shape).unwrap(), None, &options).unwrap();

    let copy = |i: usize| -> Vec<f32> {
        (0..b * n).flat_map(|row| packed[(row * 3 + i) * h * dim..(row * 3 + i + 1) * h * dim].to_vec()).collect()
    };
    let d = Dims { batch: b, seqlen_q: n, seqlen_k: n, heads_q: h, heads_kv: h, head_dim: dim };
    let (q, k, v) = (copy(0), copy(1), copy(2));
    let (want, _) = ctx.attention(&d, &q, &k, &v, &options).unwrap();
    assert_eq!(out, want);

    let (standard, _) = ctx.attention(&d, &q, &k, &v, &options.algorithm(Algorithm::Standard)).unwrap();
    let scale = 1.0 / (dim as f64).sqrt();
    let (r, _) = naive(&d, &to_f64(&q), &to_f64(&k), &to_f64(&v), true, scale, exact);
    assert_within("standard", &to_f64(&standard), &r, &to_f64(&want), atol(DType::F32));
}

#[test]
fn buffers_views_and_queries() {
    let ctx = cpu();
    let d = DIMS[1];
    let q = random::<f32>(len(&d.q_shape()), 7);
    let qb = ctx.buffer_from(&q).unwrap();
    let mut ob = ctx.buffer(qb.size()).unwrap();
    assert_eq!(qb.as_ptr() as usize % 256, 0);
    let view = View::of_buffer(&qb, 0, DType::F32, &d.q_shape(), None).unwrap();
    ctx.supported(&view, &view, &view, &Options::default(), true).unwrap();
    ctx.workspace_size(&view, &view, &view, &Options::default(), false).unwrap();
    let mut out = ViewMut::of_buffer(&mut ob, 0, DType::F32, &d.q_shape(), None).unwrap();
    ctx.forward(&view, &view, &view, &mut out, None, &Options::default().scale(0.3)).unwrap();
    let mut got = vec![0f32; q.len()];
    ob.read(0, &mut got).unwrap();
    let (want, _) = ctx.attention(&d, &q, &q, &q, &Options::default().scale(0.3)).unwrap();
    assert_eq!(got, want);
}

#[test]
fn a_buffer_outlives_its_context() {
    let ctx = cpu();
    let buf = ctx.buffer_from(&[1f32, 2.0, 3.0]).unwrap();
    drop(ctx);
    let mut back = [0f32; 3];
    buf.read(0, &mut back).unwrap();
    assert_eq!(back, [1.0, 2.0, 3.0]);
}

#[test]
fn contexts_move_to_threads() {
    let d = DIMS[1];
    let q = random::<f32>(len(&d.q_shape()), 8);
    let (want, _) = cpu().attention(&d, &q, &q, &q, &Options::default()).unwrap();
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let ctx = cpu(); // created here, used there: Context is Send
            let (q, want) = (q.clone(), want.clone());
            std::thread::spawn(move || {
                for _ in 0..5 {
                    assert_eq!(ctx.attention(&d, &q, &q, &q, &Options::default()).unwrap().0, want);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn context_accessors() {
    let ctx = cpu();
    assert_eq!(ctx.backend().unwrap(), Backend::Cpu);
    assert_eq!(ctx.device().unwrap(), None);
    let kernels = ctx.cpu_kernels().unwrap().expect("a CPU context runs a copy of the CPU kernels");
    assert!(["generic", "avx2", "avx512", "avx512bf16", "amx"].contains(&kernels.name()));
    assert!(ctx.stream().unwrap().is_null());
    ctx.set_num_threads(1).unwrap();
    ctx.synchronize().unwrap();
    // SAFETY: the library refuses a stream for a CPU context before using it.
    let e = unsafe { ctx.set_stream(0x1234 as *mut _) }.unwrap_err();
    assert_eq!(e.status(), Status::INVALID_ARGUMENT);
    assert!(e.message().contains("a CPU context takes no stream"), "{e}");
}

// ---- bad input: an Err carrying the library's message, never a crash ----

#[test]
fn bad_input_gives_the_library_message() {
    let ctx = cpu();
    let d = DIMS[0];
    let q = random::<f32>(len(&d.q_shape()), 9);
    let k = random::<f32>(len(&d.k_shape()), 10);
    let mut out = vec![0f32; q.len()];
    let qv = View::new(&q, &d.q_shape()).unwrap();
    let k16 = View::new(&k, &[2, 53, 2, 16]).unwrap();
    let e = ctx.forward(&qv, &k16, &k16, &mut ViewMut::new(&mut out, &d.q_shape()).unwrap(), None, &Options::default()).unwrap_err();
    assert_eq!(e.status(), Status::INVALID_SHAPE);
    assert_eq!(e.message(), "flashattn_forward: k: head_dim 16 differs from q's 32");
    assert_eq!(e.to_string(), "FLASHATTN_ERROR_INVALID_SHAPE: flashattn_forward: k: head_dim 16 differs from q's 32");

    let kv = View::new(&k, &d.k_shape()).unwrap();
    let e = ctx.supported(&qv, &kv, &kv, &Options::default().scale(f32::INFINITY), false).unwrap_err();
    assert_eq!(e.status(), Status::INVALID_ARGUMENT);
    assert!(e.message().contains("softmax_scale is inf, must be finite"), "{e}");

    // A view larger than its slice never reaches the library (it could not check host memory).
    let e = View::new(&k, &[2, 53, 3, 32]).err().unwrap();
    assert_eq!((e.status(), e.message()), (Status::INVALID_MEMORY, "view: the view spans 40704 bytes, only 27136 are there"));

    let e = ctx.attention(&d, &q[..5], &k, &k, &Options::default()).unwrap_err();
    assert_eq!((e.status(), e.message()), (Status::INVALID_SHAPE, "q: 5 values for shape [2, 37, 4, 32], want 9472"));

    let bf = random::<BF16>(len(&d.k_shape()), 11);
    let e = ctx.forward(&qv, &View::new(&bf, &d.k_shape()).unwrap(), &kv, &mut ViewMut::new(&mut out, &d.q_shape()).unwrap(), None, &Options::default()).unwrap_err();
    assert_eq!(e.status(), Status::INVALID_DTYPE);
    assert_eq!(e.message(), "flashattn_forward: k: dtype bfloat16 differs from q's float32");

    let e = Context::new(Backend::Cuda, 0);
    if flashattn::cuda_device_count().unwrap() == 0 {
        let e = e.unwrap_err();
        assert_eq!(e.status(), Status::BACKEND_UNAVAILABLE);
        assert!(e.message().starts_with("flashattn_context_create: "), "{e}");
    }
}
