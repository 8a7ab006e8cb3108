//! Attention of host slices in one call: read in place by a CPU context, copied through device
//! buffers by a CUDA one.

use crate::{Backend, Buffer, Context, DType, Element, Error, Options, Result, Status, View, ViewMut};

/// The sizes of one call: q `[batch, seqlen_q, heads_q, head_dim]`, k and v `[batch, seqlen_k,
/// heads_kv, head_dim]`, the LSE `[batch, heads_q, seqlen_q]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
}

impl Dims {
    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_q, self.heads_q, self.head_dim]
    }

    pub fn k_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_k, self.heads_kv, self.head_dim]
    }

    pub fn lse_shape(&self) -> [usize; 3] {
        [self.batch, self.heads_q, self.seqlen_q]
    }
}

pub(crate) fn elements(shape: &[usize]) -> Result<usize> {
    shape.iter().try_fold(1usize, |n, &s| n.checked_mul(s))
        .ok_or_else(|| Error::new(Status::INVALID_SHAPE, format!("shape {shape:?} is too large")))
}

fn expect_len(name: &str, len: usize, shape: &[usize]) -> Result<()> {
    let want = elements(shape)?;
    if len != want {
        return Err(Error::new(Status::INVALID_SHAPE, format!("{name}: {len} values for shape {shape:?}, want {want}")));
    }
    Ok(())
}

/// Host data as views: in place on the CPU, through buffers of the context elsewhere.
pub(crate) enum Staged<'a, T: Element> {
    Host(&'a [T]),
    Device(Buffer),
}

impl<'a, T: Element> Staged<'a, T> {
    pub(crate) fn new(ctx: &Context, on_cpu: bool, data: &'a [T]) -> Result<Self> {
        Ok(if on_cpu { Staged::Host(data) } else { Staged::Device(ctx.buffer_from(data)?) })
    }

    fn view(&self, shape: &[usize]) -> Result<View<'_>> {
        match self {
            Staged::Host(data) => View::new(data, shape),
            Staged::Device(buf) => View::of_buffer(buf, 0, T::DTYPE, shape, None),
        }
    }
}

/// Outputs: written in place on the CPU, read back from buffers elsewhere.
pub(crate) struct Output<T: Element> {
    data: Vec<T>,
    buffer: Option<Buffer>,
    shape: Vec<usize>,
    dtype: DType,
}

impl<T: Element> Output<T> {
    pub(crate) fn new(ctx: &Context, on_cpu: bool, shape: &[usize], dtype: DType) -> Result<Self> {
        let n = elements(shape)?;
        let buffer = if on_cpu { None } else { Some(ctx.buffer((n * dtype.size()).max(1))?) };
        Ok(Output { data: vec![T::default(); n], buffer, shape: shape.to_vec(), dtype })
    }

    pub(crate) fn view(&mut self) -> Result<ViewMut<'_>> {
        match &mut self.buffer {
            None => ViewMut::new(&mut self.data, &self.shape),
            Some(buf) => ViewMut::of_buffer(buf, 0, self.dtype, &self.shape, None),
        }
    }

    pub(crate) fn finish(mut self) -> Result<Vec<T>> {
        if let Some(buf) = &self.buffer {
            buf.read(0, &mut self.data)?;
        }
        Ok(self.data)
    }
}

impl Context {
    pub(crate) fn on_cpu(&self) -> Result<bool> {
        Ok(self.backend()? == Backend::Cpu)
    }

    /// Attention of host data: returns out `[batch, seqlen_q, heads_q, head_dim]` and the LSE
    /// `[batch, heads_q, seqlen_q]`.
    pub fn attention<T: Element>(&self, dims: &Dims, q: &[T], k: &[T], v: &[T], options: &Options) -> Result<(Vec<T>, Vec<f32>)> {
        let (qs, ks, ls) = (dims.q_shape(), dims.k_shape(), dims.lse_shape());
        expect_len("q", q.len(), &qs)?;
        expect_len("k", k.len(), &ks)?;
        expect_len("v", v.len(), &ks)?;
        let cpu = self.on_cpu()?;
        let (sq, sk, sv) = (Staged::new(self, cpu, q)?, Staged::new(self, cpu, k)?, Staged::new(self, cpu, v)?);
        let mut out = Output::<T>::new(self, cpu, &qs, T::DTYPE)?;
        let mut lse = Output::<f32>::new(self, cpu, &ls, DType::F32)?;
        self.forward(&sq.view(&qs)?, &sk.view(&ks)?, &sv.view(&ks)?, &mut out.view()?, Some(&mut lse.view()?), options)?;
        Ok((out.finish()?, lse.finish()?))
    }

    /// Gradients (dq, dk, dv) of host data, given the forward's out and lse and the gradient
    /// dout of the loss with respect to out.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward<T: Element>(
        &self, dims: &Dims, q: &[T], k: &[T], v: &[T], out: &[T], dout: &[T], lse: &[f32], options: &Options,
    ) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
        let (qs, ks, ls) = (dims.q_shape(), dims.k_shape(), dims.lse_shape());
        for (name, len, shape) in [("q", q.len(), &qs), ("k", k.len(), &ks), ("v", v.len(), &ks), ("out", out.len(), &qs), ("dout", dout.len(), &qs)] {
            expect_len(name, len, shape)?;
        }
        expect_len("lse", lse.len(), &ls)?;
        let cpu = self.on_cpu()?;
        let staged = [q, k, v, out, dout].map(|d| Staged::new(self, cpu, d));
        let [sq, sk, sv, so, sd] = staged;
        let (sq, sk, sv, so, sd) = (sq?, sk?, sv?, so?, sd?);
        let sl = Staged::new(self, cpu, lse)?;
        let mut dq = Output::<T>::new(self, cpu, &qs, T::DTYPE)?;
        let mut dk = Output::<T>::new(self, cpu, &ks, T::DTYPE)?;
        let mut dv = Output::<T>::new(self, cpu, &ks, T::DTYPE)?;
        self.backward(
            &sq.view(&qs)?, &sk.view(&ks)?, &sv.view(&ks)?, &so.view(&qs)?, &sd.view(&qs)?, &sl.view(&ls)?,
            &mut dq.view()?, &mut dk.view()?, &mut dv.view()?, options,
        )?;
        Ok((dq.finish()?, dk.finish()?, dv.finish()?))
    }
}
