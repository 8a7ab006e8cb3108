//! A forward and backward on a CUDA context (through device buffers), against f64 attention with
//! the project's tolerance rule; the standard algorithm of the CPU backend in the same dtype sets
//! the bound. Rust has no way for a test to skip itself at run time, so these are ignored: cargo
//! test reports them as such. On a GPU machine they run with --ignored and fail without a device:
//!   LD_LIBRARY_PATH=<dir of libflashattn.so> ./flashattn_rust_gpu.test --ignored --nocapture
mod common;

use common::*;
use flashattn::{Algorithm, Backend, BF16, Context, DType, Dims, Options, Status, View, ViewMut, F16};

fn gpu() -> Context {
    let devices = flashattn::cuda_device_count().expect("cuda_device_count");
    assert!(
        devices > 0,
        "no CUDA device: libflashattn finds none ({})",
        if flashattn::has_cuda() { "no driver or no device visible" } else { "built without CUDA" }
    );
    Context::new(Backend::Cuda, 0).expect("a CUDA context")
}

const DIMS: [Dims; 2] = [
    Dims { batch: 2, seqlen_q: 128, seqlen_k: 160, heads_q: 4, heads_kv: 2, head_dim: 64 },
    Dims { batch: 1, seqlen_q: 77, seqlen_k: 77, heads_q: 2, heads_kv: 2, head_dim: 128 },
];

fn check<T: Value>(gpu: &Context, cpu: &Context, d: &Dims, causal: bool) {
    let n = |s: &[usize]| s.iter().product::<usize>();
    let (q, k, v, dout) = (
        random::<T>(n(&d.q_shape()), 21),
        random::<T>(n(&d.k_shape()), 22),
        random::<T>(n(&d.k_shape()), 23),
        random::<T>(n(&d.q_shape()), 24),
    );
    let (qf, kf, vf, df) = (to_f64(&q), to_f64(&k), to_f64(&v), to_f64(&dout));
    let scale = 1.0 / (d.head_dim as f64).sqrt();
    let options = Options::default().causal(causal);
    let standard = options.algorithm(Algorithm::Standard);
    let what = format!("{d:?} {:?} causal={causal}", T::DTYPE);

    let (out, lse) = gpu.attention(d, &q, &k, &v, &options).expect("GPU forward");
    let (std_out, std_lse) = cpu.attention(d, &q, &k, &v, &standard).expect("CPU standard forward");
    let (ref_out, _) = naive(d, &qf, &kf, &vf, causal, scale, exact);
    assert_within(&format!("{what}: out"), &to_f64(&out), &ref_out, &to_f64(&std_out), atol(T::DTYPE));

    let grads = gpu.attention_backward(d, &q, &k, &v, &out, &dout, &lse, &options).expect("GPU backward");
    let stds = cpu.attention_backward(d, &q, &k, &v, &std_out, &dout, &std_lse, &standard).expect("CPU standard backward");
    let refs = naive_backward(d, &qf, &kf, &vf, &df, causal, scale, exact);
    for (name, ours, r, s) in [("dq", &grads.0, &refs[0], &stds.0), ("dk", &grads.1, &refs[1], &stds.1), ("dv", &grads.2, &refs[2], &stds.2)] {
        assert_within(&format!("{what}: {name}"), &to_f64(ours), r, &to_f64(s), atol(T::DTYPE));
    }
}

#[test]
#[ignore = "needs a CUDA device: run with --ignored on a machine with one"]
fn gpu_forward_backward() {
    let gpu = gpu();
    let cpu = Context::new(Backend::Cpu, 0).unwrap();
    for d in &DIMS {
        for causal in [false, true] {
            check::<F16>(&gpu, &cpu, d, causal);
            check::<BF16>(&gpu, &cpu, d, causal);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device: run with --ignored on a machine with one"]
fn gpu_buffers_and_errors() {
    let gpu = gpu();
    let d = Dims { batch: 1, seqlen_q: 64, seqlen_k: 64, heads_q: 2, heads_kv: 2, head_dim: 64 };
    let q = random::<F16>(d.q_shape().iter().product(), 25);
    let (want, _) = gpu.attention(&d, &q, &q, &q, &Options::default()).unwrap();

    let qb = gpu.buffer_from(&q).unwrap();
    let mut ob = gpu.buffer(qb.size()).unwrap();
    let view = View::of_buffer(&qb, 0, DType::F16, &d.q_shape(), None).unwrap();
    let mut out = ViewMut::of_buffer(&mut ob, 0, DType::F16, &d.q_shape(), None).unwrap();
    gpu.forward(&view, &view, &view, &mut out, None, &Options::default()).unwrap();
    gpu.synchronize().unwrap();
    let mut got = vec![F16::default(); q.len()];
    ob.read(0, &mut got).unwrap();
    assert_eq!(got, want);
    assert!(!gpu.stream().unwrap().is_null());
    assert_eq!(gpu.device().unwrap(), Some(0));

    // Host memory given to a CUDA context: the library's message, not a crash.
    let mut host_out = vec![F16::default(); q.len()];
    let e = gpu
        .forward(&View::new(&q, &d.q_shape()).unwrap(), &view, &view, &mut ViewMut::new(&mut host_out, &d.q_shape()).unwrap(), None, &Options::default())
        .unwrap_err();
    assert_eq!(e.status(), Status::INVALID_MEMORY, "{e}");
    assert!(e.message().starts_with("flashattn_forward: q: "), "{e}");
    let f32s = vec![0f32; q.len()];
    let e = gpu.attention(&d, &f32s, &f32s, &f32s, &Options::default()).unwrap_err();
    assert!(e.message().starts_with("flashattn_forward: "), "float32 on the GPU: {e}");
}

/// Merge on a CUDA context against the CPU backend's merge of the same parts: the same
/// arithmetic in f32, so at most about one unit in the last place of the dtype apart.
fn check_merge<T: Value>(gpu: &Context, cpu: &Context) {
    let d = Dims { batch: 2, seqlen_q: 33, seqlen_k: 1, heads_q: 4, heads_kv: 4, head_dim: 64 };
    const PARTS: usize = 5;
    let outs = random::<T>(PARTS * d.q_shape().iter().product::<usize>(), 31);
    let lses: Vec<f32> = to_f64(&random::<f32>(PARTS * d.lse_shape().iter().product::<usize>(), 32))
        .iter()
        .enumerate()
        .map(|(i, &x)| if i % 7 == 0 { f32::NEG_INFINITY } else { 3.0 * x as f32 })
        .collect();
    let (g_out, g_lse) = gpu.merge_parts(&d, PARTS, &outs, &lses).expect("GPU merge");
    let (c_out, c_lse) = cpu.merge_parts(&d, PARTS, &outs, &lses).expect("CPU merge");
    let ulp = if T::DTYPE == DType::F16 { 1.0 / 1024.0 } else { 1.0 / 128.0 };
    let worst = to_f64(&g_out).iter().zip(to_f64(&c_out)).map(|(g, c)| (g - c).abs() / c.abs().max(1.0)).fold(0.0, f64::max);
    assert!(worst <= 2.0 * ulp, "{:?}: GPU and CPU merges differ by {worst}", T::DTYPE);
    for (g, c) in g_lse.iter().zip(&c_lse) {
        assert!(g == c || (g - c).abs() <= 1e-5 * c.abs().max(1.0), "{:?}: merged LSEs {g} and {c}", T::DTYPE);
    }
}

#[test]
#[ignore = "needs a CUDA device: run with --ignored on a machine with one"]
fn gpu_merge() {
    let gpu = gpu();
    let cpu = Context::new(Backend::Cpu, 0).unwrap();
    check_merge::<F16>(&gpu, &cpu);
    check_merge::<BF16>(&gpu, &cpu);
}
