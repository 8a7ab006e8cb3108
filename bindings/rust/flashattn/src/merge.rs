//! Merging partial results of attention by their log-sum-exp (flashattn_merge): the building
//! block of split-KV decode, cascade inference and context parallelism.
//!
//! ```
//! # use flashattn::ViewMut;
//! # fn main() -> Result<(), flashattn::Error> {
//! # let ctx = flashattn::Context::new(flashattn::Backend::Cpu, 0)?;
//! let (outs, lses) = (vec![1.0f32; 2 * 256], vec![0.0f32; 2 * 32]); // two parts of [1, 16, 2, 8]
//! let parts = flashattn::Parts::new(&outs, &lses, 2, &[1, 16, 2, 8], &[1, 2, 16])?;
//! let (mut out, mut lse) = (vec![0f32; 256], vec![0f32; 32]);
//! ctx.merge(&parts, &mut ViewMut::new(&mut out, &[1, 16, 2, 8])?, Some(&mut ViewMut::new(&mut lse, &[1, 2, 16])?))?;
//! # assert!(out.iter().all(|&x| x == 1.0) && lse.iter().all(|&l| (l - 2f32.ln()).abs() < 1e-6));
//! # Ok(())
//! # }
//! ```

use std::ptr;

use flashattn_sys as sys;

use crate::host::{elements, Output, Staged};
use crate::{check, Buffer, Context, DType, Dims, Element, Error, Result, Status, View, ViewMut};

/// The partial results [`Context::merge`] combines: `count` parts, part p's output (normalized
/// over that part's keys) and its LSE, as one strided view with a leading parts dimension: part
/// 0's views and the element strides from one part to the next.
pub struct Parts<'a> {
    out: View<'a>,
    lse: View<'a>,
    count: usize,
    out_stride: usize,
    lse_stride: usize,
}

fn parts_len(name: &str, len: usize, count: usize, shape: &[usize]) -> Result<usize> {
    if count == 0 {
        return Err(Error::new(Status::INVALID_ARGUMENT, format!("{name}: no parts (count is 0)")));
    }
    let part = elements(shape)?;
    let all = part.checked_mul(count).ok_or_else(|| Error::new(Status::INVALID_SHAPE, format!("{name}: {count} parts are too many")))?;
    if len != all {
        return Err(Error::new(Status::INVALID_SHAPE, format!("{name}: {len} values for {count} parts of shape {shape:?}, want {all}")));
    }
    Ok(part)
}

impl<'a> Parts<'a> {
    /// `count` parts one after another in host memory (usable by a CPU context): `out` holds
    /// their outputs, each of `shape` ([batch, seqlen, heads, head_dim], or [total_tokens, heads,
    /// head_dim] for a variable-length batch), `lse` their LSEs, each of `lse_shape` ([batch,
    /// heads, seqlen], or [heads, total_tokens]).
    pub fn new<T: Element>(out: &'a [T], lse: &'a [f32], count: usize, shape: &[usize], lse_shape: &[usize]) -> Result<Parts<'a>> {
        let out_stride = parts_len("parts_out", out.len(), count, shape)?;
        let lse_stride = parts_len("parts_lse", lse.len(), count, lse_shape)?;
        Ok(Parts {
            out: View::new(&out[..out_stride], shape)?,
            lse: View::new(&lse[..lse_stride], lse_shape)?,
            count,
            out_stride,
            lse_stride,
        })
    }

    /// `count` parts one after another from the start of two buffers, as [`Parts::new`] lays
    /// them out in host memory.
    pub fn of_buffers(out: &'a Buffer, lse: &'a Buffer, dtype: DType, count: usize, shape: &[usize], lse_shape: &[usize]) -> Result<Parts<'a>> {
        let out_stride = parts_len("parts_out", out.size() / dtype.size(), count, shape)?;
        let lse_stride = parts_len("parts_lse", lse.size() / DType::F32.size(), count, lse_shape)?;
        Ok(Parts {
            out: View::of_buffer(out, 0, dtype, shape, None)?,
            lse: View::of_buffer(lse, 0, DType::F32, lse_shape, None)?,
            count,
            out_stride,
            lse_stride,
        })
    }

    /// Parts of any layout: part 0's views and the element strides between parts.
    ///
    /// # Safety
    /// Part p's views, `out` moved by p * `out_stride` elements and `lse` by p * `lse_stride`,
    /// must lie in memory that stays valid and unwritten by others for `'a` and for the work
    /// enqueued with them, for every p below `count`.
    pub unsafe fn from_raw(out: View<'a>, out_stride: usize, lse: View<'a>, lse_stride: usize, count: usize) -> Parts<'a> {
        Parts { out, lse, count, out_stride, lse_stride }
    }

    pub fn count(&self) -> usize {
        self.count
    }
}

fn stride(name: &str, s: usize) -> Result<i64> {
    i64::try_from(s).map_err(|_| Error::new(Status::INVALID_STRIDE, format!("{name}: stride {s} does not fit 64 bits")))
}

impl Context {
    /// Merges the parts by their LSE into `out` (part 0's shape and dtype) and, when given, the
    /// merged LSE: `lse = log(sum_p exp(lse_p))`, `out = sum_p exp(lse_p - lse) out_p`, in f32,
    /// rounded once. A part whose LSE is -inf adds nothing; a row whose parts are all -inf gets 0
    /// and -inf; a NaN LSE makes its row NaN, +inf gives LSE +inf and a NaN output. On a CUDA
    /// context the work is enqueued on the context's stream. (In place, into one part's own
    /// memory, takes views made with the `from_raw` constructors.)
    pub fn merge(&self, parts: &Parts, out: &mut ViewMut, lse: Option<&mut ViewMut>) -> Result<()> {
        // SAFETY: a plain C struct; flashattn_merge_args_init fills it.
        let mut m: sys::flashattn_merge_args_t = unsafe { std::mem::zeroed() };
        check(unsafe { sys::flashattn_merge_args_init(&mut m) })?;
        m.num_parts = i64::try_from(parts.count).map_err(|_| Error::new(Status::INVALID_ARGUMENT, "too many parts"))?;
        m.parts_out = parts.out.as_raw();
        m.parts_out_stride = stride("parts_out", parts.out_stride)?;
        m.parts_lse = parts.lse.as_raw();
        m.parts_lse_stride = stride("parts_lse", parts.lse_stride)?;
        m.out = out.as_raw();
        m.lse = lse.map_or(ptr::null(), |l| l.as_raw());
        // SAFETY: the parts' views cover every part (checked when they were made, or promised by
        // from_raw); outputs are exclusive borrows; buffers outlive enqueued work.
        check(unsafe { sys::flashattn_merge(self.as_raw(), &m) })
    }

    /// Merges `count` partial results in host memory (see [`Context::merge`]): `outs` holds
    /// their outputs `[batch, seqlen_q, heads_q, head_dim]` one after another, `lses` their LSEs
    /// `[batch, heads_q, seqlen_q]`; returns the merged output and LSE. `dims.seqlen_k` and
    /// `dims.heads_kv` are not used.
    pub fn merge_parts<T: Element>(&self, dims: &Dims, count: usize, outs: &[T], lses: &[f32]) -> Result<(Vec<T>, Vec<f32>)> {
        let (qs, ls) = (dims.q_shape(), dims.lse_shape());
        let cpu = self.on_cpu()?;
        let (so, sl) = (Staged::new(self, cpu, outs)?, Staged::new(self, cpu, lses)?);
        let parts = match (&so, &sl) {
            (Staged::Host(o), Staged::Host(l)) => Parts::new(o, l, count, &qs, &ls)?,
            (Staged::Device(o), Staged::Device(l)) => Parts::of_buffers(o, l, T::DTYPE, count, &qs, &ls)?,
            _ => return Err(Error::new(Status::INTERNAL, "parts staged in two memories")),
        };
        let mut out = Output::<T>::new(self, cpu, &qs, T::DTYPE)?;
        let mut lse = Output::<f32>::new(self, cpu, &ls, DType::F32)?;
        self.merge(&parts, &mut out.view()?, Some(&mut lse.view()?))?;
        Ok((out.finish()?, lse.finish()?))
    }
}
