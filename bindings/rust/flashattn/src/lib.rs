//! Exact attention, `softmax(scale · Q Kᵀ + mask) V`, computed the FlashAttention way by
//! libflashattn on the CPU or a CUDA GPU: the safe API above the `flashattn-sys` crate.
//!
//! ```
//! # fn main() -> Result<(), flashattn::Error> {
//! let ctx = flashattn::Context::new(flashattn::Backend::Cpu, 0)?; // or Backend::Cuda on a GPU
//! let dims = flashattn::Dims { batch: 1, seqlen_q: 16, seqlen_k: 16, heads_q: 2, heads_kv: 2, head_dim: 8 };
//! let (q, k, v) = (vec![0.5f32; 256], vec![0.25f32; 256], vec![1.0f32; 256]);
//! let (out, lse) = ctx.attention(&dims, &q, &k, &v, &flashattn::Options::default().causal(true))?;
//! println!("{} outputs, {} log-sum-exps", out.len(), lse.len());
//! # assert_eq!((out.len(), lse.len()), (256, 32));
//! # Ok(())
//! # }
//! ```
//!
//! Layout: q is `[batch, seqlen_q, heads_q, head_dim]`, k and v `[batch, seqlen_k, heads_kv,
//! head_dim]` (heads_q a multiple of heads_kv), the LSE `[batch, heads_q, seqlen_q]` f32.
//! Elements are `f32`, [`F16`] or [`BF16`].
//!
//! Handles free themselves when dropped ([`Context`], [`Buffer`]); every failure is an
//! [`Error`] carrying the library's status and message. A context is `Send` but not `Sync`: the
//! C API lets one thread at a time use it. Views ([`View`], [`ViewMut`]) borrow the slice or
//! buffer they look at, so an output cannot alias anything else the call reads.

use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

use flashattn_sys as sys;

mod host;
mod kvcache;
mod merge;
mod ring;
mod variants;
mod view;

pub use host::Dims;
pub use kvcache::{KvCache, Rotary};
pub use merge::Parts;
pub use ring::{Exchange, Layout, Ring};
pub use variants::{Gradients, Variants};
pub use view::{Element, View, ViewMut, BF16, F16};

/// A status of the C API (`flashattn_status_t`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub u32);

impl Status {
    pub const SUCCESS: Status = Status(sys::flashattn_status_FLASHATTN_SUCCESS);
    pub const INVALID_ARGUMENT: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_INVALID_ARGUMENT);
    pub const INVALID_SHAPE: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_INVALID_SHAPE);
    pub const INVALID_DTYPE: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_INVALID_DTYPE);
    pub const INVALID_STRIDE: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_INVALID_STRIDE);
    pub const INVALID_MEMORY: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_INVALID_MEMORY);
    pub const WORKSPACE_TOO_SMALL: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_WORKSPACE_TOO_SMALL);
    pub const CONTEXT_BUSY: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_CONTEXT_BUSY);
    pub const UNSUPPORTED: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_UNSUPPORTED);
    pub const BACKEND_UNAVAILABLE: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_BACKEND_UNAVAILABLE);
    pub const OUT_OF_MEMORY: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_OUT_OF_MEMORY);
    pub const DEVICE_OUT_OF_MEMORY: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY);
    pub const DEVICE: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_DEVICE);
    pub const INTERNAL: Status = Status(sys::flashattn_status_FLASHATTN_ERROR_INTERNAL);

    /// The status's name, e.g. `"FLASHATTN_ERROR_INVALID_SHAPE"`.
    pub fn name(self) -> &'static str {
        // SAFETY: flashattn_status_string returns a static, NUL-terminated string for any value.
        unsafe { CStr::from_ptr(sys::flashattn_status_string(self.0)) }.to_str().unwrap_or("?")
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// A failing call: the status and the library's message (or, for a mistake caught before the
/// library is called, this crate's), e.g. `flashattn_forward: k: head_dim 16 differs from q's 32`.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    pub fn status(&self) -> Status {
        self.status
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Ok for success; otherwise the error with this thread's last-error message, read right away
/// (the status, never the message, says whether the call failed).
pub(crate) fn check(status: sys::flashattn_status_t) -> Result<()> {
    if status == sys::flashattn_status_FLASHATTN_SUCCESS {
        return Ok(());
    }
    // SAFETY: flashattn_last_error never returns NULL; the string is valid until the next call.
    let message = unsafe { CStr::from_ptr(sys::flashattn_last_error()) }.to_string_lossy().into_owned();
    Err(Error { status: Status(status), message })
}

/// The loaded library's version, `"MAJOR.MINOR.PATCH"`.
pub fn version() -> &'static str {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::flashattn_version_string()) }.to_str().unwrap_or("?")
}

/// Whether the loaded library has its CUDA backend compiled in.
pub fn has_cuda() -> bool {
    // SAFETY: no arguments, no preconditions.
    unsafe { sys::flashattn_has_cuda() != 0 }
}

/// The number of CUDA devices the library can use (0 without CUDA, driver or device).
pub fn cuda_device_count() -> Result<usize> {
    let mut n = 0;
    // SAFETY: n is a valid out pointer.
    check(unsafe { sys::flashattn_cuda_device_count(&mut n) })?;
    Ok(n as usize)
}

/// Where a context computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// CUDA when a device is usable, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

impl Backend {
    fn raw(self) -> sys::flashattn_backend_t {
        match self {
            Backend::Auto => sys::flashattn_backend_FLASHATTN_BACKEND_AUTO,
            Backend::Cpu => sys::flashattn_backend_FLASHATTN_BACKEND_CPU,
            Backend::Cuda => sys::flashattn_backend_FLASHATTN_BACKEND_CUDA,
        }
    }
}

/// The CPU backend's kernel copies, one per instruction set (`Context::cpu_kernels`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuKernels {
    /// The target's baseline.
    Generic,
    /// AVX2 + FMA.
    Avx2,
    /// AVX-512 F/VL/BW/DQ.
    Avx512,
    /// AVX-512 BF16: bf16 products on vdpbf16ps pairs.
    Avx512Bf16,
    /// AMX-BF16: bf16 products on tiles.
    Amx,
}

impl CpuKernels {
    /// The copy's name as `FLASHATTN_CPU_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            CpuKernels::Generic => "generic",
            CpuKernels::Avx2 => "avx2",
            CpuKernels::Avx512 => "avx512",
            CpuKernels::Avx512Bf16 => "avx512bf16",
            CpuKernels::Amx => "amx",
        }
    }
}

/// Element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// f32 (CPU backend only)
    F32,
    F16,
    BF16,
    /// i32: the offsets of a variable-length batch, a KV cache's lengths and block table only
    I32,
}

impl DType {
    pub(crate) fn raw(self) -> sys::flashattn_dtype_t {
        match self {
            DType::F32 => sys::flashattn_dtype_FLASHATTN_DTYPE_FLOAT32,
            DType::F16 => sys::flashattn_dtype_FLASHATTN_DTYPE_FLOAT16,
            DType::BF16 => sys::flashattn_dtype_FLASHATTN_DTYPE_BFLOAT16,
            DType::I32 => sys::flashattn_dtype_FLASHATTN_DTYPE_INT32,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
}

/// Flash (tiled, the default) or standard attention (S and P materialized: the baseline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Algorithm {
    #[default]
    Flash,
    Standard,
}

/// Options of a call. The default: scale 1/sqrt(head_dim), no mask, flash, not deterministic.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Options {
    /// The softmax scale; `None` selects 1/sqrt(head_dim).
    pub scale: Option<f32>,
    /// Mask key j for query i when j > i + seqlen_k - seqlen_q (bottom-right aligned).
    pub causal: bool,
    pub algorithm: Algorithm,
    /// Bit-identical backward results run after run.
    pub deterministic: bool,
    /// A sliding window `(left, right)`: query i sees the keys j with
    /// `i + diag - left <= j <= i + diag + right`, diag = seqlen_k - seqlen_q; -1 leaves a side
    /// unbounded. With `causal` the right bound is at most 0.
    pub window: Option<(i32, i32)>,
    /// A softcap c > 0: each score s becomes `c * tanh(s / c)` before the masks and the softmax.
    pub softcap: Option<f32>,
    /// The parts the flash forward splits each sequence's keys into (CUDA: where it splits
    /// them, few query rows against many keys; CPU: every work item's keys), merged by their
    /// LSE: the same attention up to rounding; `None` lets the library choose.
    pub num_splits: Option<i64>,
}

impl Options {
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    pub fn deterministic(mut self, deterministic: bool) -> Self {
        self.deterministic = deterministic;
        self
    }

    pub fn window(mut self, left: i32, right: i32) -> Self {
        self.window = Some((left, right));
        self
    }

    pub fn softcap(mut self, softcap: f32) -> Self {
        self.softcap = Some(softcap);
        self
    }

    pub fn num_splits(mut self, num_splits: i64) -> Self {
        self.num_splits = Some(num_splits);
        self
    }

    fn raw(&self) -> Result<sys::flashattn_options_t> {
        let mut o = std::mem::MaybeUninit::<sys::flashattn_options_t>::uninit();
        // SAFETY: given the struct's own size, options_init_sized fills the whole struct on
        // success (what C's flashattn_options_init(&o) macro passes).
        check(unsafe {
            sys::flashattn_options_init_sized(
                o.as_mut_ptr(),
                std::mem::size_of::<sys::flashattn_options_t>(),
            )
        })?;
        let mut o = unsafe { o.assume_init() };
        o.softmax_scale = self.scale.unwrap_or(0.0);
        o.causal = self.causal as i32;
        o.algorithm = match self.algorithm {
            Algorithm::Flash => sys::flashattn_algorithm_FLASHATTN_ALGORITHM_FLASH,
            Algorithm::Standard => sys::flashattn_algorithm_FLASHATTN_ALGORITHM_STANDARD,
        };
        o.deterministic = self.deterministic as i32;
        if let Some((left, right)) = self.window {
            (o.window, o.window_left, o.window_right) = (1, left, right);
        }
        o.softcap = self.softcap.unwrap_or(0.0);
        o.num_splits = self.num_splits.unwrap_or(0);
        Ok(o)
    }
}

/// A context: one backend and device, with what work there needs (threads; stream, cuBLAS
/// handle, scratch memory). Destroyed when dropped, after its enqueued work.
///
/// It may move to another thread, but is not shared between threads:
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<flashattn::Context>();
/// ```
pub struct Context {
    raw: NonNull<sys::flashattn_context>,
}

// SAFETY: the C API lets a context move between threads; it is used by one thread at a time,
// which `&self` methods and the absence of `Sync` guarantee.
unsafe impl Send for Context {}

impl Context {
    /// A context for `backend` (and, for CUDA, `device`).
    pub fn new(backend: Backend, device: usize) -> Result<Context> {
        let device = i32::try_from(device)
            .map_err(|_| Error::new(Status::INVALID_ARGUMENT, format!("device {device} is too large")))?;
        let mut raw = ptr::null_mut();
        // SAFETY: raw is a valid out pointer.
        check(unsafe { sys::flashattn_context_create(&mut raw, backend.raw(), device) })?;
        Ok(Context { raw: NonNull::new(raw).expect("flashattn_context_create succeeded with NULL") })
    }

    /// The raw handle, for calls through `flashattn-sys`; it stays owned by this context.
    pub fn as_raw(&self) -> sys::flashattn_context_t {
        self.raw.as_ptr()
    }

    /// The backend it runs on (Auto resolved).
    pub fn backend(&self) -> Result<Backend> {
        let mut b = 0;
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::flashattn_context_get_backend(&mut b, self.as_raw()) })?;
        Ok(if b == sys::flashattn_backend_FLASHATTN_BACKEND_CUDA { Backend::Cuda } else { Backend::Cpu })
    }

    /// The kernel copy a CPU context computes with, chosen for this CPU at creation and capped
    /// by `FLASHATTN_CPU_ISA`; `None` for a CUDA context.
    pub fn cpu_kernels(&self) -> Result<Option<CpuKernels>> {
        let mut k = sys::flashattn_cpu_kernels_FLASHATTN_CPU_KERNELS_NONE;
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::flashattn_context_get_cpu_kernels(&mut k, self.as_raw()) })?;
        Ok(match k {
            sys::flashattn_cpu_kernels_FLASHATTN_CPU_KERNELS_GENERIC => Some(CpuKernels::Generic),
            sys::flashattn_cpu_kernels_FLASHATTN_CPU_KERNELS_AVX2 => Some(CpuKernels::Avx2),
            sys::flashattn_cpu_kernels_FLASHATTN_CPU_KERNELS_AVX512 => Some(CpuKernels::Avx512),
            sys::flashattn_cpu_kernels_FLASHATTN_CPU_KERNELS_AVX512BF16 => Some(CpuKernels::Avx512Bf16),
            sys::flashattn_cpu_kernels_FLASHATTN_CPU_KERNELS_AMX => Some(CpuKernels::Amx),
            _ => None,
        })
    }

    /// The CUDA device ordinal, `None` for a CPU context.
    pub fn device(&self) -> Result<Option<usize>> {
        let mut d = 0;
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::flashattn_context_get_device(&mut d, self.as_raw()) })?;
        Ok(usize::try_from(d).ok())
    }

    /// The cudaStream_t work is enqueued on (null for a CPU context).
    pub fn stream(&self) -> Result<*mut c_void> {
        let mut s = ptr::null_mut();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::flashattn_context_get_stream(&mut s, self.as_raw()) })?;
        Ok(s)
    }

    /// Runs later work on `stream` (a cudaStream_t of the context's device; null: the
    /// context's own).
    ///
    /// # Safety
    /// `stream` must be a valid stream of the context's device and outlive its use here.
    pub unsafe fn set_stream(&self, stream: *mut c_void) -> Result<()> {
        check(sys::flashattn_context_set_stream(self.as_raw(), stream))
    }

    /// Threads of a CPU context (0: one per hardware thread).
    pub fn set_num_threads(&self, n: usize) -> Result<()> {
        let n = i32::try_from(n).unwrap_or(i32::MAX);
        // SAFETY: valid handle.
        check(unsafe { sys::flashattn_context_set_num_threads(self.as_raw(), n) })
    }

    /// Waits for the work enqueued on the context's stream.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::flashattn_context_synchronize(self.as_raw()) })
    }

    /// A buffer of `bytes` of the context's memory (device memory for CUDA), contents undefined.
    pub fn buffer(&self, bytes: usize) -> Result<Buffer> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid handle and out pointer.
        check(unsafe { sys::flashattn_buffer_create(&mut raw, self.as_raw(), bytes) })?;
        let raw = NonNull::new(raw).expect("flashattn_buffer_create succeeded with NULL");
        let mut data = ptr::null_mut();
        // SAFETY: raw is a live buffer.
        if let Err(e) = check(unsafe { sys::flashattn_buffer_data(&mut data, raw.as_ptr()) }) {
            unsafe { sys::flashattn_buffer_destroy(raw.as_ptr()) };
            return Err(e);
        }
        Ok(Buffer { raw, data, size: bytes })
    }

    /// A buffer holding a copy of `data`.
    pub fn buffer_from<T: Element>(&self, data: &[T]) -> Result<Buffer> {
        let buf = self.buffer(std::mem::size_of_val(data).max(1))?;
        buf.write(0, data)?;
        Ok(buf)
    }

    /// Forward attention: `out = softmax(scale q kᵀ + mask) v`, and, when given, the log-sum-exp
    /// of each row. On a CUDA context the work is enqueued on the context's stream.
    pub fn forward(&self, q: &View, k: &View, v: &View, out: &mut ViewMut, lse: Option<&mut ViewMut>, options: &Options) -> Result<()> {
        let o = options.raw()?;
        let lse = lse.map_or(ptr::null(), |l| l.as_raw() as *const _);
        // SAFETY: every view borrows memory that covers it (checked when it was made) for the
        // whole call; outputs are exclusive borrows; buffers outlive enqueued work (their
        // destruction waits for it).
        check(unsafe {
            sys::flashattn_forward(self.as_raw(), q.as_raw(), k.as_raw(), v.as_raw(), out.as_raw(), lse, &o, ptr::null_mut(), 0)
        })
    }

    /// Backward attention: dq, dk, dv from the forward's q, k, v, out, lse and the gradient
    /// dout. `options` must be the forward's.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self, q: &View, k: &View, v: &View, out: &View, dout: &View, lse: &View,
        dq: &mut ViewMut, dk: &mut ViewMut, dv: &mut ViewMut, options: &Options,
    ) -> Result<()> {
        let o = options.raw()?;
        // SAFETY: as in forward.
        check(unsafe {
            sys::flashattn_backward(
                self.as_raw(), q.as_raw(), k.as_raw(), v.as_raw(), out.as_raw(), dout.as_raw(), lse.as_raw(),
                dq.as_raw(), dk.as_raw(), dv.as_raw(), &o, ptr::null_mut(), 0,
            )
        })
    }

    /// Ok when this context can run the configuration (the backward too when `backward`);
    /// otherwise why not.
    pub fn supported(&self, q: &View, k: &View, v: &View, options: &Options, backward: bool) -> Result<()> {
        let o = options.raw()?;
        // SAFETY: only shapes, dtypes and strides are read.
        check(unsafe { sys::flashattn_supported(self.as_raw(), q.as_raw(), k.as_raw(), v.as_raw(), &o, backward as i32) })
    }

    /// The scratch memory a call needs (the context allocates and keeps it).
    pub fn workspace_size(&self, q: &View, k: &View, v: &View, options: &Options, backward: bool) -> Result<usize> {
        let o = options.raw()?;
        let mut n = 0;
        // SAFETY: only shapes, dtypes and strides are read; n is a valid out pointer.
        check(unsafe {
            sys::flashattn_workspace_size(&mut n, self.as_raw(), q.as_raw(), k.as_raw(), v.as_raw(), &o, backward as i32)
        })?;
        Ok(n)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once. A status reporting an earlier
        // asynchronous error has no one to go to here; the context is destroyed regardless.
        unsafe { sys::flashattn_context_destroy(self.raw.as_ptr()) };
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("backend", &self.backend()).field("device", &self.device()).finish()
    }
}

/// Memory of a context (device memory for CUDA, host memory for the CPU), 256-byte aligned.
/// Freed when dropped, after the work enqueued on its context; it may outlive the context.
pub struct Buffer {
    raw: NonNull<sys::flashattn_buffer>,
    data: *mut c_void,
    size: usize,
}

// SAFETY: as for Context: a buffer may move between threads and is used by one at a time.
unsafe impl Send for Buffer {}

impl Buffer {
    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The base address (device memory for a CUDA context).
    pub fn as_ptr(&self) -> *mut c_void {
        self.data
    }

    pub fn as_raw(&self) -> sys::flashattn_buffer_t {
        self.raw.as_ptr()
    }

    /// Copies `src` into the buffer at byte `offset`.
    pub fn write<T: Element>(&self, offset: usize, src: &[T]) -> Result<()> {
        // SAFETY: src is valid for its size in bytes; the library checks the range.
        check(unsafe { sys::flashattn_buffer_write(self.as_raw(), offset, src.as_ptr().cast(), std::mem::size_of_val(src)) })
    }

    /// Fills `dst` from the buffer at byte `offset` (after the context's enqueued work).
    pub fn read<T: Element>(&self, offset: usize, dst: &mut [T]) -> Result<()> {
        // SAFETY: dst is valid for writes of its size, and every bit pattern is a valid Element.
        check(unsafe { sys::flashattn_buffer_read(self.as_raw(), offset, dst.as_mut_ptr().cast(), std::mem::size_of_val(dst)) })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: live handle, dropped once; destruction waits for enqueued work.
        unsafe { sys::flashattn_buffer_destroy(self.raw.as_ptr()) };
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer").field("size", &self.size).field("data", &self.data).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_named() {
        assert_eq!(Status::INVALID_SHAPE.name(), "FLASHATTN_ERROR_INVALID_SHAPE");
        assert_eq!(Status(12345).name(), "FLASHATTN_UNKNOWN_STATUS");
    }

    #[test]
    fn handles_are_send() {
        fn send<T: Send>() {}
        send::<Context>();
        send::<Buffer>();
        send::<Error>();
    }

    #[test]
    fn version_matches_the_header() {
        assert_eq!(version().as_bytes(), &sys::FLASHATTN_VERSION_STRING[..sys::FLASHATTN_VERSION_STRING.len() - 1]);
        // SAFETY: no arguments.
        assert_eq!(unsafe { sys::flashattn_version_number() }, sys::FLASHATTN_VERSION_NUMBER);
    }
}
