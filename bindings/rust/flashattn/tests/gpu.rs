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
    assert_eq!(gpu.cpu_kernels().unwrap(), None);

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

/// The KV cache on a CUDA context, a decode step appending one row: out and the cache must be
/// the CPU backend's, up to the dtype's rounding (the CUDA backend has a KV cache path, so
/// UNSUPPORTED is a failure).
#[test]
#[ignore = "needs a CUDA device: run with --ignored on a machine with one"]
fn gpu_kvcache() {
    use flashattn::KvCache;
    let gpu = gpu();
    let cpu = Context::new(Backend::Cpu, 0).unwrap();
    let (b, capacity, hq, hkv, d) = (2usize, 64usize, 4usize, 2usize, 64usize);
    let (qs, cs, ns, ls) = ([b, 1, hq, d], [b, capacity, hkv, d], [b, 1, hkv, d], [b, hq, 1]);
    let n = |s: &[usize]| s.iter().product::<usize>();
    let (q, k, v) = (random::<F16>(n(&qs), 41), random::<F16>(n(&cs), 42), random::<F16>(n(&cs), 43));
    let (k_new, v_new, held) = (random::<F16>(n(&ns), 44), random::<F16>(n(&ns), 45), [10i32, 40]);
    let options = Options::default().causal(true);

    // The CPU's result over host slices.
    let (mut ck, mut cv, mut c_out, mut c_lse) = (k.clone(), v.clone(), vec![F16::default(); n(&qs)], vec![0f32; n(&ls)]);
    {
        let (hv, knv, vnv) = (View::new(&held, &[b]).unwrap(), View::new(&k_new, &ns).unwrap(), View::new(&v_new, &ns).unwrap());
        cpu.forward_kvcache(
            &View::new(&q, &qs).unwrap(), &mut ViewMut::new(&mut ck, &cs).unwrap(), &mut ViewMut::new(&mut cv, &cs).unwrap(),
            &mut ViewMut::new(&mut c_out, &qs).unwrap(), Some(&mut ViewMut::new(&mut c_lse, &ls).unwrap()),
            &KvCache::new(&hv).append(&knv, &vnv), &flashattn::Variants::default(), &options,
        )
        .expect("CPU KV cache forward");
    }

    let (qb, kn_b, vn_b, held_b) = (gpu.buffer_from(&q).unwrap(), gpu.buffer_from(&k_new).unwrap(), gpu.buffer_from(&v_new).unwrap(), gpu.buffer_from(&held).unwrap());
    let (mut kb, mut vb) = (gpu.buffer_from(&k).unwrap(), gpu.buffer_from(&v).unwrap());
    let (mut ob, mut lb) = (gpu.buffer(n(&qs) * 2).unwrap(), gpu.buffer(n(&ls) * 4).unwrap());
    let result = {
        let view = |buf, dtype, shape: &[usize]| View::of_buffer(buf, 0, dtype, shape, None).unwrap();
        let (qv, knv, vnv, hv) = (view(&qb, DType::F16, &qs), view(&kn_b, DType::F16, &ns), view(&vn_b, DType::F16, &ns), view(&held_b, DType::I32, &[b]));
        gpu.forward_kvcache(
            &qv, &mut ViewMut::of_buffer(&mut kb, 0, DType::F16, &cs, None).unwrap(), &mut ViewMut::of_buffer(&mut vb, 0, DType::F16, &cs, None).unwrap(),
            &mut ViewMut::of_buffer(&mut ob, 0, DType::F16, &qs, None).unwrap(), Some(&mut ViewMut::of_buffer(&mut lb, 0, DType::F32, &ls, None).unwrap()),
            &KvCache::new(&hv).append(&knv, &vnv), &flashattn::Variants::default(), &options,
        )
    };
    gpu.synchronize().unwrap();
    let (mut gk, mut gv) = (vec![F16::default(); k.len()], vec![F16::default(); v.len()]);
    kb.read(0, &mut gk).unwrap();
    vb.read(0, &mut gv).unwrap();
    if let Err(e) = result {
        panic!("GPU KV cache forward: {e}");
    }
    // Appending copies rows: the caches agree bit for bit.
    assert!(gk == ck && gv == cv, "the GPU's cache after the call differs from the CPU's");
    let mut g_out = vec![F16::default(); n(&qs)];
    ob.read(0, &mut g_out).unwrap();
    let ulp = 1.0 / 1024.0;
    let worst = to_f64(&g_out).iter().zip(to_f64(&c_out)).map(|(g, c)| (g - c).abs() / c.abs().max(1.0)).fold(0.0, f64::max);
    assert!(worst <= 4.0 * ulp, "GPU and CPU KV cache outputs differ by {worst}");
}
