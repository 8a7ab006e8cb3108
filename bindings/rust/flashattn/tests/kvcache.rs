//! Context::forward_kvcache on the CPU backend: a paged cache (any page size, pages in any
//! order, unused table entries -1) gives, bit for bit, what a contiguous cache and the
//! variable-length forward over the same tokens give; rows appended land in the cache and are
//! attended; the rotary embedding (both layouts, part of head_dim) against a float64 rotation;
//! bad lengths and table entries refused with the library's status and message, the cache
//! untouched; the supported and workspace queries.
mod common;

use common::{max_error, random};
use flashattn::{Algorithm, Backend, Context, KvCache, Options, Rotary, Status, Variants, View, ViewMut};

fn cpu() -> Context {
    Context::new(Backend::Cpu, 0).expect("a CPU context")
}

/// Sizes shared by every sequence of a batch: N_q queries, heads, head dims of k and v.
#[derive(Clone, Copy)]
struct Heads {
    nq: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
}

/// The tokens of a batch, packed as a variable-length forward takes them: sequence b's keys
/// are rows `start[b] .. start[b] + len[b]` of k and v, its queries rows `b * nq ..` of q.
struct Tokens {
    h: Heads,
    lens: Vec<usize>,
    starts: Vec<usize>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Tokens {
    fn new(h: Heads, lens: &[usize], seed: u64) -> Tokens {
        let mut starts = vec![0];
        for &l in lens {
            starts.push(starts.last().unwrap() + l);
        }
        let total = *starts.last().unwrap();
        let b = lens.len();
        Tokens {
            h,
            lens: lens.to_vec(),
            starts,
            q: random(b * h.nq * h.hq * h.d, seed),
            k: random(total * h.hkv * h.d, seed + 1),
            v: random(total * h.hkv * h.dv, seed + 2),
        }
    }

    fn batch(&self) -> usize {
        self.lens.len()
    }

    fn k_row(&self, b: usize, t: usize) -> &[f32] {
        let n = self.h.hkv * self.h.d;
        &self.k[(self.starts[b] + t) * n..(self.starts[b] + t + 1) * n]
    }

    fn v_row(&self, b: usize, t: usize) -> &[f32] {
        let n = self.h.hkv * self.h.dv;
        &self.v[(self.starts[b] + t) * n..(self.starts[b] + t + 1) * n]
    }
}

/// Where tokens sit in a cache: contiguous (`page_size` 0) or paged through a shuffled table.
struct Cache {
    page_size: usize,
    pages_per_seq: usize,
    slots: usize, // the leading dimension of k and v: sequences, or pages
    rows: usize,  // rows per slot: the capacity, or page_size
    table: Vec<i32>,
}

/// Pages no sequence uses, so that a table entry wrongly read points at poison.
const SPARE_PAGES: usize = 2;
/// Table entries past the pages a sequence uses: never read.
const UNUSED: i32 = -1;

impl Cache {
    fn contiguous(batch: usize, capacity: usize) -> Cache {
        Cache { page_size: 0, pages_per_seq: 0, slots: batch, rows: capacity, table: Vec::new() }
    }

    /// Pages of `page_size` rows for `capacity` tokens per sequence, in a shuffled order; each
    /// sequence's entries past the `used[b]` tokens it holds after the call are -1.
    fn paged(page_size: usize, capacity: usize, used: &[usize], seed: u64) -> Cache {
        let pages_per_seq = (capacity + page_size - 1) / page_size;
        let pages = used.len() * pages_per_seq + SPARE_PAGES;
        let mut order: Vec<i32> = (0..pages as i32).collect();
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for i in (1..pages).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            order.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut table = vec![UNUSED; used.len() * pages_per_seq];
        for (b, &n) in used.iter().enumerate() {
            for j in 0..(n + page_size - 1) / page_size {
                table[b * pages_per_seq + j] = order[b * pages_per_seq + j];
            }
        }
        Cache { page_size, pages_per_seq, slots: pages, rows: page_size, table }
    }

    /// The row of k and v (counted over `slots * rows`) holding token t of sequence b; None
    /// where its table entry names no page.
    fn row(&self, b: usize, t: usize) -> Option<usize> {
        if self.page_size == 0 {
            return Some(b * self.rows + t);
        }
        let page = usize::try_from(self.table[b * self.pages_per_seq + t / self.page_size]).ok().filter(|&p| p < self.slots)?;
        Some(page * self.page_size + t % self.page_size)
    }

    /// k and v holding the first `held[b]` tokens of each sequence (those with a page), NaN
    /// everywhere else: a row read that should not be would show in the results.
    fn fill(&self, tokens: &Tokens, held: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let h = tokens.h;
        let (mut k, mut v) = (vec![f32::NAN; self.slots * self.rows * h.hkv * h.d], vec![f32::NAN; self.slots * self.rows * h.hkv * h.dv]);
        for (b, &n) in held.iter().enumerate() {
            for (t, r) in (0..n).filter_map(|t| Some((t, self.row(b, t)?))) {
                k[r * h.hkv * h.d..(r + 1) * h.hkv * h.d].copy_from_slice(tokens.k_row(b, t));
                v[r * h.hkv * h.dv..(r + 1) * h.hkv * h.dv].copy_from_slice(tokens.v_row(b, t));
            }
        }
        (k, v)
    }

    fn k_shape(&self, h: Heads) -> [usize; 4] {
        [self.slots, self.rows, h.hkv, h.d]
    }

    fn v_shape(&self, h: Heads) -> [usize; 4] {
        [self.slots, self.rows, h.hkv, h.dv]
    }
}

/// The rows `held[b] ..` of each sequence's tokens as k_new and v_new `[batch, n_new, ...]`.
fn new_rows(tokens: &Tokens, held: &[usize], n_new: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for (b, &n) in held.iter().enumerate() {
        for t in n..n + n_new {
            k.extend_from_slice(tokens.k_row(b, t));
            v.extend_from_slice(tokens.v_row(b, t));
        }
    }
    (k, v)
}

/// A rotary table `[positions, rotary_dim / 2]`: angle `pos * 10000^(-2r / R)`.
fn rotary_table(positions: usize, rotary_dim: usize, sine: bool) -> Vec<f32> {
    let mut t = Vec::new();
    for p in 0..positions {
        for r in 0..rotary_dim / 2 {
            let angle = p as f64 * 10000f64.powf(-2.0 * r as f64 / rotary_dim as f64);
            t.push(if sine { angle.sin() } else { angle.cos() } as f32);
        }
    }
    t
}

/// Everything of one cache call besides the tokens and the cache's layout.
struct Call<'v> {
    held: Vec<usize>,
    n_new: usize,
    rotary: Option<(&'v [f32], &'v [f32], usize, bool)>, // cos, sin, rotary_dim, interleaved
    variants: Variants<'v, 'v>,
    options: Options,
}

struct Outcome {
    out: Vec<f32>,
    lse: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The cache call into outputs poisoned with NaN: the result and the cache after it (or the
/// error, with the cache and outputs as the call left them).
fn run_cache(ctx: &Context, tokens: &Tokens, cache: &Cache, call: &Call) -> (flashattn::Result<()>, Outcome) {
    let (h, b) = (tokens.h, tokens.batch());
    let (mut k, mut v) = cache.fill(tokens, &call.held);
    let (k_new, v_new) = new_rows(tokens, &call.held, call.n_new);
    let seqlens: Vec<i32> = call.held.iter().map(|&n| n as i32).collect();
    let (mut out, mut lse) = (vec![f32::NAN; b * h.nq * h.hq * h.dv], vec![f32::NAN; b * h.hq * h.nq]);
    let result = {
        let seqlens_view = View::new(&seqlens, &[b]).unwrap();
        let table_view = View::new(&cache.table, &[b, cache.pages_per_seq]).unwrap();
        let (knv, vnv) = (View::new(&k_new, &[b, call.n_new, h.hkv, h.d]).unwrap(), View::new(&v_new, &[b, call.n_new, h.hkv, h.dv]).unwrap());
        let tables = call.rotary.map(|(cos, sin, r, _)| (View::new(cos, &[cos.len() / (r / 2), r / 2]).unwrap(), View::new(sin, &[sin.len() / (r / 2), r / 2]).unwrap()));
        let mut kc = KvCache::new(&seqlens_view);
        if cache.page_size > 0 {
            kc = kc.paged(&table_view);
        }
        if call.n_new > 0 {
            kc = kc.append(&knv, &vnv);
        }
        if let (Some((cos, sin)), Some((_, _, _, interleaved))) = (&tables, call.rotary) {
            kc = kc.rotary(if interleaved { Rotary::interleaved(cos, sin) } else { Rotary::half_split(cos, sin) });
        }
        ctx.forward_kvcache(
            &View::new(&tokens.q, &[b, h.nq, h.hq, h.d]).unwrap(),
            &mut ViewMut::new(&mut k, &cache.k_shape(h)).unwrap(),
            &mut ViewMut::new(&mut v, &cache.v_shape(h)).unwrap(),
            &mut ViewMut::new(&mut out, &[b, h.nq, h.hq, h.dv]).unwrap(),
            Some(&mut ViewMut::new(&mut lse, &[b, h.hq, h.nq]).unwrap()),
            &kc,
            &call.variants,
            &call.options,
        )
    };
    (result, Outcome { out, lse, k, v })
}

/// The variable-length forward over the tokens: out `[batch, nq, hq, dv]` (the packed rows'
/// order) and the LSE reordered from `[hq, batch * nq]` to the cache call's `[batch, hq, nq]`.
fn run_varlen(ctx: &Context, tokens: &Tokens, variants: &Variants, options: &Options) -> (Vec<f32>, Vec<f32>) {
    let (h, b) = (tokens.h, tokens.batch());
    let total_k = *tokens.starts.last().unwrap();
    let cu_q: Vec<i32> = (0..=b).map(|i| (i * h.nq) as i32).collect();
    let cu_k: Vec<i32> = tokens.starts.iter().map(|&s| s as i32).collect();
    let (cqv, ckv) = (View::new(&cu_q, &[b + 1]).unwrap(), View::new(&cu_k, &[b + 1]).unwrap());
    let max_k = tokens.lens.iter().copied().max().unwrap();
    let varlen = Variants { cu_seqlens_q: Some(&cqv), cu_seqlens_k: Some(&ckv), max_seqlen_q: h.nq, max_seqlen_k: max_k, ..*variants };
    let (mut out, mut packed_lse) = (vec![0f32; b * h.nq * h.hq * h.dv], vec![0f32; h.hq * b * h.nq]);
    ctx.forward_ex(
        &View::new(&tokens.q, &[b * h.nq, h.hq, h.d]).unwrap(),
        &View::new(&tokens.k, &[total_k, h.hkv, h.d]).unwrap(),
        &View::new(&tokens.v, &[total_k, h.hkv, h.dv]).unwrap(),
        &mut ViewMut::new(&mut out, &[b * h.nq, h.hq, h.dv]).unwrap(),
        Some(&mut ViewMut::new(&mut packed_lse, &[h.hq, b * h.nq]).unwrap()),
        &varlen,
        options,
    )
    .expect("the variable-length forward");
    let mut lse = Vec::new();
    for s in 0..b {
        for hh in 0..h.hq {
            lse.extend_from_slice(&packed_lse[hh * b * h.nq + s * h.nq..hh * b * h.nq + (s + 1) * h.nq]);
        }
    }
    (out, lse)
}

/// The number of elements whose bits differ.
fn bit_mismatches(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

/// Causal attention of one sequence in f64: q `[nq, hq, d]`, k `[len, hkv, d]`, v `[len, hkv,
/// dv]`, query i at position len - nq + i; out `[nq, hq, dv]`, lse `[hq, nq]` (a row that sees
/// no key: 0 and -inf).
fn attend64(h: Heads, len: usize, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let scale = 1.0 / (h.d as f64).sqrt();
    let (mut out, mut lse) = (vec![0.0; h.nq * h.hq * h.dv], vec![f64::NEG_INFINITY; h.hq * h.nq]);
    for hh in 0..h.hq {
        let hk = hh / (h.hq / h.hkv);
        for i in 0..h.nq {
            let visible = (len + i + 1).saturating_sub(h.nq); // keys j <= i + len - nq
            if visible == 0 {
                continue;
            }
            let s: Vec<f64> = (0..visible)
                .map(|j| (0..h.d).map(|c| q[(i * h.hq + hh) * h.d + c] * k[(j * h.hkv + hk) * h.d + c]).sum::<f64>() * scale)
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            lse[hh * h.nq + i] = m + z.ln();
            for (j, x) in s.iter().enumerate() {
                let p = (x - m).exp() / z;
                for c in 0..h.dv {
                    out[(i * h.hq + hh) * h.dv + c] += p * v[(j * h.hkv + hk) * h.dv + c];
                }
            }
        }
    }
    (out, lse)
}

/// f32 results against f64, relative to the reference's largest finite magnitude.
fn assert_close(what: &str, ours: &[f32], reference: &[f64]) {
    assert_eq!(ours.len(), reference.len(), "{what}: length");
    let big = reference.iter().filter(|x| x.is_finite()).fold(1.0f64, |m, x| m.max(x.abs()));
    let ours: Vec<f64> = ours.iter().map(|&x| x as f64).collect();
    let err = max_error(&ours, reference);
    assert!(err <= 2e-4 * big, "{what}: max error {err:.3e} exceeds {:.3e}", 2e-4 * big);
}

/// The cache call's out and lse against f64 attention over each sequence's `keys` (as
/// `[len, hkv, d]` f64 rows) with queries `q64` (`[batch, nq, hq, d]`).
fn assert_matches_f64(what: &str, h: Heads, o: &Outcome, q64: &[f64], keys: &[Vec<f64>], values: &[Vec<f64>]) {
    for (b, (k, v)) in keys.iter().zip(values).enumerate() {
        let len = k.len() / (h.hkv * h.d);
        let (out, lse) = attend64(h, len, &q64[b * h.nq * h.hq * h.d..(b + 1) * h.nq * h.hq * h.d], k, v);
        let n = h.nq * h.hq * h.dv;
        assert_close(&format!("{what}: sequence {b} out"), &o.out[b * n..(b + 1) * n], &out);
        assert_close(&format!("{what}: sequence {b} lse"), &o.lse[b * h.hq * h.nq..(b + 1) * h.hq * h.nq], &lse);
    }
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Sequence b's first `len` keys and values as f64 rows.
fn prefix64(tokens: &Tokens, b: usize, len: usize) -> (Vec<f64>, Vec<f64>) {
    (0..len).fold((Vec::new(), Vec::new()), |(mut k, mut v), t| {
        k.extend(f64s(tokens.k_row(b, t)));
        v.extend(f64s(tokens.v_row(b, t)));
        (k, v)
    })
}

const PAGE_SIZES: [usize; 3] = [1, 7, 16];
const ALGORITHMS: [Algorithm; 2] = [Algorithm::Flash, Algorithm::Standard];

#[test]
fn paged_cache_is_the_contiguous_cache_and_the_varlen_forward_bit_for_bit() {
    let ctx = cpu();
    // An empty sequence, one shorter than the queries, lengths past a page and a tile.
    let h = Heads { nq: 3, hq: 4, hkv: 2, d: 16, dv: 8 };
    let lens = [0, 1, 23, 40];
    let tokens = Tokens::new(h, &lens, 11);
    let capacity = 48;
    for algorithm in ALGORITHMS {
        let call = Call { held: lens.to_vec(), n_new: 0, rotary: None, variants: Variants::default(), options: Options::default().causal(true).algorithm(algorithm) };
        let (want_out, want_lse) = run_varlen(&ctx, &tokens, &call.variants, &call.options);
        let (r, contiguous) = run_cache(&ctx, &tokens, &Cache::contiguous(lens.len(), capacity), &call);
        r.expect("the contiguous cache");
        assert_eq!(bit_mismatches(&contiguous.out, &want_out), 0, "{algorithm:?}: contiguous out differs from the varlen forward's");
        assert_eq!(bit_mismatches(&contiguous.lse, &want_lse), 0, "{algorithm:?}: contiguous lse differs from the varlen forward's");
        for page_size in PAGE_SIZES {
            let cache = Cache::paged(page_size, capacity, &lens, page_size as u64);
            assert!(cache.table.contains(&UNUSED), "page {page_size}: the table has no unused entry");
            let (r, paged) = run_cache(&ctx, &tokens, &cache, &call);
            r.unwrap_or_else(|e| panic!("{algorithm:?} page {page_size}: {e}"));
            assert_eq!(bit_mismatches(&paged.out, &contiguous.out), 0, "{algorithm:?} page {page_size}: out differs from the contiguous cache's");
            assert_eq!(bit_mismatches(&paged.lse, &contiguous.lse), 0, "{algorithm:?} page {page_size}: lse differs from the contiguous cache's");
        }
    }
    // Not just equal, but attention: the f64 reference of each sequence.
    let call = Call { held: lens.to_vec(), n_new: 0, rotary: None, variants: Variants::default(), options: Options::default().causal(true) };
    let (r, o) = run_cache(&ctx, &tokens, &Cache::paged(7, capacity, &lens, 3), &call);
    r.unwrap();
    let (keys, values): (Vec<_>, Vec<_>) = (0..lens.len()).map(|b| prefix64(&tokens, b, lens[b])).unzip();
    assert_matches_f64("paged 7", h, &o, &f64s(&tokens.q), &keys, &values);
    assert!(o.lse[..h.hq * h.nq].iter().all(|&l| l == f32::NEG_INFINITY), "the empty sequence's rows see a key");
}

#[test]
fn variants_go_through_the_cache() {
    let ctx = cpu();
    let h = Heads { nq: 2, hq: 4, hkv: 2, d: 16, dv: 16 };
    let lens = [5, 30, 17];
    let tokens = Tokens::new(h, &lens, 21);
    let (slopes, sinks) = ([0.5f32, 0.25, 0.125, 0.0625], [0.3f32, -1.0, 2.0, 0.0]);
    let (sv, kv) = (View::new(&slopes, &[4]).unwrap(), View::new(&sinks, &[4]).unwrap());
    let variants = Variants { alibi_slopes: Some(&sv), sinks: Some(&kv), ..Variants::default() };
    let options = Options::default().causal(true).window(9, 0).softcap(4.0);
    let (want_out, want_lse) = run_varlen(&ctx, &tokens, &variants, &options);
    let (plain_out, _) = run_varlen(&ctx, &tokens, &Variants::default(), &Options::default().causal(true));
    assert!(bit_mismatches(&want_out, &plain_out) > 0, "the variants changed nothing");
    let call = Call { held: lens.to_vec(), n_new: 0, rotary: None, variants, options };
    let (r, o) = run_cache(&ctx, &tokens, &Cache::paged(7, 32, &lens, 5), &call);
    r.expect("a paged cache with variants");
    assert_eq!(bit_mismatches(&o.out, &want_out), 0, "out differs from the varlen forward's");
    assert_eq!(bit_mismatches(&o.lse, &want_lse), 0, "lse differs from the varlen forward's");
}

#[test]
fn appended_rows_land_in_the_cache_and_are_attended() {
    let ctx = cpu();
    // More queries than new rows: the queries' first is a token held before the call.
    let h = Heads { nq: 3, hq: 4, hkv: 2, d: 16, dv: 8 };
    let (held, n_new) = ([0, 5, 30], 2);
    let lens: Vec<usize> = held.iter().map(|&n| n + n_new).collect();
    let tokens = Tokens::new(h, &lens, 31);
    let capacity = 40;
    let layouts: Vec<Cache> = std::iter::once(Cache::contiguous(held.len(), capacity))
        .chain(PAGE_SIZES.iter().map(|&p| Cache::paged(p, capacity, &lens, 7 + p as u64)))
        .collect();
    for algorithm in ALGORITHMS {
        let call = Call { held: held.to_vec(), n_new, rotary: None, variants: Variants::default(), options: Options::default().causal(true).algorithm(algorithm) };
        let (want_out, want_lse) = run_varlen(&ctx, &tokens, &call.variants, &call.options);
        for cache in &layouts {
            let what = format!("{algorithm:?} page {}", cache.page_size);
            let (r, o) = run_cache(&ctx, &tokens, cache, &call);
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
            // The cache after the call: every token of the concatenation in place, NaN (never
            // written) everywhere else.
            let (want_k, want_v) = cache.fill(&tokens, &lens);
            assert_eq!(bit_mismatches(&o.k, &want_k), 0, "{what}: k after the call");
            assert_eq!(bit_mismatches(&o.v, &want_v), 0, "{what}: v after the call");
            assert_eq!(bit_mismatches(&o.out, &want_out), 0, "{what}: out differs from the varlen forward over the concatenation");
            assert_eq!(bit_mismatches(&o.lse, &want_lse), 0, "{what}: lse differs from the varlen forward over the concatenation");
            let (keys, values): (Vec<_>, Vec<_>) = (0..lens.len()).map(|b| prefix64(&tokens, b, lens[b])).unzip();
            assert_matches_f64(&what, h, &o, &f64s(&tokens.q), &keys, &values);
        }
    }
}

/// The feature pairs of a rotary embedding of `rotary_dim` features.
fn pairs(rotary_dim: usize, interleaved: bool) -> Vec<(usize, usize)> {
    (0..rotary_dim / 2).map(|r| if interleaved { (2 * r, 2 * r + 1) } else { (r, r + rotary_dim / 2) }).collect()
}

/// Rotates each head's first `rotary_dim` features of `row` (`[heads, d]`) in f64 at `pos`.
fn rotate64(row: &mut [f64], d: usize, cos: &[f32], sin: &[f32], rotary_dim: usize, interleaved: bool, pos: usize) {
    let half = rotary_dim / 2;
    for head in row.chunks_mut(d) {
        for (r, (i0, i1)) in pairs(rotary_dim, interleaved).into_iter().enumerate() {
            let (x, y) = (head[i0], head[i1]);
            let (c, s) = (cos[pos * half + r] as f64, sin[pos * half + r] as f64);
            (head[i0], head[i1]) = (x * c - y * s, x * s + y * c);
        }
    }
}

#[test]
fn rotary_embedding_matches_a_float64_rotation() {
    let ctx = cpu();
    // Half of head_dim rotated; v with a head dim of its own.
    let h = Heads { nq: 2, hq: 4, hkv: 2, d: 32, dv: 24 };
    let rotary_dim = 16;
    let (held, n_new) = (vec![0, 9, 20], 2);
    let lens: Vec<usize> = held.iter().map(|&n| n + n_new).collect();
    let tokens = Tokens::new(h, &lens, 41);
    let positions = 24;
    let (cos, sin) = (rotary_table(positions, rotary_dim, false), rotary_table(positions, rotary_dim, true));
    let mut layouts_seen = Vec::new();
    for interleaved in [false, true] {
        // Paged with rows appended (q and k_new rotated), and contiguous with none (q alone).
        for (cache, held) in [(Cache::paged(16, positions, &lens, 9), held.clone()), (Cache::contiguous(held.len(), positions), lens.clone())] {
            let what = format!("{} page {} held {held:?}", if interleaved { "interleaved" } else { "half-split" }, cache.page_size);
            let n_new = lens[0] - held[0];
            let call = Call {
                held: held.clone(),
                n_new,
                rotary: Some((&cos, &sin, rotary_dim, interleaved)),
                variants: Variants::default(),
                options: Options::default().causal(true),
            };
            let (r, o) = run_cache(&ctx, &tokens, &cache, &call);
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
            let row = h.hq * h.d;
            let mut q64 = f64s(&tokens.q);
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for b in 0..lens.len() {
                for i in 0..h.nq {
                    let pos = lens[b] - h.nq + i;
                    rotate64(&mut q64[(b * h.nq + i) * row..(b * h.nq + i + 1) * row], h.d, &cos, &sin, rotary_dim, interleaved, pos);
                }
                let (mut k, v) = prefix64(&tokens, b, lens[b]);
                let krow = h.hkv * h.d;
                for t in held[b]..lens[b] {
                    let plain = k[t * krow..(t + 1) * krow].to_vec();
                    rotate64(&mut k[t * krow..(t + 1) * krow], h.d, &cos, &sin, rotary_dim, interleaved, t);
                    // The appended row in the cache: the f64 rotation rounded once (fp32's error
                    // of x cos - y sin bounded by the pair's inputs); features past R copied.
                    let r = cache.row(b, t).unwrap();
                    let got = &o.k[r * krow..(r + 1) * krow];
                    for (e, (&g, &want)) in got.iter().zip(&k[t * krow..(t + 1) * krow]).enumerate() {
                        let c = e % h.d;
                        if c >= rotary_dim {
                            assert_eq!(g.to_bits(), (plain[e] as f32).to_bits(), "{what}: sequence {b} token {t} feature {c} changed");
                            continue;
                        }
                        let (i0, i1) = pairs(rotary_dim, interleaved).into_iter().find(|&(a, z)| a == c || z == c).unwrap();
                        let head = e - c;
                        let bound = f32::EPSILON as f64 * (want.abs() + 2.0 * (plain[head + i0].abs() + plain[head + i1].abs()));
                        assert!((g as f64 - want).abs() <= bound, "{what}: sequence {b} token {t} feature {c}: {g}, float64 {want}");
                    }
                }
                keys.push(k);
                values.push(v);
            }
            assert_matches_f64(&what, h, &o, &q64, &keys, &values);
            layouts_seen.push(o.out);
        }
    }
    assert!(bit_mismatches(&layouts_seen[0], &layouts_seen[2]) > 0, "the two layouts gave the same out");
}

#[test]
fn lengths_past_the_cache_are_refused_and_the_cache_left_alone() {
    let ctx = cpu();
    let h = Heads { nq: 1, hq: 2, hkv: 1, d: 16, dv: 16 };
    let capacity = 16;
    let (held, n_new) = ([3, capacity], 1); // sequence 1 is full: its new row does not fit
    let tokens = Tokens::new(h, &[held[0] + n_new, held[1] + n_new], 51);
    let refused = |cache: &Cache, held: &[usize], fragment: &str| {
        let call = Call { held: held.to_vec(), n_new, rotary: None, variants: Variants::default(), options: Options::default() };
        let (r, o) = run_cache(&ctx, &tokens, cache, &call);
        let e = r.expect_err(fragment);
        assert_eq!(e.status(), Status::INVALID_SHAPE, "{e}");
        assert!(e.message().starts_with("flashattn_forward_ex: ") && e.message().contains(fragment), "{e}");
        let (k, v) = cache.fill(&tokens, held);
        assert_eq!(bit_mismatches(&o.k, &k), 0, "{fragment}: the refused call wrote k");
        assert_eq!(bit_mismatches(&o.v, &v), 0, "{fragment}: the refused call wrote v");
        assert!(o.out.iter().chain(&o.lse).all(|x| x.is_nan()), "{fragment}: the refused call wrote out or lse");
    };
    refused(&Cache::contiguous(2, capacity), &held, "sequence 1: cache_seqlens[1] = 16 and 1 new rows make 17 tokens, past the cache's 16");
    let mut paged = Cache::paged(4, capacity, &[held[0] + n_new, capacity], 1);
    refused(&paged, &held, "sequence 1: cache_seqlens[1] = 16 and 1 new rows make 17 tokens, past the cache's 16");
    // A table entry a sequence uses that names no page.
    let pages = paged.slots as i32;
    paged.table[paged.pages_per_seq] = pages;
    refused(&paged, &[held[0], capacity - n_new], &format!("block_table[1, 0] is {pages}, outside k's {pages} pages"));
}

#[test]
fn queries_see_shapes_not_values() {
    let ctx = cpu();
    let h = Heads { nq: 2, hq: 4, hkv: 2, d: 32, dv: 32 };
    let (b, capacity) = (2, 32);
    let q = vec![0f32; b * h.nq * h.hq * h.d];
    let (mut k, mut v) = (vec![0f32; b * capacity * h.hkv * h.d], vec![0f32; b * capacity * h.hkv * h.dv]);
    let k_new = vec![0f32; b * h.hkv * h.d];
    let (cos, sin) = (vec![1f32; capacity * h.d / 2], vec![0f32; capacity * h.d / 2]);
    let past = [capacity as i32 + 5, -1]; // values only a call reads
    let (qv, pv) = (View::new(&q, &[b, h.nq, h.hq, h.d]).unwrap(), View::new(&past, &[b]).unwrap());
    let knv = View::new(&k_new, &[b, 1, h.hkv, h.d]).unwrap();
    let (cv, sv) = (View::new(&cos, &[capacity, h.d / 2]).unwrap(), View::new(&sin, &[capacity, h.d / 2]).unwrap());
    let (kc, vc) = (ViewMut::new(&mut k, &[b, capacity, h.hkv, h.d]).unwrap(), ViewMut::new(&mut v, &[b, capacity, h.hkv, h.dv]).unwrap());
    let (kview, vview, none, options) = (kc.as_view(), vc.as_view(), Variants::default(), Options::default());
    let plain = KvCache::new(&pv).append(&knv, &knv);
    ctx.supported_kvcache(&qv, &kview, &vview, &plain, &none, &options).expect("supported: no value is read");
    let without = ctx.workspace_size_kvcache(&qv, &kview, &vview, &plain, &none, &options).unwrap();
    let with = ctx.workspace_size_kvcache(&qv, &kview, &vview, &plain.rotary(Rotary::half_split(&cv, &sv)), &none, &options).unwrap();
    // The rotated copy of q: its f32 elements, in whole 256-byte blocks.
    let rotated_q = (q.len() * std::mem::size_of::<f32>() + 255) / 256 * 256;
    assert_eq!(with - without, rotated_q, "the workspace of a rotary embedding");
    // Shapes are checked: a v_new of another head_dim.
    let wide = vec![0f32; b * h.hkv * 2 * h.d];
    let wv = View::new(&wide, &[b, 1, h.hkv, 2 * h.d]).unwrap();
    let e = ctx.supported_kvcache(&qv, &kview, &vview, &KvCache::new(&pv).append(&knv, &wv), &none, &options).unwrap_err();
    assert_eq!(e.status(), Status::INVALID_SHAPE, "{e}");
    assert!(e.message().contains("v_new: shape [2, 1, 2, 64], expected [batch, N_new, heads_kv, head_dim_v] = [2, 1, 2, 32]"), "{e}");
}
