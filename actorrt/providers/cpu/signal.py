"""Signal processing: discrete Fourier transforms, short-time Fourier transform,
window functions and the mel filter bank.

Spec: ONNX DFT (opsets 17, 20), STFT (17), HannWindow / HammingWindow /
BlackmanWindow (17), MelWeightMatrix (17).

Complex tensors use the ONNX layout: a trailing axis of size 2 holds the real
and imaginary parts; a trailing axis of size 1 is a real signal.
"""

from __future__ import annotations

import numpy as np

from ..._dtypes import to_numpy_dtype
from .registry import cpu_kernel

__all__ = ["DFT", "STFT", "HannWindow", "HammingWindow", "BlackmanWindow",
           "MelWeightMatrix"]


def _scalar(x, name: str) -> int:
    a = np.asarray(x)
    if a.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {a.shape}")
    return int(a.reshape(()))


def _to_complex(x: np.ndarray) -> np.ndarray:
    """(..., 1) real or (..., 2) real/imag -> complex (...)."""
    if x.shape[-1] == 1:
        return x[..., 0]
    if x.shape[-1] == 2:
        return x[..., 0] + 1j * x[..., 1]
    raise ValueError(f"the last axis must be 1 (real) or 2 (complex), got {x.shape[-1]}")


def _from_complex(c: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = np.empty(c.shape + (2,), dtype=dtype)
    out[..., 0] = c.real
    out[..., 1] = c.imag
    return out


def _work(x: np.ndarray) -> np.ndarray:
    """numpy's FFT has no 16-bit floats: run those in float32."""
    return x.astype(np.float32) if x.dtype.itemsize < 4 else x


def _dft(x: np.ndarray, length: int | None, axis: int, inverse: int, onesided: int):
    if x.ndim < 2:
        raise ValueError(f"DFT input needs rank >= 2, got shape {x.shape}")
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < x.ndim - 1:
        raise ValueError(f"DFT axis {axis} is out of range for rank {x.ndim} "
                         f"(the last axis holds real/imaginary parts)")
    n_in = x.shape[ax]
    if length is None:
        length = 2 * (n_in - 1) if inverse and onesided else n_in
    if length <= 0:
        raise ValueError(f"dft_length must be positive, got {length}")
    sig = _to_complex(_work(x))
    if inverse and onesided:  # IRFFT: one-sided complex spectrum -> real signal
        return np.fft.irfft(sig, n=length, axis=ax)[..., None].astype(x.dtype)
    if inverse:
        res = np.fft.ifft(sig, n=length, axis=ax)
    elif onesided and x.shape[-1] == 1:
        res = np.fft.rfft(sig, n=length, axis=ax)
    else:
        res = np.fft.fft(sig, n=length, axis=ax)
        if onesided:
            res = np.take(res, np.arange(length // 2 + 1), axis=ax)
    return _from_complex(res, x.dtype)


@cpu_kernel("DFT", since=17)
def DFT_17(input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    """ONNX DFT-17: ``axis`` attribute (default 1), optional ``dft_length`` input."""
    n = None if dft_length is None else _scalar(dft_length, "dft_length")
    return _dft(input, n, int(axis), inverse, onesided)


@cpu_kernel("DFT", since=20)
def DFT(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """ONNX DFT-20: ``dft_length`` and ``axis`` (default -2) are scalar inputs."""
    n = None if dft_length is None else _scalar(dft_length, "dft_length")
    ax = -2 if axis is None else _scalar(axis, "axis")
    return _dft(input, n, ax, inverse, onesided)


@cpu_kernel("STFT", since=17)
def STFT(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """ONNX STFT-17. signal (batch, length, 1|2) -> (batch, frames, bins, 2) with
    frames = 1 + (length - frame_length) // frame_step and bins = frame_length // 2
    + 1 when onesided, else frame_length."""
    if signal.ndim != 3:
        raise ValueError(f"STFT signal must be (batch, length, 1|2), got {signal.shape}")
    step = _scalar(frame_step, "frame_step")
    if frame_length is not None:
        n = _scalar(frame_length, "frame_length")
    elif window is not None:
        n = window.shape[0]
    else:
        n = signal.shape[1]
    if window is not None and window.shape[0] != n:
        raise ValueError(f"window length {window.shape[0]} differs from frame_length {n}")
    if step <= 0 or n <= 0 or n > signal.shape[1]:
        raise ValueError(f"bad STFT geometry: frame_step {step}, frame_length {n}, "
                         f"signal length {signal.shape[1]}")
    frames = 1 + (signal.shape[1] - n) // step
    idx = np.arange(frames)[:, None] * step + np.arange(n)  # (frames, n)
    x = _to_complex(_work(signal))[:, idx]  # (batch, frames, n)
    if window is not None:
        x = x * _work(window)
    if onesided and signal.shape[-1] == 1:
        res = np.fft.rfft(x.real, n=n, axis=-1)
    else:
        res = np.fft.fft(x, n=n, axis=-1)
        if onesided:
            res = res[..., : n // 2 + 1]
    return _from_complex(res, signal.dtype)


# -------------------------------------------------------------------- windows

def _window(size, output_datatype: int, periodic: int, coeffs: tuple[float, ...]):
    """sum_k (-1)^k a_k cos(2 pi k n / N), N = size (periodic) or size - 1."""
    n = _scalar(size, "size")
    if n < 0:
        raise ValueError(f"window size must be >= 0, got {n}")
    denom = n if periodic else n - 1
    ni = np.arange(n, dtype=np.float64)
    w = np.full(n, coeffs[0], dtype=np.float64)
    if denom > 0:
        for k, a in enumerate(coeffs[1:], start=1):
            w += (-1) ** k * a * np.cos(2 * np.pi * k * ni / denom)
    return w.astype(to_numpy_dtype(output_datatype))


@cpu_kernel("HannWindow", since=17)
def HannWindow(size, *, output_datatype=1, periodic=1):
    """ONNX HannWindow-17: 0.5 - 0.5 cos(2 pi n / N)."""
    return _window(size, output_datatype, periodic, (0.5, 0.5))


@cpu_kernel("HammingWindow", since=17)
def HammingWindow(size, *, output_datatype=1, periodic=1):
    """ONNX HammingWindow-17: 25/46 - 21/46 cos(2 pi n / N)."""
    return _window(size, output_datatype, periodic, (25 / 46, 21 / 46))


@cpu_kernel("BlackmanWindow", since=17)
def BlackmanWindow(size, *, output_datatype=1, periodic=1):
    """ONNX BlackmanWindow-17: 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""
    return _window(size, output_datatype, periodic, (0.42, 0.5, 0.08))


@cpu_kernel("MelWeightMatrix", since=17)
def MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                    upper_edge_hertz, *, output_datatype=1):
    """ONNX MelWeightMatrix-17: triangular mel filters, shape
    (dft_length // 2 + 1, num_mel_bins)."""
    mels = _scalar(num_mel_bins, "num_mel_bins")
    n_fft = _scalar(dft_length, "dft_length")
    rate = _scalar(sample_rate, "sample_rate")
    lo = np.asarray(lower_edge_hertz).reshape(())
    hi = np.asarray(upper_edge_hertz).reshape(())
    if mels <= 0 or n_fft <= 0 or rate <= 0:
        raise ValueError("num_mel_bins, dft_length and sample_rate must be positive")
    bins = n_fft // 2 + 1
    # mel scale: 2595 log10(1 + f / 700); num_mel_bins + 2 equally spaced points
    lo_mel = 2595 * np.log1p(lo / 700) / np.log(10)
    hi_mel = 2595 * np.log1p(hi / 700) / np.log(10)
    step = (hi_mel - lo_mel) / (mels + 2)
    pts = np.arange(mels + 2) * step + lo_mel
    hz = 700 * np.expm1(pts / 2595 * np.log(10))
    edges = (((n_fft + 1) * hz) // rate).astype(np.int64)  # FFT bin of each point
    left, center, right = edges[:-2], edges[1:-1], edges[2:]  # (mels,)
    j = np.arange(bins)[:, None].astype(np.float64)  # (bins, 1)
    up_w = np.maximum(center - left, 1)
    down_w = np.maximum(right - center, 1)
    rising = (j >= left) & (j <= center)
    falling = (j >= center) & (j < right) & (right > center)
    out = np.where(rising, (j - left) / up_w, 0.0)
    out = np.where((center == left) & (j == center), 1.0, out)
    out = np.where(falling, (right - j) / down_w, out)
    return out.astype(to_numpy_dtype(output_datatype))
