"""What the library needs to know of an array (address, dtype, shape, strides in elements,
device), read without a copy from numpy arrays, torch tensors (data_ptr / stride) and cupy arrays
(__cuda_array_interface__); other arrays through DLPack. Outputs are allocated by the inputs'
own library."""
import sys

import numpy as np

from ._lib import Error, low

FLOAT32 = low.FLASHATTN_DTYPE_FLOAT32
FLOAT16 = low.FLASHATTN_DTYPE_FLOAT16
BFLOAT16 = low.FLASHATTN_DTYPE_BFLOAT16
# Offsets of a variable-length batch, a KV cache's lengths and block table.
INT32 = low.FLASHATTN_DTYPE_INT32

# cudaStreamLegacy: what a stream handle of 0 (the default stream) means to torch and cupy. A NULL
# stream would mean "the context's own stream" to flashattn_context_set_stream.
_CUDA_STREAM_LEGACY = 1


class Array:
    """One array as the library sees it. kind: "numpy", "torch" or "cupy"; device: -1 for host
    memory, else the CUDA ordinal."""

    __slots__ = ("name", "obj", "kind", "device", "dtype", "address", "shape", "strides")

    def __init__(self, name, obj, kind, device, dtype, address, shape, strides):
        self.name, self.obj, self.kind, self.device = name, obj, kind, device
        self.dtype, self.address, self.shape, self.strides = dtype, address, shape, strides

    def view(self):
        """A low-level flashattn_tensor_t over this array."""
        rank = len(self.shape)
        if rank > low.FLASHATTN_MAX_RANK:
            raise Error(low.FLASHATTN_ERROR_INVALID_SHAPE,
                        "%s: rank is %d, at most %d is possible" % (self.name, rank,
                                                                    low.FLASHATTN_MAX_RANK))
        pad = (0,) * (low.FLASHATTN_MAX_RANK - rank)
        t = low.flashattn_tensor_t()
        t.data = self.address
        t.dtype = self.dtype
        t.rank = rank
        t.shape = tuple(self.shape) + pad
        t.strides = tuple(self.strides) + pad
        return t


def _dtype_code(name, dtype):
    """The flashattn dtype of a numpy dtype (ml_dtypes.bfloat16 counts as bfloat16)."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return FLOAT32
    if dtype == np.float16:
        return FLOAT16
    if dtype.name == "bfloat16" and dtype.itemsize == 2:
        return BFLOAT16
    if dtype == np.int32:
        return INT32
    raise Error(low.FLASHATTN_ERROR_INVALID_DTYPE,
                "%s: dtype %s is not supported (float32, float16 or bfloat16; int32 for offsets, "
                "lengths and block tables)" % (name, dtype))


def _element_strides(name, byte_strides, itemsize):
    out = []
    for s in byte_strides:
        if s % itemsize != 0:
            raise Error(low.FLASHATTN_ERROR_INVALID_STRIDE,
                        "%s: a stride of %d bytes is not a multiple of its %d-byte elements"
                        % (name, s, itemsize))
        out.append(s // itemsize)
    return tuple(out)


def _from_numpy(name, x):
    code = _dtype_code(name, x.dtype)
    strides = _element_strides(name, x.strides, x.dtype.itemsize)
    return Array(name, x, "numpy", -1, code, x.__array_interface__["data"][0], x.shape, strides)


def _from_torch(name, x, torch):
    codes = {torch.float32: FLOAT32, torch.float16: FLOAT16, torch.bfloat16: BFLOAT16,
             torch.int32: INT32}
    if x.layout != torch.strided:
        raise TypeError("%s: a strided tensor is expected, not %s" % (name, x.layout))
    if x.dtype not in codes:
        raise Error(low.FLASHATTN_ERROR_INVALID_DTYPE,
                    "%s: dtype %s is not supported (float32, float16 or bfloat16; int32 for "
                    "offsets, lengths and block tables)" % (name, x.dtype))
    if x.device.type == "cuda":
        device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    elif x.device.type == "cpu":
        device = -1
    else:
        raise TypeError("%s: tensors on %s are not supported (cpu or cuda)" % (name, x.device))
    return Array(name, x, "torch", device, codes[x.dtype], x.data_ptr(), tuple(x.shape),
                 tuple(x.stride()))


def _from_cupy(name, x):
    cai = x.__cuda_array_interface__
    code = _dtype_code(name, x.dtype)
    itemsize = x.dtype.itemsize
    shape = tuple(cai["shape"])
    if cai.get("strides") is None:  # C-contiguous
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        strides = tuple(reversed(strides))
    else:
        strides = _element_strides(name, cai["strides"], itemsize)
    return Array(name, x, "cupy", x.device.id, code, cai["data"][0], shape, strides)


def describe(name, x):
    """An Array for x; TypeError for something that is not an array flashattn can read."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _from_torch(name, x, torch)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return _from_cupy(name, x)
    if isinstance(x, np.ndarray):
        return _from_numpy(name, x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        device_type = x.__dlpack_device__()[0]
        if device_type == 1:  # kDLCPU
            return _from_numpy(name, np.from_dlpack(x))
        if device_type == 2:  # kDLCUDA
            try:
                import cupy
            except ImportError:
                import torch
                return _from_torch(name, torch.from_dlpack(x), torch)
            return _from_cupy(name, cupy.from_dlpack(x))
    if hasattr(x, "__cuda_array_interface__"):
        import cupy
        return _from_cupy(name, cupy.asarray(x))
    raise TypeError("%s: a numpy array, torch tensor or cupy array is expected, not %s"
                    % (name, type(x).__name__))


def describe_all(names, arrays):
    """Arrays of one kind and one device, as one call needs them."""
    out = [describe(n, a) for n, a in zip(names, arrays)]
    first = out[0]
    for a in out[1:]:
        if a.kind != first.kind or a.device != first.device:
            where = lambda b: "%s on %s" % (b.kind, "the host" if b.device < 0 else "cuda:%d" % b.device)  # noqa: E731
            raise TypeError("%s is %s but %s is %s: all arrays of a call must be of one kind and "
                            "device" % (a.name, where(a), first.name, where(first)))
    return out


def stack(name, arrays):
    """One array with a new leading dimension from a sequence of arrays of one kind (a copy, by
    their own library)."""
    if len(arrays) == 0:
        raise Error(low.FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: no parts given" % name)
    described = describe_all(["%s[%d]" % (name, i) for i in range(len(arrays))], arrays)
    kind = described[0].kind
    if kind == "numpy":
        return np.stack([a.obj for a in described])
    if kind == "torch":
        return sys.modules["torch"].stack([a.obj for a in described])
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(described[0].device):
        return cupy.stack([a.obj for a in described])


def part(array):
    """The first part of an Array with a leading parts dimension, and the element stride from one
    part to the next."""
    return (Array(array.name, array.obj, array.kind, array.device, array.dtype, array.address,
                  tuple(array.shape[1:]), tuple(array.strides[1:])), array.strides[0])


def empty(like, shape, float32=False, zero=False):
    """A new C-contiguous array of `like`'s kind and device, of its dtype (or float32); zero-filled
    with zero=True."""
    if like.kind == "numpy":
        make = np.zeros if zero else np.empty
        return make(shape, dtype=np.float32 if float32 else like.obj.dtype)
    if like.kind == "torch":
        torch = sys.modules["torch"]
        make = torch.zeros if zero else torch.empty
        return make(shape, dtype=torch.float32 if float32 else like.obj.dtype,
                    device=like.obj.device)
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(like.device):
        make = cupy.zeros if zero else cupy.empty
        return make(shape, dtype=np.float32 if float32 else like.obj.dtype)


def current_stream(like):
    """The stream the inputs' library orders its work on for their device (None for host memory)."""
    if like.device < 0:
        return None
    if like.kind == "torch":
        stream = sys.modules["torch"].cuda.current_stream(like.obj.device).cuda_stream
    else:
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(like.device):
            stream = cupy.cuda.get_current_stream().ptr
    return stream if stream else _CUDA_STREAM_LEGACY
