//! Context parallelism (ring attention): one sequence sharded over the ranks of a [`Ring`], each
//! with its own context; [`Context::ring_forward`] and [`Context::ring_backward`] are collective
//! calls that every rank makes (the header's "Context parallelism" paragraph, and
//! docs/context-parallel.md).
//!
//! The transport is the caller's: an exchange closure (host memory, CPU contexts) or an NCCL
//! communicator (CUDA contexts). Two ranks as threads of one process:
//! ```
//! # use flashattn::{Backend, Context, Layout, Options, Ring, Variants, View, ViewMut};
//! use std::sync::{Arc, Barrier, Mutex};
//! # fn main() {
//! let posted = Arc::new(Mutex::new(vec![Vec::new(); 2]));
//! let barrier = Arc::new(Barrier::new(2));
//! let threads: Vec<_> = (0..2usize).map(|rank| {
//!     let (posted, barrier) = (posted.clone(), barrier.clone());
//!     std::thread::spawn(move || {
//!         // Rank r sends to r + 1 and receives from r - 1.
//!         let mut exchange = |send: &[u8], recv: &mut [u8]| {
//!             posted.lock().unwrap()[rank] = send.to_vec();
//!             barrier.wait();
//!             recv.copy_from_slice(&posted.lock().unwrap()[1 - rank]);
//!             barrier.wait();
//!             true
//!         };
//!         let ctx = Context::new(Backend::Cpu, 0).unwrap();
//!         let (q, k, v) = (vec![0.5f32; 64], vec![0.25f32; 64], vec![1.0f32; 64]); // this rank's 4 tokens
//!         let mut out = vec![0f32; 64];
//!         let (qv, kv, vv) = (View::new(&q, &[1, 4, 2, 8]).unwrap(), View::new(&k, &[1, 4, 2, 8]).unwrap(), View::new(&v, &[1, 4, 2, 8]).unwrap());
//!         let mut ring = Ring::exchange(2, rank, Layout::Zigzag, &mut exchange);
//!         ctx.ring_forward(&mut ring, &qv, &kv, &vv, &mut ViewMut::new(&mut out, &[1, 4, 2, 8]).unwrap(), None, &Variants::default(), &Options::default().causal(true)).unwrap();
//!         assert!(out.iter().all(|&x| (x - 1.0).abs() < 1e-6)); // every v is 1
//!     })
//! }).collect();
//! for t in threads { t.join().unwrap(); }
//! # }
//! ```

use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use flashattn_sys as sys;

use crate::{check, Backend, Context, Error, Gradients, Options, Result, Status, Variants, View, ViewMut};

/// Where a rank's tokens sit in the sequence of `ranks * n` tokens (n: the shard's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Rank r holds tokens `[r n, (r + 1) n)`.
    Contiguous,
    /// The sequence in `2 ranks` chunks of `n / 2` tokens (n even): rank r holds chunk r, then
    /// chunk `2 ranks - 1 - r`, so that a causal mask gives every rank the same work.
    Zigzag,
}

/// The exchange of a ring: sends `send` to rank + 1 and fills `recv` (of the same length) from
/// rank - 1; returns true once both are done, false on failure (the call then fails with status
/// `DEVICE`). A panic inside it is caught and is a failure too.
pub type Exchange<'e> = &'e mut dyn FnMut(&[u8], &mut [u8]) -> bool;

enum Transport<'e> {
    None,
    Nccl(*mut c_void),
    Exchange(Exchange<'e>),
}

/// This rank's place in a ring of ranks, the layout of the shards, and the transport.
pub struct Ring<'e> {
    ranks: usize,
    rank: usize,
    layout: Layout,
    transport: Transport<'e>,
}

impl<'e> Ring<'e> {
    /// A ring of one rank: the calls are [`Context::forward_ex`] and [`Context::backward_ex`].
    pub fn single(layout: Layout) -> Ring<'static> {
        Ring { ranks: 1, rank: 0, layout, transport: Transport::None }
    }

    /// A ring whose shards travel through `exchange` (host memory: CPU contexts).
    pub fn exchange(ranks: usize, rank: usize, layout: Layout, exchange: Exchange<'e>) -> Ring<'e> {
        Ring { ranks, rank, layout, transport: Transport::Exchange(exchange) }
    }

    /// A ring over an NCCL communicator (CUDA contexts).
    ///
    /// # Safety
    /// `comm` is an `ncclComm_t` of `ranks` ranks, this process's rank `rank`, on the context's
    /// device, that stays alive for every call made with this ring.
    pub unsafe fn nccl(ranks: usize, rank: usize, layout: Layout, comm: *mut c_void) -> Ring<'static> {
        Ring { ranks, rank, layout, transport: Transport::Nccl(comm) }
    }

    /// The C struct for one call; its exchange_user points at `self.transport`'s closure.
    fn raw(&mut self, ctx: &Context) -> Result<sys::flashattn_cp_args_t> {
        let mut cp = std::mem::MaybeUninit::<sys::flashattn_cp_args_t>::uninit();
        // SAFETY: given the struct's own size, init_sized fills the whole struct on success.
        check(unsafe { sys::flashattn_cp_args_init_sized(cp.as_mut_ptr(), std::mem::size_of::<sys::flashattn_cp_args_t>()) })?;
        let mut cp = unsafe { cp.assume_init() };
        // Counts past i64 are refused by the library as out of range.
        cp.ranks = i64::try_from(self.ranks).unwrap_or(i64::MAX);
        cp.rank = i64::try_from(self.rank).unwrap_or(i64::MAX);
        cp.layout = match self.layout {
            Layout::Contiguous => sys::flashattn_cp_layout_FLASHATTN_CP_LAYOUT_CONTIGUOUS as i64,
            Layout::Zigzag => sys::flashattn_cp_layout_FLASHATTN_CP_LAYOUT_ZIGZAG as i64,
        };
        match &mut self.transport {
            Transport::None => {}
            Transport::Nccl(comm) => cp.nccl_comm = *comm,
            Transport::Exchange(f) => {
                if ctx.backend()? == Backend::Cuda {
                    return Err(Error::new(
                        Status::INVALID_ARGUMENT,
                        "ring: an exchange closure moves host memory; a CUDA context needs an NCCL ring (Ring::nccl)",
                    ));
                }
                cp.exchange = Some(trampoline);
                cp.exchange_user = f as *mut Exchange<'e> as *mut c_void;
            }
        }
        Ok(cp)
    }
}

unsafe extern "C" fn trampoline(user: *mut c_void, send: *const c_void, recv: *mut c_void, bytes: usize) -> c_int {
    // SAFETY: user is the Exchange that Ring::raw stored, borrowed for the call; send and recv
    // are distinct regions of `bytes` bytes of host workspace (a CPU context's), valid until the
    // exchange returns.
    let f = &mut *(user as *mut Exchange);
    let (s, r) = (std::slice::from_raw_parts(send as *const u8, bytes), std::slice::from_raw_parts_mut(recv as *mut u8, bytes));
    match catch_unwind(AssertUnwindSafe(|| f(s, r))) {
        Ok(true) => 0,
        _ => 1,
    }
}

impl Context {
    /// This rank's part of the forward over the whole sequence: `out` and, when given, `lse`
    /// of its queries (`q`, `k`, `v`: its shard, `[batch, n, heads, head_dim]`). Masks in
    /// `options` (causal, window) are the sequence's, positions global; `variants` may carry
    /// sinks (no ALiBi or offsets). A collective call: every rank of the ring makes it.
    #[allow(clippy::too_many_arguments)]
    pub fn ring_forward(
        &self, ring: &mut Ring, q: &View, k: &View, v: &View, out: &mut ViewMut, lse: Option<&mut ViewMut>, variants: &Variants,
        options: &Options,
    ) -> Result<()> {
        let o = options.raw()?;
        let mut a = variants.args(&o)?;
        (a.q, a.k, a.v, a.out) = (q.as_raw(), k.as_raw(), v.as_raw(), out.as_raw());
        a.lse = lse.map_or(ptr::null(), |l| l.as_raw());
        let cp = ring.raw(self)?;
        // SAFETY: as in forward_ex; cp's exchange_user points into `ring`, borrowed for the call.
        check(unsafe { sys::flashattn_cp_forward(self.as_raw(), &cp, &a, ptr::null_mut(), 0) })
    }

    /// This rank's part of the backward: `grads` of its shard (dsinks: its rows' share; sum it
    /// over the ranks) from the shard's q, k, v, dout and the ring forward's out and lse.
    #[allow(clippy::too_many_arguments)]
    pub fn ring_backward(
        &self, ring: &mut Ring, q: &View, k: &View, v: &View, out: &View, dout: &View, lse: &View, grads: Gradients,
        variants: &Variants, options: &Options,
    ) -> Result<()> {
        let o = options.raw()?;
        let mut a = variants.args(&o)?;
        (a.q, a.k, a.v, a.out, a.dout, a.lse) = (q.as_raw(), k.as_raw(), v.as_raw(), out.as_raw(), dout.as_raw(), lse.as_raw());
        (a.dq, a.dk, a.dv) = (grads.dq.as_raw(), grads.dk.as_raw(), grads.dv.as_raw());
        a.dsinks = grads.dsinks.map_or(ptr::null(), |d| d.as_raw());
        let cp = ring.raw(self)?;
        // SAFETY: as in ring_forward.
        check(unsafe { sys::flashattn_cp_backward(self.as_raw(), &cp, &a, ptr::null_mut(), 0) })
    }

    /// The scratch the ring calls need (and, as every rank must, whether they would be refused:
    /// agree on it before the first call).
    pub fn ring_workspace_size(
        &self, ring: &mut Ring, q: &View, k: &View, v: &View, variants: &Variants, options: &Options, backward: bool,
    ) -> Result<usize> {
        let o = options.raw()?;
        let mut a = variants.args(&o)?;
        (a.q, a.k, a.v) = (q.as_raw(), k.as_raw(), v.as_raw());
        let cp = ring.raw(self)?;
        let mut n = 0;
        // SAFETY: only shapes, dtypes and strides are read; the transport is not used.
        check(unsafe { sys::flashattn_cp_workspace_size(&mut n, self.as_raw(), &cp, &a, backward as i32) })?;
        Ok(n)
    }
}
