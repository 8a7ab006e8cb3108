//! The `_ex` calls: attention with the variants that need tensors of their own (ALiBi slopes,
//! attention sinks and their gradient, variable-length batches), through `flashattn_args_t`.
//!
//! ```
//! # use flashattn::{Options, View, ViewMut};
//! # fn main() -> Result<(), flashattn::Error> {
//! # let ctx = flashattn::Context::new(flashattn::Backend::Cpu, 0)?;
//! let (q, k, v, cu) = (vec![0.5f32; 160], vec![0.25f32; 160], vec![1.0f32; 80], [0i32, 4, 10]); // two packed sequences
//! let (qv, kv, vv, cuv) = (View::new(&q, &[10, 2, 8])?, View::new(&k, &[10, 2, 8])?, View::new(&v, &[10, 2, 4])?, View::new(&cu, &[3])?);
//! let variants = flashattn::Variants { cu_seqlens_q: Some(&cuv), cu_seqlens_k: Some(&cuv), max_seqlen_q: 6, max_seqlen_k: 6, ..Default::default() };
//! let mut out = vec![0f32; 80];
//! ctx.forward_ex(&qv, &kv, &vv, &mut ViewMut::new(&mut out, &[10, 2, 4])?, None, &variants, &Options::default().window(3, 0).softcap(30.0))?;
//! # assert!(out.iter().all(|&x| (x - 1.0).abs() < 1e-6)); // every v is 1
//! # Ok(())
//! # }
//! ```

use std::ptr;

use flashattn_sys as sys;

use crate::{check, Context, Options, Result, View, ViewMut};

/// The variant tensors of a call; `Variants::default()` is plain attention.
///
/// With `cu_seqlens_q` and `cu_seqlens_k` (i32 `[batch + 1]`, both or neither) the batch is of
/// variable length: q, k, v, out and the gradients are `[total_tokens, heads, head_dim]`, the
/// LSE `[heads_q, total_q]`, sequence b owning the rows `cu_seqlens[b]..cu_seqlens[b + 1]`;
/// `max_seqlen_q` and `max_seqlen_k` bound every sequence's length.
#[derive(Clone, Copy, Default)]
pub struct Variants<'v, 'a> {
    /// f32 `[heads_q]` or `[batch, heads_q]`: `slope_h * |i + diag - j|` is subtracted from each
    /// score.
    pub alibi_slopes: Option<&'v View<'a>>,
    /// f32 `[heads_q]`: one logit per head in every row's softmax denominator.
    pub sinks: Option<&'v View<'a>>,
    pub cu_seqlens_q: Option<&'v View<'a>>,
    pub cu_seqlens_k: Option<&'v View<'a>>,
    pub max_seqlen_q: usize,
    pub max_seqlen_k: usize,
}

/// The outputs of [`Context::backward_ex`]: dq, dk, dv, and, when wanted, dsinks (f32
/// `[heads_q]`, the gradient of the sinks; needs [`Variants::sinks`]).
pub struct Gradients<'g, 'a> {
    pub dq: &'g mut ViewMut<'a>,
    pub dk: &'g mut ViewMut<'a>,
    pub dv: &'g mut ViewMut<'a>,
    pub dsinks: Option<&'g mut ViewMut<'a>>,
}

pub(crate) fn opt(v: Option<&View>) -> *const sys::flashattn_tensor_t {
    v.map_or(ptr::null(), |v| v.as_raw())
}

impl Variants<'_, '_> {
    /// The args struct with the variants and the options filled in.
    pub(crate) fn args(&self, options: &sys::flashattn_options_t) -> Result<sys::flashattn_args_t> {
        let mut a = std::mem::MaybeUninit::<sys::flashattn_args_t>::uninit();
        // SAFETY: given the struct's own size, args_init_sized fills the whole struct on
        // success (what C's flashattn_args_init(&a) macro passes).
        check(unsafe {
            sys::flashattn_args_init_sized(a.as_mut_ptr(), std::mem::size_of::<sys::flashattn_args_t>())
        })?;
        let mut a = unsafe { a.assume_init() };
        a.options = options;
        a.alibi_slopes = opt(self.alibi_slopes);
        a.sinks = opt(self.sinks);
        a.cu_seqlens_q = opt(self.cu_seqlens_q);
        a.cu_seqlens_k = opt(self.cu_seqlens_k);
        // A length past i64 is refused by the library as more than the tokens there are.
        a.max_seqlen_q = i64::try_from(self.max_seqlen_q).unwrap_or(i64::MAX);
        a.max_seqlen_k = i64::try_from(self.max_seqlen_k).unwrap_or(i64::MAX);
        Ok(a)
    }
}

impl Context {
    /// [`Context::forward`] with the variants of `variants` (and of `options`: window, softcap).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_ex(
        &self, q: &View, k: &View, v: &View, out: &mut ViewMut, lse: Option<&mut ViewMut>, variants: &Variants, options: &Options,
    ) -> Result<()> {
        let o = options.raw()?;
        let mut a = variants.args(&o)?;
        (a.q, a.k, a.v, a.out) = (q.as_raw(), k.as_raw(), v.as_raw(), out.as_raw());
        a.lse = lse.map_or(ptr::null(), |l| l.as_raw());
        // SAFETY: as in forward: every view borrows memory that covers it for the whole call, the
        // outputs exclusively; `a` and what it points to outlive the call.
        check(unsafe { sys::flashattn_forward_ex(self.as_raw(), &a, ptr::null_mut(), 0) })
    }

    /// [`Context::backward`] with the variants, which must be the forward's; fills `grads`
    /// (dsinks too when given).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_ex(
        &self, q: &View, k: &View, v: &View, out: &View, dout: &View, lse: &View, grads: Gradients, variants: &Variants,
        options: &Options,
    ) -> Result<()> {
        let o = options.raw()?;
        let mut a = variants.args(&o)?;
        (a.q, a.k, a.v, a.out, a.dout, a.lse) = (q.as_raw(), k.as_raw(), v.as_raw(), out.as_raw(), dout.as_raw(), lse.as_raw());
        (a.dq, a.dk, a.dv) = (grads.dq.as_raw(), grads.dk.as_raw(), grads.dv.as_raw());
        a.dsinks = grads.dsinks.map_or(ptr::null(), |d| d.as_raw());
        // SAFETY: as in forward_ex.
        check(unsafe { sys::flashattn_backward_ex(self.as_raw(), &a, ptr::null_mut(), 0) })
    }

    /// [`Context::supported`] with the variants (shapes, dtypes, strides and lengths; no data is
    /// read).
    pub fn supported_ex(&self, q: &View, k: &View, v: &View, variants: &Variants, options: &Options, backward: bool) -> Result<()> {
        let o = options.raw()?;
        let mut a = variants.args(&o)?;
        (a.q, a.k, a.v) = (q.as_raw(), k.as_raw(), v.as_raw());
        // SAFETY: only shapes, dtypes and strides are read.
        check(unsafe { sys::flashattn_supported_ex(self.as_raw(), &a, backward as i32) })
    }

    /// [`Context::workspace_size`] with the variants.
    pub fn workspace_size_ex(&self, q: &View, k: &View, v: &View, variants: &Variants, options: &Options, backward: bool) -> Result<usize> {
        let o = options.raw()?;
        let mut a = variants.args(&o)?;
        (a.q, a.k, a.v) = (q.as_raw(), k.as_raw(), v.as_raw());
        let mut n = 0;
        // SAFETY: only shapes, dtypes and strides are read; n is a valid out pointer.
        check(unsafe { sys::flashattn_workspace_size_ex(&mut n, self.as_raw(), &a, backward as i32) })?;
        Ok(n)
    }
}
