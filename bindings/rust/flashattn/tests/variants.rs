//! The attention variants on the CPU backend through the `_ex` calls: each variant's forward and
//! backward against the header's definition in f64, a variable-length batch against
//! per-sequence calls, dsinks against finite differences, bad values refused with the library's
//! status and message.
mod common;

use common::{max_error, random};
use flashattn::{Backend, Context, Gradients, Options, Status, Variants, View, ViewMut};

fn cpu() -> Context {
    Context::new(Backend::Cpu, 0).expect("a CPU context")
}

/// Sizes of one fixed-length call, v with its own head_dim.
#[derive(Clone, Copy)]
struct Shape {
    b: usize,
    nq: usize,
    nk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
}

impl Shape {
    fn q(&self) -> [usize; 4] {
        [self.b, self.nq, self.hq, self.d]
    }
    fn k(&self) -> [usize; 4] {
        [self.b, self.nk, self.hkv, self.d]
    }
    fn v(&self) -> [usize; 4] {
        [self.b, self.nk, self.hkv, self.dv]
    }
    fn out(&self) -> [usize; 4] {
        [self.b, self.nq, self.hq, self.dv]
    }
    fn lse(&self) -> [usize; 3] {
        [self.b, self.hq, self.nq]
    }
}

#[derive(Clone, Default)]
struct Variant {
    causal: bool,
    window: Option<(i32, i32)>,
    softcap: Option<f64>,
    alibi: Option<Vec<f64>>, // [hq] or [b * hq]
    sinks: Option<Vec<f64>>,
}

struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dsinks: Vec<f64>,
}

/// The header's definition in f64: per query head h, query i, key j, diag = nk - nq:
/// x = scale q.k, then c tanh(x / c) with a softcap, minus slope_h |i + diag - j| with ALiBi;
/// keys hidden by causal or the window; Z = e^sink_h + the sum of e^x over the visible keys; a
/// row that sees no key: out 0, lse -inf, no gradient.
fn reference(s: Shape, q: &[f64], k: &[f64], v: &[f64], dout: &[f64], va: &Variant) -> Reference {
    let g = s.hq / s.hkv;
    let scale = 1.0 / (s.d as f64).sqrt();
    let qi = |b: usize, i: usize, h: usize, c: usize| ((b * s.nq + i) * s.hq + h) * s.d + c;
    let ki = |b: usize, j: usize, h: usize, c: usize| ((b * s.nk + j) * s.hkv + h) * s.d + c;
    let vi = |b: usize, j: usize, h: usize, c: usize| ((b * s.nk + j) * s.hkv + h) * s.dv + c;
    let oi = |b: usize, i: usize, h: usize, c: usize| ((b * s.nq + i) * s.hq + h) * s.dv + c;
    let mut r = Reference {
        out: vec![0.0; s.b * s.nq * s.hq * s.dv],
        lse: vec![0.0; s.b * s.hq * s.nq],
        dq: vec![0.0; q.len()],
        dk: vec![0.0; k.len()],
        dv: vec![0.0; v.len()],
        dsinks: vec![0.0; s.hq],
    };
    let diag = s.nk as i64 - s.nq as i64;
    for b in 0..s.b {
        for h in 0..s.hq {
            let hk = h / g;
            for i in 0..s.nq {
                let mut x = vec![f64::NEG_INFINITY; s.nk];
                let mut dcap = vec![1.0; s.nk];
                for j in 0..s.nk {
                    let rel = i as i64 + diag - j as i64;
                    let mut visible = !(va.causal && rel < 0);
                    if let Some((left, right)) = va.window {
                        visible &= (left < 0 || rel <= left as i64) && (right < 0 || -rel <= right as i64);
                    }
                    if !visible {
                        continue;
                    }
                    let mut t = (0..s.d).map(|c| q[qi(b, i, h, c)] * k[ki(b, j, hk, c)]).sum::<f64>() * scale;
                    if let Some(cap) = va.softcap {
                        let th = (t / cap).tanh();
                        t = cap * th;
                        dcap[j] = 1.0 - th * th;
                    }
                    if let Some(a) = &va.alibi {
                        let slope = if a.len() > s.hq { a[b * s.hq + h] } else { a[h] };
                        t -= slope * (rel as f64).abs();
                    }
                    x[j] = t;
                }
                let li = (b * s.hq + h) * s.nq + i;
                let mut m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    r.lse[li] = f64::NEG_INFINITY;
                    continue;
                }
                let sink = va.sinks.as_ref().map(|s| s[h]);
                if let Some(sk) = sink {
                    m = m.max(sk);
                }
                let z = x.iter().map(|&t| (t - m).exp()).sum::<f64>() + sink.map_or(0.0, |sk| (sk - m).exp());
                r.lse[li] = m + z.ln();
                let p: Vec<f64> = x.iter().map(|&t| (t - r.lse[li]).exp()).collect();
                for j in 0..s.nk {
                    for c in 0..s.dv {
                        r.out[oi(b, i, h, c)] += p[j] * v[vi(b, j, hk, c)];
                    }
                }
                let delta: f64 = (0..s.dv).map(|c| dout[oi(b, i, h, c)] * r.out[oi(b, i, h, c)]).sum();
                for j in 0..s.nk {
                    if p[j] == 0.0 {
                        continue;
                    }
                    let mut dp = 0.0;
                    for c in 0..s.dv {
                        dp += dout[oi(b, i, h, c)] * v[vi(b, j, hk, c)];
                        r.dv[vi(b, j, hk, c)] += p[j] * dout[oi(b, i, h, c)];
                    }
                    let ds = p[j] * (dp - delta) * dcap[j] * scale;
                    for c in 0..s.d {
                        r.dq[qi(b, i, h, c)] += ds * k[ki(b, j, hk, c)];
                        r.dk[ki(b, j, hk, c)] += ds * q[qi(b, i, h, c)];
                    }
                }
                if let Some(sk) = sink {
                    r.dsinks[h] -= (sk - r.lse[li]).exp() * delta;
                }
            }
        }
    }
    r
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// fp32 results against f64, relative to the reference's largest magnitude.
fn assert_close(what: &str, ours: &[f32], reference: &[f64]) {
    assert_eq!(ours.len(), reference.len(), "{what}: length");
    let big = reference.iter().filter(|x| x.is_finite()).fold(1.0f64, |m, x| m.max(x.abs()));
    let err = max_error(&f64s(ours), reference);
    assert!(err <= 2e-4 * big, "{what}: max error {err:.3e} exceeds {:.3e}", 2e-4 * big);
}

fn options_of(va: &Variant) -> Options {
    let mut o = Options::default().causal(va.causal);
    o.window = va.window;
    o.softcap = va.softcap.map(|c| c as f32);
    o
}

/// Forward and backward of one fixed-length call through views of host slices.
fn run(ctx: &Context, s: Shape, va: &Variant, seed: u64) -> ([Vec<f32>; 6], Reference) {
    let len = |shape: &[usize]| shape.iter().product::<usize>();
    let q: Vec<f32> = random(len(&s.q()), seed);
    let k: Vec<f32> = random(len(&s.k()), seed + 1);
    let v: Vec<f32> = random(len(&s.v()), seed + 2);
    let dout: Vec<f32> = random(len(&s.out()), seed + 3);
    let alibi = va.alibi.as_ref().map(|a| f32s(a));
    let sinks = va.sinks.as_ref().map(|a| f32s(a));
    let alibi_view = alibi.as_ref().map(|a| {
        let shape: &[usize] = if a.len() > s.hq { &[s.b, s.hq] } else { &[s.hq] };
        View::new(a, shape).unwrap()
    });
    let sinks_view = sinks.as_ref().map(|a| View::new(a, &[s.hq]).unwrap());
    let variants = Variants { alibi_slopes: alibi_view.as_ref(), sinks: sinks_view.as_ref(), ..Variants::default() };
    let options = options_of(va);
    let (qv, kv, vv) = (View::new(&q, &s.q()).unwrap(), View::new(&k, &s.k()).unwrap(), View::new(&v, &s.v()).unwrap());
    let mut out = vec![0f32; len(&s.out())];
    let mut lse = vec![0f32; len(&s.lse())];
    ctx.forward_ex(&qv, &kv, &vv, &mut ViewMut::new(&mut out, &s.out()).unwrap(), Some(&mut ViewMut::new(&mut lse, &s.lse()).unwrap()), &variants, &options)
        .expect("forward_ex");
    let (mut dq, mut dk, mut dv, mut dsinks) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()], vec![0f32; s.hq]);
    {
        let (mut dqv, mut dkv, mut dvv) =
            (ViewMut::new(&mut dq, &s.q()).unwrap(), ViewMut::new(&mut dk, &s.k()).unwrap(), ViewMut::new(&mut dv, &s.v()).unwrap());
        let mut dsv = ViewMut::new(&mut dsinks, &[s.hq]).unwrap();
        let grads = Gradients { dq: &mut dqv, dk: &mut dkv, dv: &mut dvv, dsinks: sinks.as_ref().map(|_| &mut dsv) };
        let (ov, lv, dov) = (View::new(&out, &s.out()).unwrap(), View::new(&lse, &s.lse()).unwrap(), View::new(&dout, &s.out()).unwrap());
        ctx.backward_ex(&qv, &kv, &vv, &ov, &dov, &lv, grads, &variants, &options).expect("backward_ex");
    }
    let r = reference(s, &f64s(&q), &f64s(&k), &f64s(&v), &f64s(&dout), va);
    ([out, lse, dq, dk, dv, dsinks], r)
}

const SHAPE: Shape = Shape { b: 2, nq: 21, nk: 29, hq: 4, hkv: 2, d: 16, dv: 16 };

#[test]
fn each_variant_matches_f64() {
    let ctx = cpu();
    let cases: Vec<(&str, Shape, Variant)> = vec![
        ("window", SHAPE, Variant { window: Some((5, 3)), ..Variant::default() }),
        ("window_left_only", SHAPE, Variant { window: Some((7, -1)), ..Variant::default() }),
        ("window_causal", SHAPE, Variant { window: Some((6, 4)), causal: true, ..Variant::default() }),
        ("softcap", SHAPE, Variant { softcap: Some(0.7), ..Variant::default() }),
        ("alibi_per_head", SHAPE, Variant { alibi: Some(vec![0.5, 0.25, 0.125, 0.0625]), ..Variant::default() }),
        ("alibi_per_batch", SHAPE, Variant { alibi: Some(vec![0.5, 0.1, 0.3, 0.2, 0.05, 0.4, 0.0, 1.0]), ..Variant::default() }),
        ("sinks", SHAPE, Variant { sinks: Some(vec![0.5, -1.0, 2.0, 0.0]), ..Variant::default() }),
        ("head_dim_v", Shape { d: 24, dv: 40, ..SHAPE }, Variant { causal: true, ..Variant::default() }),
        (
            "all",
            SHAPE,
            Variant {
                causal: true,
                window: Some((9, 2)),
                softcap: Some(2.0),
                alibi: Some(vec![0.3, 0.2, 0.1, 0.05]),
                sinks: Some(vec![1.0, 0.0, -0.5, 3.0]),
            },
        ),
    ];
    for (n, (name, s, va)) in cases.iter().enumerate() {
        let ([out, lse, dq, dk, dv, dsinks], r) = run(&ctx, *s, va, 10 * n as u64 + 1);
        for (what, ours, reference) in [("out", &out, &r.out), ("lse", &lse, &r.lse), ("dq", &dq, &r.dq), ("dk", &dk, &r.dk), ("dv", &dv, &r.dv)] {
            assert_close(&format!("{name}: {what}"), ours, reference);
        }
        if va.sinks.is_some() {
            assert_close(&format!("{name}: dsinks"), &dsinks, &r.dsinks);
        }
    }
}

#[test]
fn dsinks_match_finite_differences() {
    let ctx = cpu();
    let s = Shape { b: 1, nq: 12, nk: 15, hq: 2, hkv: 1, d: 8, dv: 8 };
    let va = Variant { sinks: Some(vec![0.3, -0.8]), ..Variant::default() };
    let ([_, _, _, _, _, dsinks], _) = run(&ctx, s, &va, 11);
    let q: Vec<f32> = random(s.nq * s.hq * s.d, 11);
    let k: Vec<f32> = random(s.nk * s.hkv * s.d, 12);
    let v: Vec<f32> = random(s.nk * s.hkv * s.dv, 13);
    let dout: Vec<f32> = random(s.nq * s.hq * s.dv, 14);
    let loss = |sinks: &[f32]| -> f64 {
        let sv = View::new(sinks, &[s.hq]).unwrap();
        let mut out = vec![0f32; dout.len()];
        ctx.forward_ex(
            &View::new(&q, &s.q()).unwrap(), &View::new(&k, &s.k()).unwrap(), &View::new(&v, &s.v()).unwrap(),
            &mut ViewMut::new(&mut out, &s.out()).unwrap(), None, &Variants { sinks: Some(&sv), ..Variants::default() }, &Options::default(),
        )
        .unwrap();
        out.iter().zip(&dout).map(|(&o, &d)| o as f64 * d as f64).sum()
    };
    let eps = 1e-2f32;
    for h in 0..2 {
        let (mut plus, mut minus) = ([0.3f32, -0.8], [0.3f32, -0.8]);
        plus[h] += eps;
        minus[h] -= eps;
        let numeric = (loss(&plus) - loss(&minus)) / (2.0 * eps as f64);
        let got = dsinks[h] as f64;
        assert!((got - numeric).abs() <= 2e-3 + 1e-2 * numeric.abs(), "dsinks[{h}] = {got}, finite differences {numeric}");
    }
}

#[test]
fn varlen_matches_per_sequence_calls() {
    let ctx = cpu();
    let (lens_q, lens_k) = ([7usize, 0, 13, 5], [9usize, 4, 13, 0]); // an empty query side, an empty key side
    let offsets = |lens: &[usize]| -> Vec<i32> {
        let mut o = vec![0i32];
        for &l in lens {
            o.push(o.last().unwrap() + l as i32);
        }
        o
    };
    let (cu_q, cu_k) = (offsets(&lens_q), offsets(&lens_k));
    let (hq, hkv, d, dvd) = (4usize, 2usize, 16usize, 8usize);
    let (tq, tk) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
    let q: Vec<f32> = random(tq * hq * d, 3);
    let k: Vec<f32> = random(tk * hkv * d, 4);
    let v: Vec<f32> = random(tk * hkv * dvd, 5);
    let dout: Vec<f32> = random(tq * hq * dvd, 6);
    let sinks = [0.2f32, -0.4, 1.0, 0.0];
    let options = Options::default().causal(true).window(5, -1).softcap(3.0);
    let (cqv, ckv, sv) = (View::new(&cu_q, &[5]).unwrap(), View::new(&cu_k, &[5]).unwrap(), View::new(&sinks, &[4]).unwrap());
    let variants = Variants { sinks: Some(&sv), cu_seqlens_q: Some(&cqv), cu_seqlens_k: Some(&ckv), max_seqlen_q: 13, max_seqlen_k: 13, ..Variants::default() };
    let (qv, kv, vv) = (View::new(&q, &[tq, hq, d]).unwrap(), View::new(&k, &[tk, hkv, d]).unwrap(), View::new(&v, &[tk, hkv, dvd]).unwrap());
    let mut out = vec![0f32; tq * hq * dvd];
    let mut lse = vec![0f32; hq * tq];
    ctx.forward_ex(&qv, &kv, &vv, &mut ViewMut::new(&mut out, &[tq, hq, dvd]).unwrap(), Some(&mut ViewMut::new(&mut lse, &[hq, tq]).unwrap()), &variants, &options)
        .expect("varlen forward");
    let (mut dq, mut dk, mut dv, mut dsinks) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()], vec![0f32; 4]);
    {
        let (mut a, mut b, mut c, mut e) = (
            ViewMut::new(&mut dq, &[tq, hq, d]).unwrap(),
            ViewMut::new(&mut dk, &[tk, hkv, d]).unwrap(),
            ViewMut::new(&mut dv, &[tk, hkv, dvd]).unwrap(),
            ViewMut::new(&mut dsinks, &[4]).unwrap(),
        );
        let (ov, lv, dov) = (View::new(&out, &[tq, hq, dvd]).unwrap(), View::new(&lse, &[hq, tq]).unwrap(), View::new(&dout, &[tq, hq, dvd]).unwrap());
        ctx.backward_ex(&qv, &kv, &vv, &ov, &dov, &lv, Gradients { dq: &mut a, dk: &mut b, dv: &mut c, dsinks: Some(&mut e) }, &variants, &options)
            .expect("varlen backward");
    }
    let mut dsinks_sum = [0f64; 4];
    let one_sinks = Variants { sinks: Some(&sv), ..Variants::default() };
    for bi in 0..4 {
        let (q0, q1, k0, k1) = (cu_q[bi] as usize, cu_q[bi + 1] as usize, cu_k[bi] as usize, cu_k[bi + 1] as usize);
        if q0 == q1 {
            continue;
        }
        if k0 == k1 {
            assert!(out[q0 * hq * dvd..q1 * hq * dvd].iter().all(|&x| x == 0.0), "sequence {bi}: out of rows that see no key");
            assert!(dq[q0 * hq * d..q1 * hq * d].iter().all(|&x| x == 0.0), "sequence {bi}: dq of rows that see no key");
            assert!((0..hq).all(|h| lse[h * tq + q0..h * tq + q1].iter().all(|x| *x == f32::NEG_INFINITY)));
            continue;
        }
        let (nq, nk) = (q1 - q0, k1 - k0);
        let (sq, sk, svv, sd) = (&q[q0 * hq * d..q1 * hq * d], &k[k0 * hkv * d..k1 * hkv * d], &v[k0 * hkv * dvd..k1 * hkv * dvd], &dout[q0 * hq * dvd..q1 * hq * dvd]);
        let (qs, ks, vs, os) = ([1, nq, hq, d], [1, nk, hkv, d], [1, nk, hkv, dvd], [1, nq, hq, dvd]);
        let (q1v, k1v, v1v) = (View::new(sq, &qs).unwrap(), View::new(sk, &ks).unwrap(), View::new(svv, &vs).unwrap());
        let mut o1 = vec![0f32; nq * hq * dvd];
        let mut l1 = vec![0f32; hq * nq];
        ctx.forward_ex(&q1v, &k1v, &v1v, &mut ViewMut::new(&mut o1, &os).unwrap(), Some(&mut ViewMut::new(&mut l1, &[1, hq, nq]).unwrap()), &one_sinks, &options).unwrap();
        let (mut g1q, mut g1k, mut g1v, mut g1s) = (vec![0f32; sq.len()], vec![0f32; sk.len()], vec![0f32; svv.len()], vec![0f32; 4]);
        {
            let (mut a, mut b, mut c, mut e) = (
                ViewMut::new(&mut g1q, &qs).unwrap(),
                ViewMut::new(&mut g1k, &ks).unwrap(),
                ViewMut::new(&mut g1v, &vs).unwrap(),
                ViewMut::new(&mut g1s, &[4]).unwrap(),
            );
            let (ov, lv, dov) = (View::new(&o1, &os).unwrap(), View::new(&l1, &[1, hq, nq]).unwrap(), View::new(sd, &os).unwrap());
            ctx.backward_ex(&q1v, &k1v, &v1v, &ov, &dov, &lv, Gradients { dq: &mut a, dk: &mut b, dv: &mut c, dsinks: Some(&mut e) }, &one_sinks, &options)
                .unwrap();
        }
        let near = |what: &str, packed: &[f32], single: &[f32]| {
            let e = max_error(&f64s(packed), &f64s(single));
            assert!(e <= 1e-5, "sequence {bi}: {what} differs from the per-sequence call by {e}");
        };
        near("out", &out[q0 * hq * dvd..q1 * hq * dvd], &o1);
        let lse_seq: Vec<f32> = (0..hq).flat_map(|h| lse[h * tq + q0..h * tq + q1].to_vec()).collect();
        near("lse", &lse_seq, &l1);
        near("dq", &dq[q0 * hq * d..q1 * hq * d], &g1q);
        near("dk", &dk[k0 * hkv * d..k1 * hkv * d], &g1k);
        near("dv", &dv[k0 * hkv * dvd..k1 * hkv * dvd], &g1v);
        for h in 0..4 {
            dsinks_sum[h] += g1s[h] as f64;
        }
    }
    let e = max_error(&f64s(&dsinks), &dsinks_sum);
    assert!(e <= 1e-4, "dsinks differ from the per-sequence sum by {e}");
}

#[test]
fn bad_variant_values_are_refused() {
    let ctx = cpu();
    let s = Shape { b: 2, nq: 8, nk: 8, hq: 4, hkv: 2, d: 16, dv: 16 };
    let q: Vec<f32> = random(2 * 8 * 4 * 16, 1);
    let k: Vec<f32> = random(2 * 8 * 2 * 16, 2);
    let (qv, kv) = (View::new(&q, &s.q()).unwrap(), View::new(&k, &s.k()).unwrap());
    let refused = |variants: &Variants, options: &Options, status: Status, fragment: &str| {
        let mut out = vec![0f32; q.len()];
        let e = ctx.forward_ex(&qv, &kv, &kv, &mut ViewMut::new(&mut out, &s.out()).unwrap(), None, variants, options).expect_err(fragment);
        assert_eq!(e.status(), status, "{e}");
        assert!(e.message().contains(fragment), "{e}");
        assert!(e.message().starts_with("flashattn_forward_ex: "), "{e}");
        let e = ctx.supported_ex(&qv, &kv, &kv, variants, options, true);
        // supported_ex reads no data: the offsets' values are not checked there.
        if !fragment.contains("cu_seqlens_q[") && !fragment.contains("sequence 0") {
            assert_eq!(e.expect_err(fragment).status(), status);
        }
    };
    let none = Variants::default();
    refused(&none, &Options::default().window(-2, 0), Status::INVALID_ARGUMENT, "options: window_left is -2, must be >= 0, or -1 for no bound on that side");
    refused(&none, &Options::default().window(3, -5), Status::INVALID_ARGUMENT, "options: window_right is -5");
    refused(&none, &Options::default().softcap(-1.0), Status::INVALID_ARGUMENT, "options: softcap is -1, must be 0 (none) or a finite cap > 0");
    refused(&none, &Options::default().softcap(f32::NAN), Status::INVALID_ARGUMENT, "options: softcap is nan");
    refused(&none, &Options::default().softcap(f32::INFINITY), Status::INVALID_ARGUMENT, "options: softcap is inf");
    refused(&none, &Options::default().num_splits(-1), Status::INVALID_ARGUMENT, "options: num_splits is -1, must be 0 (the library chooses) or a number of parts > 0");
    let three = [1f32, 2.0, 3.0];
    let bad_slopes = View::new(&three, &[3]).unwrap();
    refused(&Variants { alibi_slopes: Some(&bad_slopes), ..none }, &Options::default(), Status::INVALID_SHAPE, "alibi_slopes: shape [3], expected [heads_q] = [4] or [batch, heads_q] = [2, 4]");
    let ints = [0i32; 4];
    let int_sinks = View::new(&ints, &[4]).unwrap();
    refused(&Variants { sinks: Some(&int_sinks), ..none }, &Options::default(), Status::INVALID_DTYPE, "sinks: dtype int32, must be float32");
    refused(&Variants { sinks: Some(&bad_slopes), ..none }, &Options::default(), Status::INVALID_SHAPE, "sinks: shape [3], expected [heads_q] = [4]");
    refused(&Variants { max_seqlen_q: 8, ..none }, &Options::default(), Status::INVALID_ARGUMENT, "args: max_seqlen_q is 8 but there are no offsets");

    // Variable-length: q [16, 4, 16], k [16, 2, 16].
    let (pq, pk) = (View::new(&q, &[16, 4, 16]).unwrap(), View::new(&k, &[16, 2, 16]).unwrap());
    let packed_refused = |variants: &Variants, status: Status, fragment: &str| {
        let mut out = vec![0f32; q.len()];
        let e = ctx.forward_ex(&pq, &pk, &pk, &mut ViewMut::new(&mut out, &[16, 4, 16]).unwrap(), None, variants, &Options::default()).expect_err(fragment);
        assert_eq!((e.status(), e.message().contains(fragment)), (status, true), "{e}");
        assert!(out.iter().all(|&x| x == 0.0), "a rejected call wrote out");
    };
    let (good, float_offsets, decreasing, past, two) = ([0i32, 8, 16], [0f32, 8.0, 16.0], [0i32, 9, 8], [0i32, 8, 17], [0i32, 8]);
    let (gv, fv, dv, pv, tv) = (
        View::new(&good, &[3]).unwrap(),
        View::new(&float_offsets, &[3]).unwrap(),
        View::new(&decreasing, &[3]).unwrap(),
        View::new(&past, &[3]).unwrap(),
        View::new(&two, &[2]).unwrap(),
    );
    let varlen = |cq, ck, mq, mk| Variants { cu_seqlens_q: cq, cu_seqlens_k: ck, max_seqlen_q: mq, max_seqlen_k: mk, ..Variants::default() };
    packed_refused(&varlen(Some(&fv), Some(&gv), 8, 8), Status::INVALID_DTYPE, "cu_seqlens_q: dtype float32, must be int32");
    packed_refused(&varlen(Some(&gv), None, 8, 8), Status::INVALID_ARGUMENT, "cu_seqlens_k is NULL but cu_seqlens_q is given");
    packed_refused(&varlen(Some(&gv), Some(&tv), 8, 8), Status::INVALID_SHAPE, "cu_seqlens_k: 2 offsets differ from cu_seqlens_q's 3");
    packed_refused(&varlen(Some(&gv), Some(&gv), 7, 8), Status::INVALID_SHAPE, "sequence 0 has 8 queries, more than max_seqlen_q = 7");
    packed_refused(&varlen(Some(&gv), Some(&gv), 8, 17), Status::INVALID_SHAPE, "args: max_seqlen_k is 17, more than k's 16 tokens");
    packed_refused(&varlen(Some(&dv), Some(&gv), 9, 8), Status::INVALID_SHAPE, "cu_seqlens_q[2] is 8, below cu_seqlens_q[1] = 9; the offsets must not decrease");
    packed_refused(&varlen(Some(&gv), Some(&pv), 8, 9), Status::INVALID_SHAPE, "cu_seqlens_k[2] is 17, past the end of k's 16 tokens");
    assert!(ctx.workspace_size_ex(&pq, &pk, &pk, &varlen(Some(&gv), Some(&gv), 8, 8), &Options::default(), true).is_ok());
}
