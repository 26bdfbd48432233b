"""Loading the compiled kernels, and saying plainly why they are missing when they are."""

from __future__ import annotations

import functools

import torch

import importlib
import importlib.util

if importlib.util.find_spec("gproj_cuda._C") is None:  # pure-Python install
    _C = None
    _IMPORT_ERROR = "no compiled module in the package: installed without nvcc or GPROJ_SKIP_CUDA=1"
else:
    try:
        _C = importlib.import_module("gproj_cuda._C")
        _IMPORT_ERROR = None
    except ImportError as e:  # a broken build, or a CUDA runtime mismatch
        _C = None
        _IMPORT_ERROR = f"import failed: {e}"


def extension():
    """The compiled module, or a RuntimeError naming why it is unavailable."""
    if _C is None:
        raise RuntimeError(f"gproj_cuda's CUDA kernels are not available: {unavailable_reason()}")
    return _C


@functools.lru_cache(maxsize=None)
def _device_reason(index: int) -> str | None:
    major, minor = torch.cuda.get_device_capability(index)
    if major < 8:
        return (f"GPU {index} ({torch.cuda.get_device_name(index)}) has compute capability "
                f"{major}.{minor}; the kernels need 8.0 or newer (A100, H100/H200)")
    return None


def unavailable_reason(device: int | None = None) -> str | None:
    """None if the kernels can run (on ``device``, default: the current GPU), else why not."""
    if _C is None:
        return (f"the CUDA extension gproj_cuda._C is not available ({_IMPORT_ERROR}). "
                "Install on a machine with nvcc (CUDA 12.x/13.x) to build it; see README.md")
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA GPU (torch.cuda.is_available() is False)"
    return _device_reason(torch.cuda.current_device() if device is None else device)


def is_available(device: int | None = None) -> bool:
    """True if the CUDA kernels are built and the GPU can run them. See ``unavailable_reason``."""
    return unavailable_reason(device) is None


def compiled_configs() -> list[tuple[str, int]]:
    """(dtype, head_dim) pairs compiled into this build (empty without the extension)."""
    if _C is None:
        return []
    out = []
    for item in _C.compiled_configs().split(","):
        if item:
            dt, hd = item.split(":")
            out.append((dt, int(hd)))
    return out
