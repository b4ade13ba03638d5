"""The tensor policy shared by every launcher in ``cupy_kernels`` (see the package docstring).

Reads CuPy arrays and torch (or other DLPack) CUDA tensors without copying them, picks the launch
stream, allocates outputs, validates metadata that is already on the host, and owns the per-device
error words through which kernels report bad metadata that lives on the device.

Imports only the standard library and NumPy at module level; CuPy (and torch, when the caller
uses it) are imported lazily.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import sys
import threading
from typing import Any

import numpy as np

from cupy_kernels.layout import BF16, ERR_WORDS, F16, F32, F64, I32, I64

# dtype codes shared with the kernels (recurrent.cu enum gdn::DType): layout.DTYPES
FLOAT_CODES = (F32, F16, BF16, F64)
INDEX_CODES = (I32, I64)
CODE_NAME = {
    F32: "float32",
    F16: "float16",
    BF16: "bfloat16",
    F64: "float64",
    I32: "int32",
    I64: "int64",
    -1: "unsupported",
}
ITEM = {F32: 4, F16: 2, BF16: 2, F64: 8, I32: 4, I64: 8}
# numpy/CuPy dtype.char -> code ('l' and 'q' are both int64 on LP64)
_CHAR_CODE = {"f": F32, "e": F16, "d": F64, "i": I32, "l": I64, "q": I64}
_TORCH_CODE: dict | None = None
_CUPY = None

# Error words, one per metadata argument (the indices are recurrent.cu's ERR_* constants: layout.ERRORS).
ERROR_WORDS = ERR_WORDS
ERROR_ARGUMENTS = ("cu_seqlens", "slot_indices", "ssm_state_indices", "num_accepted_tokens")
ERROR_MEANING = (
    "offsets must satisfy 0 = c[0] <= c[1] <= ... <= c[N] = T (spec decoding: at most S tokens per request)",
    "slot index past the end of the state pool",
    "slot index past the end of the state pool",
    "accepted-token count outside [1, S]",
)


def cupy():
    """The CuPy module, imported on first use."""
    global _CUPY
    if _CUPY is None:
        import cupy as module

        _CUPY = module
    return _CUPY


def is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def current_device() -> int:
    return (_CUPY or cupy()).cuda.runtime.getDevice()


@functools.cache
def num_sms(device: int) -> int:
    """Streaming multiprocessors of ``device`` (grid sizing)."""
    return cupy().cuda.Device(device).attributes["MultiProcessorCount"]


@functools.cache
def compute_capability(device: int) -> tuple[int, int]:
    """``(major, minor)`` of ``device`` (kernel variants for one architecture)."""
    cc = cupy().cuda.Device(device).compute_capability  # '90' for 9.0
    return int(cc[:-1]), int(cc[-1])


# --------------------------------------------------------------------------- reading tensors


def read(x: Any, name: str, device: int) -> tuple[int, tuple, tuple, int, int]:
    """``(pointer, shape, raw strides, dtype code, stride unit)`` of a CUDA tensor on ``device``, no copy.

    Raw strides are in bytes (CuPy: unit = itemsize) or elements (torch: unit = 1); :func:`elements`
    normalizes them once per signature, so this per-call path is attribute reads only. Torch
    tensors are read through ``data_ptr()``/``stride()`` (cheaper than DLPack, and CuPy has no
    bfloat16); other ``__dlpack__`` exporters go through ``cupy.from_dlpack`` (zero copy).
    """
    global _TORCH_CODE
    cp = _CUPY or cupy()
    if type(x) is cp.ndarray or isinstance(x, cp.ndarray):
        mem = x.data
        if mem.device_id != device:
            raise ValueError(f"{name}: array lives on device {mem.device_id}, the current device is {device}")
        return mem.ptr, x.shape, x.strides, _CHAR_CODE.get(x.dtype.char, -1), x.itemsize
    if is_torch(x):
        if not x.is_cuda or x.get_device() != device:
            raise ValueError(f"{name}: expected a tensor on the current CUDA device ({device}), got {x.device}")
        if _TORCH_CODE is None:
            torch = sys.modules["torch"]
            _TORCH_CODE = {
                torch.float32: F32,
                torch.float16: F16,
                torch.bfloat16: BF16,
                torch.float64: F64,
                torch.int32: I32,
                torch.int64: I64,
            }
        return x.data_ptr(), tuple(x.shape), x.stride(), _TORCH_CODE.get(x.dtype, -1), 1
    if hasattr(x, "__dlpack__"):
        try:
            arr = cp.from_dlpack(x)
        except Exception as exc:  # noqa: BLE001 - any import failure is the caller's input error
            raise ValueError(f"{name}: cannot be imported through DLPack ({exc})") from None
        return read(arr, name, device)
    raise ValueError(f"{name}: expected a CuPy array or a DLPack (e.g. torch) CUDA tensor, got {type(x).__name__}")


def elements(info: tuple | None) -> tuple | None:
    """``(pointer, shape, strides in elements, dtype code)``; size-1 dims get stride 0 (never
    multiplied by a nonzero index, and torch may give them any value), so alignment checks hold."""
    if info is None:
        return None
    ptr, shape, strides, code, unit = info
    return ptr, shape, tuple([s // unit if d != 1 else 0 for s, d in zip(strides, shape)]), code


def check(name: str, info: tuple, shape: tuple, layout: str, codes: tuple, what: str) -> int:
    """Shape and dtype check of an :func:`elements` tuple (last dim contiguous); returns the dtype code."""
    if info[1] != shape:
        raise ValueError(f"{name}: expected shape {layout} = {shape}, got {info[1]}")
    if info[3] not in codes:
        raise ValueError(f"{name}: expected {what}, got dtype {CODE_NAME.get(info[3], info[3])}")
    if shape and shape[-1] > 1 and 0 not in shape and info[2][-1] != 1:  # empty tensors have any strides
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides {info[2]}")
    return info[3]


def check_contiguous(name: str, info: tuple) -> None:
    """Row-major contiguity of an :func:`elements` tuple (size-1 dims ignored); raises naming ``name``."""
    if 0 in info[1]:
        return
    expect, acc = [], 1
    for d in reversed(info[1]):
        expect.append(acc if d != 1 else 0)
        acc *= d
    if tuple(reversed(expect)) != info[2]:
        raise ValueError(
            f"{name}: must be contiguous, got strides {info[2]} (elements) for shape {info[1]}; "
            "the launcher never copies silently: pass .contiguous() / cupy.ascontiguousarray()"
        )


def rank(name: str, info: tuple, n: int, layout: str) -> tuple:
    if len(info[1]) != n:
        raise ValueError(f"{name}: expected rank {n} {layout}, got shape {info[1]}")
    return info[1]


def vec_ok(info: tuple, vw: int, item: int) -> bool:
    """Rows of ``info`` can be read as ``vw``-element vectors: aligned pointer and strides."""
    return info[0] % (vw * item) == 0 and all(s % vw == 0 for s in info[2][:-1]) and info[1][-1] % vw == 0


# --------------------------------------------------------------------------- streams and outputs


def torch_stream(device: int) -> int:
    """The raw ``cudaStream_t`` of torch's current stream on ``device``."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # ~0.3 us, vs ~3 us for the public call
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


def launch_stream(torch_inputs: bool, device: int) -> int:
    """The stream a launch goes to: torch's current stream for torch tensors, else CuPy's."""
    if torch_inputs:
        return torch_stream(device)
    return (_CUPY or cupy()).cuda.get_current_stream().ptr


def stream_handle(stream: Any) -> int:
    """A raw stream handle from a CuPy stream, a torch stream or an integer."""
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "ptr", None)
    if handle is None:
        handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise ValueError(f"stream: expected a CuPy stream, a torch stream or an int, got {type(stream).__name__}")
    return int(handle)


class _RawStream:
    """A raw ``cudaStream_t`` presented through the CUDA stream protocol (``__cuda_stream__``)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def external_stream(handle: int):
    """A CuPy stream object for a stream CuPy did not create (torch's), for ``with`` and graph launches.

    CuPy 14 deprecates ``ExternalStream`` (a ``DeprecationWarning`` on every call, which a verifier
    counts against the kernel) in favour of ``Stream.from_external``; older CuPy has only the first.
    """
    cp = _CUPY or cupy()
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is None:
        return cp.cuda.ExternalStream(handle)
    return from_external(_RawStream(handle))


def empty(like_torch: Any, shape: tuple, code: int):
    """Uninitialized output: torch on ``like_torch``'s device when given, else CuPy on the current device."""
    if like_torch is not None:
        torch = sys.modules["torch"]
        dtype = (torch.float32, torch.float16, torch.bfloat16, torch.float64)[code]
        return torch.empty(shape, dtype=dtype, device=like_torch.device)
    cp = _CUPY or cupy()
    if code == BF16:
        raise ValueError("q: bfloat16 inputs need torch tensors (CuPy has no bfloat16 dtype)")
    return cp.empty(shape, (cp.float32, cp.float16, None, cp.float64)[code])


def pointer(x: Any) -> int:
    return x.data_ptr() if hasattr(x, "data_ptr") else x.data.ptr


class Signature:
    """A kernel's parameter list for ``cuLaunchKernel``: one struct code per parameter (``P`` pointer,
    ``i`` int32, ``f`` float32), packed with C alignment into a per-thread buffer whose per-parameter
    addresses form ``kernelParams``. The driver copies the values at launch, so the buffer is reused;
    a launch costs one ``pack_into`` and one driver call (CuPy's ``RawKernel.__call__`` converts every
    argument on every call)."""

    def __init__(self, codes: str) -> None:
        self.struct = struct.Struct("@" + codes)
        # offset of parameter i: the aligned size of the first i + 1 codes, less the size of the last
        self.offsets = [struct.calcsize("@" + codes[: i + 1]) - struct.calcsize(c) for i, c in enumerate(codes)]
        self._local = threading.local()

    def launch(self, fn: int, grid: tuple[int, int], threads: int, smem: int, stream: int, *args: Any) -> None:
        """Launch CUfunction ``fn`` on ``grid`` x ``threads`` with ``smem`` bytes of dynamic shared memory."""
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            buf = np.zeros(max(1, -(-self.struct.size // 8)), np.uint64)
            argv = np.array([buf.ctypes.data + o for o in self.offsets], np.uint64)
            bufs = self._local.bufs = (buf, argv, argv.ctypes.data)
        self.struct.pack_into(bufs[0], 0, *args)
        (_CUPY or cupy()).cuda.driver.launchKernel(fn, grid[0], grid[1], 1, threads, 1, 1, smem, stream, bufs[2], 0)


# --------------------------------------------------------------------------- metadata on the host


def host_ints(x: Any) -> np.ndarray | None:
    """Integer metadata that is already on the host (a list, a NumPy array, a CPU torch tensor) as
    NumPy; ``None`` for device-resident metadata (reading it would synchronize)."""
    if x is None:
        return None
    if is_torch(x):
        return None if x.is_cuda else x.detach().numpy()
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    return None  # CuPy or another device array


def _int_array(name: str, arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected an integer array, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def check_cu_seqlens_host(cu: np.ndarray, batch: int, tokens: int, max_length: int | None = None) -> np.ndarray:
    """Validated ``[N + 1]`` int64 offsets: ``0 = c[0] <= ... <= c[N] = T``; ``max_length`` caps each length."""
    cu = np.asarray(cu)
    if cu.ndim != 1 or cu.size < 2:
        raise ValueError(f"cu_seqlens: expected shape [N + 1] with N >= 1, got {cu.shape}")
    cu = _int_array("cu_seqlens", cu)
    if batch != 1:
        raise ValueError(f"cu_seqlens: requires batch size B == 1, got B = {batch}")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens: must start at 0, starts at {cu[0]}")
    if np.any(cu < 0):
        raise ValueError(f"cu_seqlens: negative entry {int(cu.min())}")
    if np.any(np.diff(cu) < 0):
        raise ValueError("cu_seqlens: must be non-decreasing")
    if cu[-1] != tokens:
        raise ValueError(f"cu_seqlens: must end at T = {tokens}, ends at {cu[-1]}")
    if max_length is not None and np.any(np.diff(cu) > max_length):
        raise ValueError(f"cu_seqlens: a request has more than S = {max_length} tokens")
    return cu


def check_slots_host(name: str, slots: np.ndarray, num_slots: int) -> np.ndarray:
    """Slot indices: negative is padding, ``>= num_slots`` is an error."""
    slots = _int_array(name, np.asarray(slots))
    if slots.size and slots.max() >= num_slots:
        raise ValueError(f"{name}: slot {int(slots.max())} is past the end of the pool ({num_slots} slots)")
    return slots


def check_accepted_host(accepted: np.ndarray, columns: int) -> np.ndarray:
    accepted = _int_array("num_accepted_tokens", np.asarray(accepted))
    if accepted.size and (accepted.min() < 1 or accepted.max() > columns):
        raise ValueError(
            f"num_accepted_tokens: entries must be in [1, S = {columns}], got "
            f"[{int(accepted.min())}, {int(accepted.max())}]"
        )
    return accepted


def upload(x: np.ndarray, stream: int):
    """Host metadata to the current device as int64 CuPy, copied on the launch ``stream`` so the
    kernel that reads it is ordered after the copy (a small copy from pageable memory: it blocks
    the host until the data is staged, which is why device metadata is the hot path)."""
    cp = _CUPY or cupy()
    with external_stream(stream):
        return cp.asarray(np.ascontiguousarray(x, np.int64))


# --------------------------------------------------------------------------- error words


class _ErrorWords:
    """``ERROR_WORDS`` int32 in mapped, pinned host memory for one device.

    The kernels store 1 into a word when they see bad metadata; the host reads the words with no
    synchronization (a plain memory read), so every launcher can report an earlier launch's error.
    """

    def __init__(self, device: int) -> None:
        cp = _CUPY or cupy()
        with cp.cuda.Device(device):
            # cudaHostAllocPortable | cudaHostAllocMapped; with unified addressing the host
            # pointer is also the device pointer
            self.memory = cp.cuda.PinnedMemory(4 * ERROR_WORDS, 3)
        self.ptr = int(self.memory.ptr)
        self.words = (ctypes.c_int32 * ERROR_WORDS).from_address(self.ptr)
        self.pair = (ctypes.c_int64 * (ERROR_WORDS // 2)).from_address(self.ptr)
        for i in range(ERROR_WORDS):
            self.words[i] = 0
        self.source = "an earlier launch"  # the entry point of the latest launch with device metadata

    def pending(self) -> int:
        """Nonzero when a kernel has reported an error (two 8-byte reads: cheap on every call)."""
        w = self.pair
        return w[0] | w[1]

    def raise_pending(self, deferred: bool) -> None:
        for i in range(ERROR_WORDS):
            if self.words[i]:
                for j in range(ERROR_WORDS):
                    self.words[j] = 0
                when = f"detected by the kernel of {self.source} (deferred error)" if deferred else "rejected"
                raise ValueError(f"{ERROR_ARGUMENTS[i]}: {ERROR_MEANING[i]}; {when}")


_ERRORS: dict[int, _ErrorWords] = {}
_ERRORS_LOCK = threading.Lock()


def error_words(device: int) -> _ErrorWords:
    words = _ERRORS.get(device)
    if words is None:
        with _ERRORS_LOCK:
            words = _ERRORS.get(device)
            if words is None:
                words = _ERRORS[device] = _ErrorWords(device)
    return words


def check_errors(synchronize: bool = True, device: int | None = None) -> None:
    """Raise the ``ValueError`` of bad device metadata seen by a finished kernel, and clear it.

    ``synchronize=True`` first waits for the device (so every launched kernel has reported);
    ``False`` only reads what finished kernels have reported so far (no synchronization).
    """
    cp = _CUPY or cupy()
    device = current_device() if device is None else device
    if synchronize:
        with cp.cuda.Device(device):
            cp.cuda.runtime.deviceSynchronize()
    words = _ERRORS.get(device)
    if words is not None:
        words.raise_pending(deferred=True)


def checked_default() -> bool:
    """The default of the launchers' ``checked`` keyword: the environment variable ``GDN_CUPY_CHECKED=1``."""
    return os.environ.get("GDN_CUPY_CHECKED", "") not in ("", "0")


def finish_checked(words: _ErrorWords, stream: int) -> None:
    """Checked mode: wait for the launch stream, then raise any error its kernel reported."""
    (_CUPY or cupy()).cuda.runtime.streamSynchronize(stream)
    words.raise_pending(deferred=False)
