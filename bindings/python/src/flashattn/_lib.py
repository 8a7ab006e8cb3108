"""The low layer (the SWIG module) and the contexts the package computes with."""
import ctypes
import functools
import glob
import os
import sys
import threading


def _preload_library():
    # The extension carries the run path of the library it was built against; a relocated
    # library is named by FLASHATTN_LIBRARY_DIR and loaded first (same SONAME, so it is the one used).
    folder = os.environ.get("FLASHATTN_LIBRARY_DIR")
    if not folder:
        return
    candidates = [os.path.join(folder, "libflashattn.so")]
    candidates += sorted(glob.glob(os.path.join(folder, "libflashattn.so.*")))
    for path in candidates:
        if os.path.exists(path):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return
    raise ImportError("FLASHATTN_LIBRARY_DIR=%s holds no libflashattn.so" % folder)


_preload_library()

try:
    from . import flashattn_swig as low  # noqa: E402
except ImportError as e:
    if os.path.exists(os.path.join(os.path.dirname(__file__), "flashattn_swig.py")):
        raise
    raise ImportError(
        "flashattn: %s holds the package's Python sources only, not its compiled part; install "
        "it (pip install <repository>) or put a build's python/ folder (cmake "
        "-DFLASHATTN_BUILD_PYTHON=ON) on PYTHONPATH" % os.path.dirname(__file__)) from e

Error = low.Error


@functools.lru_cache(maxsize=None)
def _load_wheel_cublas():
    """Loads cuBLAS from NVIDIA's wheels (nvidia-cublas; torch brings it along) where they are
    installed. The CUDA backend opens libcublas.so.<major> by name first, which then finds this
    copy: a machine with a driver and no CUDA toolkit runs the CUDA backend too."""
    for folder in sys.path:
        for path in sorted(glob.glob(os.path.join(folder, "nvidia", "*", "lib", "libcublas.so.*"))):
            try:
                ctypes.CDLL(path)
            except OSError:
                pass  # another CUDA version's copy, or a broken one: the library says what it found

_BACKENDS = {
    "auto": low.FLASHATTN_BACKEND_AUTO,
    "cpu": low.FLASHATTN_BACKEND_CPU,
    "cuda": low.FLASHATTN_BACKEND_CUDA,
}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}
# The CPU backend's kernel copies, by the names FLASHATTN_CPU_ISA takes.
_CPU_KERNELS_NAMES = {
    low.FLASHATTN_CPU_KERNELS_GENERIC: "generic",
    low.FLASHATTN_CPU_KERNELS_AVX2: "avx2",
    low.FLASHATTN_CPU_KERNELS_AVX512: "avx512",
    low.FLASHATTN_CPU_KERNELS_AVX512BF16: "avx512bf16",
    low.FLASHATTN_CPU_KERNELS_AMX: "amx",
}


class Context:
    """A flashattn context: one backend ("cpu", "cuda" or "auto") and device, used by one thread
    at a time. Closed by close(), by a with-block, or when collected."""

    def __init__(self, backend="auto", device=0):
        code = _BACKENDS.get(backend) if isinstance(backend, str) else int(backend)
        if code is None:
            raise ValueError("backend must be one of %s, not %r" % (sorted(_BACKENDS), backend))
        if code != low.FLASHATTN_BACKEND_CPU and low.flashattn_has_cuda():
            _load_wheel_cublas()
        self._handle = low.flashattn_context_create(code, int(device))

    @property
    def handle(self):
        """The low layer's flashattn_context_t."""
        if self._handle is None:
            raise ValueError("the context is closed")
        return self._handle

    @property
    def backend(self):
        """"cpu" or "cuda"."""
        return _BACKEND_NAMES[low.flashattn_context_get_backend(self.handle)]

    @property
    def device(self):
        """The CUDA device ordinal, -1 for a CPU context."""
        return low.flashattn_context_get_device(self.handle)

    @property
    def cpu_kernels(self):
        """The kernel copy a CPU context computes with ("amx", "avx512bf16", "avx512", "avx2" or
        "generic"), chosen for this CPU at creation and capped by FLASHATTN_CPU_ISA; None for a
        CUDA context."""
        return _CPU_KERNELS_NAMES.get(low.flashattn_context_get_cpu_kernels(self.handle))

    @property
    def stream(self):
        """The cudaStream_t work is enqueued on, as an int (0 for a CPU context)."""
        return low.flashattn_context_get_stream(self.handle)

    def set_stream(self, stream):
        """Run later work on `stream` (a cudaStream_t as an int); None or 0: the context's own."""
        low.flashattn_context_set_stream(self.handle, stream or None)

    def set_num_threads(self, n):
        """Threads of a CPU context (0: one per hardware thread)."""
        low.flashattn_context_set_num_threads(self.handle, int(n))

    def synchronize(self):
        low.flashattn_context_synchronize(self.handle)

    def close(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            low.flashattn_context_destroy(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at collection time
            pass

    def __repr__(self):
        if self._handle is None:
            return "<flashattn.Context closed>"
        return "<flashattn.Context %s device %d>" % (self.backend, self.device)


_local = threading.local()


def context_for(device):
    """This thread's context for `device` (-1: the CPU), created on first use and kept."""
    cache = getattr(_local, "contexts", None)
    if cache is None:
        cache = _local.contexts = {}
    ctx = cache.get(device)
    if ctx is None:
        ctx = Context("cpu", 0) if device < 0 else Context("cuda", device)
        cache[device] = ctx
    return ctx
