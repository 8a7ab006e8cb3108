//! Context parallelism on the CPU backend: ranks as threads, each with its own context and its
//! shard of one sequence, passing shards through an exchange closure over shared memory; each
//! rank's out, lse, dq, dk, dv (and the summed dsinks) against one call over the whole sequence.
//! Then the refusals: a failing or panicking exchange, an odd zigzag shard.
mod common;

use std::sync::{Arc, Barrier, Mutex};

use common::{max_error, random};
use flashattn::{Backend, Context, Gradients, Layout, Options, Ring, Status, Variants, View, ViewMut};

const B: usize = 2;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 16;

/// The global token of each of rank's n local rows.
fn global_rows(ranks: usize, rank: usize, n: usize, layout: Layout) -> Vec<usize> {
    match layout {
        Layout::Contiguous => (rank * n..(rank + 1) * n).collect(),
        Layout::Zigzag => {
            let half = n / 2;
            (rank * half..(rank + 1) * half).chain((2 * ranks - 1 - rank) * half..(2 * ranks - rank) * half).collect()
        }
    }
}

/// Rows `rows` of a [B, tokens, heads, D] tensor.
fn gather(x: &[f32], tokens: usize, heads: usize, rows: &[usize]) -> Vec<f32> {
    let row = heads * D;
    (0..B).flat_map(|b| rows.iter().flat_map(move |&i| x[(b * tokens + i) * row..(b * tokens + i + 1) * row].iter().copied())).collect()
}

/// Rows `rows` of a [B, heads, tokens] LSE.
fn gather_lse(x: &[f32], tokens: usize, rows: &[usize]) -> Vec<f32> {
    (0..B * HQ).flat_map(|bh| rows.iter().map(move |&i| x[bh * tokens + i])).collect()
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Shared memory of the rank threads: post, wait for all, copy the previous rank's, wait again.
struct Shared {
    posted: Mutex<Vec<Vec<u8>>>,
    barrier: Barrier,
}

fn check_ring(ranks: usize, layout: Layout, n: usize, options: Options, sinks: bool) {
    let tokens = ranks * n;
    let (q, k, v, dout) = (random::<f32>(B * tokens * HQ * D, 1), random::<f32>(B * tokens * HKV * D, 2), random::<f32>(B * tokens * HKV * D, 3), random::<f32>(B * tokens * HQ * D, 4));
    let s = random::<f32>(HQ, 5);
    let sv = View::new(&s, &[HQ]).unwrap();
    let variants = Variants { sinks: sinks.then_some(&sv), ..Default::default() };
    let ctx = Context::new(Backend::Cpu, 0).unwrap();
    let (q_shape, k_shape) = ([B, tokens, HQ, D], [B, tokens, HKV, D]);
    let (mut out, mut lse) = (vec![0f32; q.len()], vec![0f32; B * HQ * tokens]);
    let (mut dq, mut dk, mut dv, mut ds) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()], vec![0f32; HQ]);
    {
        let (qv, kv, vv) = (View::new(&q, &q_shape).unwrap(), View::new(&k, &k_shape).unwrap(), View::new(&v, &k_shape).unwrap());
        ctx.forward_ex(&qv, &kv, &vv, &mut ViewMut::new(&mut out, &q_shape).unwrap(), Some(&mut ViewMut::new(&mut lse, &[B, HQ, tokens]).unwrap()), &variants, &options).unwrap();
        let (ov, dov, lv) = (View::new(&out, &q_shape).unwrap(), View::new(&dout, &q_shape).unwrap(), View::new(&lse, &[B, HQ, tokens]).unwrap());
        let (mut a, mut b, mut c, mut d) = (ViewMut::new(&mut dq, &q_shape).unwrap(), ViewMut::new(&mut dk, &k_shape).unwrap(), ViewMut::new(&mut dv, &k_shape).unwrap(), ViewMut::new(&mut ds, &[HQ]).unwrap());
        let grads = Gradients { dq: &mut a, dk: &mut b, dv: &mut c, dsinks: sinks.then_some(&mut d) };
        ctx.backward_ex(&qv, &kv, &vv, &ov, &dov, &lv, grads, &variants, &options).unwrap();
    }

    let shared = Arc::new(Shared { posted: Mutex::new(vec![Vec::new(); ranks]), barrier: Barrier::new(ranks) });
    let inputs = Arc::new((q.clone(), k.clone(), v.clone(), dout.clone(), s.clone()));
    let threads: Vec<_> = (0..ranks)
        .map(|rank| {
            let (shared, inputs) = (shared.clone(), inputs.clone());
            std::thread::spawn(move || {
                let (q, k, v, dout, s) = &*inputs;
                let rows = global_rows(ranks, rank, n, layout);
                let (qs, ks, vs, dos) = (gather(q, tokens, HQ, &rows), gather(k, tokens, HKV, &rows), gather(v, tokens, HKV, &rows), gather(dout, tokens, HQ, &rows));
                let (sq, sk) = ([B, n, HQ, D], [B, n, HKV, D]);
                let mut exchange = |send: &[u8], recv: &mut [u8]| {
                    shared.posted.lock().unwrap()[rank] = send.to_vec();
                    shared.barrier.wait();
                    recv.copy_from_slice(&shared.posted.lock().unwrap()[(rank + ranks - 1) % ranks]);
                    shared.barrier.wait();
                    true
                };
                let mut ring = Ring::exchange(ranks, rank, layout, &mut exchange);
                let ctx = Context::new(Backend::Cpu, 0).unwrap();
                ctx.set_num_threads(1).unwrap();
                let sv = View::new(s, &[HQ]).unwrap();
                let variants = Variants { sinks: sinks.then_some(&sv), ..Default::default() };
                let (qv, kv, vv) = (View::new(&qs, &sq).unwrap(), View::new(&ks, &sk).unwrap(), View::new(&vs, &sk).unwrap());
                let (mut out, mut lse) = (vec![0f32; qs.len()], vec![0f32; B * HQ * n]);
                ctx.ring_forward(&mut ring, &qv, &kv, &vv, &mut ViewMut::new(&mut out, &sq).unwrap(), Some(&mut ViewMut::new(&mut lse, &[B, HQ, n]).unwrap()), &variants, &options).unwrap();
                let (mut dq, mut dk, mut dv, mut ds) = (vec![0f32; qs.len()], vec![0f32; ks.len()], vec![0f32; vs.len()], vec![0f32; HQ]);
                {
                    let (ov, dov, lv) = (View::new(&out, &sq).unwrap(), View::new(&dos, &sq).unwrap(), View::new(&lse, &[B, HQ, n]).unwrap());
                    let (mut a, mut b, mut c, mut d) = (ViewMut::new(&mut dq, &sq).unwrap(), ViewMut::new(&mut dk, &sk).unwrap(), ViewMut::new(&mut dv, &sk).unwrap(), ViewMut::new(&mut ds, &[HQ]).unwrap());
                    let grads = Gradients { dq: &mut a, dk: &mut b, dv: &mut c, dsinks: sinks.then_some(&mut d) };
                    ctx.ring_backward(&mut ring, &qv, &kv, &vv, &ov, &dov, &lv, grads, &variants, &options).unwrap();
                }
                (rows, out, lse, dq, dk, dv, ds)
            })
        })
        .collect();
    let mut ds_sum = vec![0f64; HQ];
    for t in threads {
        let (rows, r_out, r_lse, r_dq, r_dk, r_dv, r_ds) = t.join().unwrap();
        let what = format!("ranks {ranks} {layout:?} n {n}");
        for (name, got, want, tol) in [
            ("out", &r_out, gather(&out, tokens, HQ, &rows), 2e-5),
            ("lse", &r_lse, gather_lse(&lse, tokens, &rows), 2e-5),
            ("dq", &r_dq, gather(&dq, tokens, HQ, &rows), 1e-4),
            ("dk", &r_dk, gather(&dk, tokens, HKV, &rows), 1e-4),
            ("dv", &r_dv, gather(&dv, tokens, HKV, &rows), 1e-4),
        ] {
            let e = max_error(&f64s(got), &f64s(&want));
            assert!(e <= tol, "{what}: {name} differs from one call by {e}");
        }
        for (acc, x) in ds_sum.iter_mut().zip(&r_ds) {
            *acc += *x as f64;
        }
    }
    if sinks {
        let e = max_error(&ds_sum, &f64s(&ds));
        assert!(e <= 1e-4, "ranks {ranks}: the ranks' dsinks sum differs from one call's by {e}");
    }
}

#[test]
fn ring_equals_one_call() {
    for layout in [Layout::Contiguous, Layout::Zigzag] {
        for ranks in [1, 2, 3] {
            for causal in [false, true] {
                check_ring(ranks, layout, 6, Options::default().causal(causal), false);
            }
        }
    }
    check_ring(3, Layout::Zigzag, 10, Options::default().causal(true).window(5, 0), true);
    check_ring(2, Layout::Contiguous, 7, Options::default().window(3, 2).softcap(2.0), true);
}

#[test]
fn a_failing_or_panicking_exchange_fails_the_call() {
    let ctx = Context::new(Backend::Cpu, 0).unwrap();
    let q = random::<f32>(64, 9);
    let qv = View::new(&q, &[1, 4, 2, 8]).unwrap();
    let mut out = vec![0f32; 64];
    let mut refuse = |_: &[u8], _: &mut [u8]| false;
    let mut ring = Ring::exchange(2, 0, Layout::Zigzag, &mut refuse);
    let e = ctx.ring_forward(&mut ring, &qv, &qv, &qv, &mut ViewMut::new(&mut out, &[1, 4, 2, 8]).unwrap(), None, &Variants::default(), &Options::default()).unwrap_err();
    assert_eq!(e.status(), Status::DEVICE, "{e}");
    assert!(e.message().contains("exchange function returned 1"), "{e}");
    let mut panics = |_: &[u8], _: &mut [u8]| -> bool { panic!("the wire is cut") };
    let mut ring = Ring::exchange(2, 1, Layout::Zigzag, &mut panics);
    let e = ctx.ring_forward(&mut ring, &qv, &qv, &qv, &mut ViewMut::new(&mut out, &[1, 4, 2, 8]).unwrap(), None, &Variants::default(), &Options::default()).unwrap_err();
    assert_eq!(e.status(), Status::DEVICE, "{e}");
}

#[test]
fn an_odd_zigzag_shard_is_refused_before_any_exchange() {
    let ctx = Context::new(Backend::Cpu, 0).unwrap();
    let q = random::<f32>(80, 9);
    let qv = View::new(&q, &[1, 5, 2, 8]).unwrap();
    let mut calls = 0;
    let mut count = |_: &[u8], _: &mut [u8]| {
        calls += 1;
        true
    };
    let mut ring = Ring::exchange(2, 0, Layout::Zigzag, &mut count);
    let e = ctx.ring_workspace_size(&mut ring, &qv, &qv, &qv, &Variants::default(), &Options::default(), false).unwrap_err();
    assert_eq!(e.status(), Status::INVALID_SHAPE, "{e}");
    assert!(e.message().contains("odd"), "{e}");
    drop(ring);
    assert_eq!(calls, 0);
}
