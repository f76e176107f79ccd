"""blochsim's GPU kernels for CUDA 13 (`pip install "blochsim[cu13]"`), NVIDIA driver R580 or newer.

Nothing here is for users: `blochsim._native.cuda_library()` imports this package when torch uses CUDA 13,
checks `__version__` against blochsim's, and loads `LIBRARY` with ctypes. The library links
libcudart.so.13 from torch's nvidia runtime wheel through its rpath.
"""

from pathlib import Path

from ._version import __version__

__all__ = ["CUDA_MAJOR", "LIBRARY", "__version__"]

#: The CUDA major version this package was built for.
CUDA_MAJOR = 13
#: The kernel library (the bs_* C ABI of csrc/capi.h).
LIBRARY = Path(__file__).resolve().parent / "libblochsim_cuda.so"
