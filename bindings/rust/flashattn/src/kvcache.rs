//! The KV cache forward (the header's "KV cache"): attention of new queries over a cache of keys
//! and values, contiguous or paged, that the call may first append rows to, with an optional
//! rotary embedding of q and of the rows appended.
//!
//! ```
//! # use flashattn::{KvCache, Options, Variants, View, ViewMut};
//! # fn main() -> Result<(), flashattn::Error> {
//! # let ctx = flashattn::Context::new(flashattn::Backend::Cpu, 0)?;
//! let (mut k, mut v) = (vec![0.25f32; 2 * 32 * 2 * 8], vec![1.0f32; 2 * 32 * 2 * 8]); // 2 sequences, room for 32 tokens each
//! let (q, k_new, v_new, held) = (vec![0.5f32; 32], vec![0.5f32; 32], vec![1.0f32; 32], [5i32, 17]); // one new token per sequence
//! let (qv, knv, vnv, heldv) = (View::new(&q, &[2, 1, 2, 8])?, View::new(&k_new, &[2, 1, 2, 8])?, View::new(&v_new, &[2, 1, 2, 8])?, View::new(&held, &[2])?);
//! let (mut kc, mut vc) = (ViewMut::new(&mut k, &[2, 32, 2, 8])?, ViewMut::new(&mut v, &[2, 32, 2, 8])?);
//! let mut out = vec![0f32; 32];
//! ctx.forward_kvcache(&qv, &mut kc, &mut vc, &mut ViewMut::new(&mut out, &[2, 1, 2, 8])?, None, &KvCache::new(&heldv).append(&knv, &vnv), &Variants::default(), &Options::default().causal(true))?;
//! # assert_eq!((k[5 * 2 * 8], k[4 * 2 * 8]), (0.5, 0.25)); // the new token is row 5 of sequence 0
//! # assert!(out.iter().all(|&x| (x - 1.0).abs() < 1e-6)); // every v is 1
//! # Ok(())
//! # }
//! ```

use std::ptr;

use flashattn_sys as sys;

use crate::variants::opt;
use crate::{check, Context, Options, Result, Variants, View, ViewMut};

/// The cache of a [`Context::forward_kvcache`] call, beyond its k and v.
///
/// Sequence b holds `seqlens[b]` tokens from the start of its cache before the call. The cache
/// is contiguous, k `[batch, capacity, heads_kv, head_dim]` and v `[batch, capacity, heads_kv,
/// head_dim_v]`, or, with a [`block_table`](KvCache::block_table), paged: k `[num_pages,
/// page_size, heads_kv, head_dim]` (v likewise), token t of sequence b in page
/// `block_table[b, t / page_size]` at row `t % page_size`. Only the entries of the pages a
/// sequence uses are read (the others may hold anything, e.g. -1), and sequences may share pages
/// they only read.
///
/// ```
/// # use flashattn::{KvCache, Rotary, View};
/// # fn main() -> Result<(), flashattn::Error> {
/// let (held, table) = ([3i32, 9], [2i32, -1, 0, 1]); // pages of 8 rows: sequence 0 uses page 2, sequence 1 pages 0 and 1
/// let (cos, sin) = (vec![1.0f32; 16 * 4], vec![0.0f32; 16 * 4]); // 16 positions, 8 features rotated
/// let (heldv, tablev, cosv, sinv) = (View::new(&held, &[2])?, View::new(&table, &[2, 2])?, View::new(&cos, &[16, 4])?, View::new(&sin, &[16, 4])?);
/// let cache = KvCache::new(&heldv).paged(&tablev).rotary(Rotary::interleaved(&cosv, &sinv));
/// # assert!(cache.block_table.is_some() && cache.new.is_none() && cache.rotary.unwrap().interleaved);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct KvCache<'c, 'a> {
    /// i32 `[batch]`: the tokens each sequence holds before the call (not updated by it).
    pub seqlens: &'c View<'a>,
    /// i32 `[batch, pages per sequence]`: the page of k and v holding each block of page_size
    /// tokens of a sequence; `None`: a contiguous cache.
    pub block_table: Option<&'c View<'a>>,
    /// `(k_new, v_new)`, `[batch, N_new, heads_kv, head_dim]` and `[batch, N_new, heads_kv,
    /// head_dim_v]`: rows written into the cache as tokens `seqlens[b] .. seqlens[b] + N_new` of
    /// each sequence before it is attended. `None`: the cache is only read.
    pub new: Option<(&'c View<'a>, &'c View<'a>)>,
    /// A rotary embedding of q and of the rows appended.
    pub rotary: Option<Rotary<'c, 'a>>,
}

/// A rotary embedding: the first R features of q and of the rows appended are rotated, in f32
/// and rounded to their dtype, query i of sequence b at position `len_k - N_q + i` and new row i
/// at `seqlens[b] + i` (cached tokens count as rotated already). A pair (x, y) at position t and
/// index r < R / 2 becomes `(x cos - y sin, x sin + y cos)` with `cos[t, r]` and `sin[t, r]`.
#[derive(Clone, Copy)]
pub struct Rotary<'c, 'a> {
    /// `[positions, R / 2]`, f32 or q's dtype (R even, at most head_dim).
    pub cos: &'c View<'a>,
    /// Of cos's shape and dtype.
    pub sin: &'c View<'a>,
    /// The pairs: `(2r, 2r + 1)` when true (GPT-J's layout), `(r, r + R / 2)` when false
    /// (GPT-NeoX's, the C API's default).
    pub interleaved: bool,
}

impl<'c, 'a> Rotary<'c, 'a> {
    /// Pairs `(r, r + R / 2)`: the first half of the rotated features with the second (GPT-NeoX).
    pub fn half_split(cos: &'c View<'a>, sin: &'c View<'a>) -> Self {
        Rotary { cos, sin, interleaved: false }
    }

    /// Pairs `(2r, 2r + 1)`: neighbouring features (GPT-J).
    pub fn interleaved(cos: &'c View<'a>, sin: &'c View<'a>) -> Self {
        Rotary { cos, sin, interleaved: true }
    }
}

impl<'c, 'a> KvCache<'c, 'a> {
    /// A contiguous cache holding `seqlens[b]` tokens of sequence b, nothing appended, no rotary
    /// embedding.
    pub fn new(seqlens: &'c View<'a>) -> Self {
        KvCache { seqlens, block_table: None, new: None, rotary: None }
    }

    /// The cache paged through `block_table`.
    pub fn paged(self, block_table: &'c View<'a>) -> Self {
        KvCache { block_table: Some(block_table), ..self }
    }

    /// Rows appended into the cache before attending.
    pub fn append(self, k_new: &'c View<'a>, v_new: &'c View<'a>) -> Self {
        KvCache { new: Some((k_new, v_new)), ..self }
    }

    /// A rotary embedding of q and of the rows appended.
    pub fn rotary(self, rotary: Rotary<'c, 'a>) -> Self {
        KvCache { rotary: Some(rotary), ..self }
    }

    /// The args struct of a cache call: the variants, the options and the cache's tensors.
    fn args(&self, variants: &Variants, options: &sys::flashattn_options_t) -> Result<sys::flashattn_args_t> {
        let mut a = variants.args(options)?;
        a.cache_seqlens = self.seqlens.as_raw();
        a.block_table = opt(self.block_table);
        if let Some((k_new, v_new)) = self.new {
            (a.k_new, a.v_new) = (k_new.as_raw(), v_new.as_raw());
        }
        if let Some(r) = self.rotary {
            (a.rotary_cos, a.rotary_sin, a.rotary_interleaved) = (r.cos.as_raw(), r.sin.as_raw(), r.interleaved as i64);
        }
        Ok(a)
    }
}

impl Context {
    /// Forward attention of `q` (`[batch, N_q, heads_q, head_dim]`, the sequences' last N_q
    /// tokens) over the KV cache `k_cache`, `v_cache` described by `cache`: writes `out`
    /// (`[batch, N_q, heads_q, head_dim_v]`) and, when given, `lse` (f32 `[batch, heads_q,
    /// N_q]`). With rows to append ([`KvCache::append`]) the call first writes them into the
    /// cache (hence `&mut`); sequence b then has `len_k = seqlens[b] + N_new` keys, at most the
    /// capacity, and every mask is aligned at its end (diag = len_k - N_q). `variants` may carry
    /// ALiBi slopes and sinks (no offsets: the cache's lengths are `seqlens`), `options` every
    /// option. The backward does not take a cache.
    ///
    /// A CPU context checks the lengths, the table entries a sequence uses, the rotary
    /// positions, and that no two sequences append into one page row: bad values are an
    /// [`Error`](crate::Error) with status `INVALID_SHAPE`, and nothing is written. A CUDA
    /// context cannot check them without reading device memory: there they make the results
    /// undefined, and reads and writes may land outside the cache (in device memory). A token
    /// one sequence appends must not be read by another in the same call (undefined results).
    ///
    /// The cache is borrowed exclusively: no other view of the call can look at its memory.
    /// ```compile_fail,E0502
    /// # use flashattn::{KvCache, Options, Variants, View, ViewMut};
    /// # fn main() -> Result<(), flashattn::Error> {
    /// # let ctx = flashattn::Context::new(flashattn::Backend::Cpu, 0)?;
    /// # let (mut k, mut v, mut out, held) = (vec![0f32; 64], vec![0f32; 64], vec![0f32; 16], [1i32]);
    /// # let heldv = View::new(&held, &[1])?;
    /// let (mut kc, mut vc) = (ViewMut::new(&mut k, &[1, 4, 2, 8])?, ViewMut::new(&mut v, &[1, 4, 2, 8])?);
    /// let q = kc.as_view(); // the cache read as q while the call may write it
    /// ctx.forward_kvcache(&q, &mut kc, &mut vc, &mut ViewMut::new(&mut out, &[1, 1, 2, 8])?, None, &KvCache::new(&heldv), &Variants::default(), &Options::default())?;
    /// # Ok(())
    /// # }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn forward_kvcache(
        &self, q: &View, k_cache: &mut ViewMut, v_cache: &mut ViewMut, out: &mut ViewMut, lse: Option<&mut ViewMut>, cache: &KvCache,
        variants: &Variants, options: &Options,
    ) -> Result<()> {
        let o = options.raw()?;
        let mut a = cache.args(variants, &o)?;
        (a.q, a.k, a.v, a.out) = (q.as_raw(), k_cache.as_raw(), v_cache.as_raw(), out.as_raw());
        a.lse = lse.map_or(ptr::null(), |l| l.as_raw());
        // SAFETY: as in forward_ex: every view borrows memory that covers it for the whole call;
        // the cache, written in place, and the outputs are exclusive borrows, so they share no
        // byte with any other view; `a` and what it points to outlive the call.
        check(unsafe { sys::flashattn_forward_ex(self.as_raw(), &a, ptr::null_mut(), 0) })
    }

    /// Ok when this context can run the cache call of [`Context::forward_kvcache`] (shapes,
    /// dtypes and strides; no length or table entry is read); otherwise why not. The cache's
    /// views may be taken from the mutable ones with [`ViewMut::as_view`].
    pub fn supported_kvcache(&self, q: &View, k_cache: &View, v_cache: &View, cache: &KvCache, variants: &Variants, options: &Options) -> Result<()> {
        let o = options.raw()?;
        let mut a = cache.args(variants, &o)?;
        (a.q, a.k, a.v) = (q.as_raw(), k_cache.as_raw(), v_cache.as_raw());
        // SAFETY: only shapes, dtypes and strides are read.
        check(unsafe { sys::flashattn_supported_ex(self.as_raw(), &a, 0) })
    }

    /// The scratch memory the cache call needs (the context allocates and keeps it; with a
    /// rotary embedding it holds the rotated copy of q).
    pub fn workspace_size_kvcache(
        &self, q: &View, k_cache: &View, v_cache: &View, cache: &KvCache, variants: &Variants, options: &Options,
    ) -> Result<usize> {
        let o = options.raw()?;
        let mut a = cache.args(variants, &o)?;
        (a.q, a.k, a.v) = (q.as_raw(), k_cache.as_raw(), v_cache.as_raw());
        let mut n = 0;
        // SAFETY: only shapes, dtypes and strides are read; n is a valid out pointer.
        check(unsafe { sys::flashattn_workspace_size_ex(&mut n, self.as_raw(), &a, 0) })?;
        Ok(n)
    }
}
