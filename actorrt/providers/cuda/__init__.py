"""The CUDA execution provider: cupy arrays on an NVIDIA GPU, one stream per
provider actor. Needs the ``[cuda]`` extra (cupy)."""

from .provider import CUDA_KERNELS, CUDAExecutionProvider

__all__ = ["CUDA_KERNELS", "CUDAExecutionProvider"]
