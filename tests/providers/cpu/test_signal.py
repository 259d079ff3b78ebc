"""DFT, STFT, window functions and MelWeightMatrix against the ONNX reference
evaluator."""

import numpy as np
import pytest
from onnx import TensorProto

from tests.oracle import check_node

RNG = np.random.default_rng(2)


@pytest.mark.parametrize("inverse,onesided,complex_in", [
    (0, 0, False), (0, 0, True), (0, 1, False), (1, 0, True), (1, 1, True)])
@pytest.mark.parametrize("axis", [1, 2, -2])
@pytest.mark.parametrize("length", [None, 6, 12])
def test_dft_20(inverse, onesided, complex_in, axis, length):
    x = RNG.standard_normal((2, 8, 5, 2 if complex_in else 1)).astype(np.float32)
    ins = {"x": x, "dft_length": None if length is None else np.array(length, np.int64),
           "axis": np.array(axis, np.int64)}
    check_node("DFT", ins, ["y"], opset=20, inverse=inverse, onesided=onesided, atol=1e-4)


@pytest.mark.parametrize("inverse,onesided", [(0, 0), (0, 1), (1, 0)])
def test_dft_17(inverse, onesided):
    x = RNG.standard_normal((3, 10, 1 if onesided else 2)).astype(np.float32)
    check_node("DFT", {"x": x, "dft_length": np.array(9, np.int64)}, ["y"], opset=17, axis=1,
               inverse=inverse, onesided=onesided, atol=1e-4)


def test_dft_float64():
    x = RNG.standard_normal((2, 7, 2))
    check_node("DFT", {"x": x}, ["y"], opset=17, rtol=1e-10, atol=1e-10)


# a onesided STFT needs a real signal
@pytest.mark.parametrize("window,frame_length,onesided,complex_in", [
    (w, f, o, c) for w, f, o in ((True, None, 1), (False, 16, 1), (True, 16, 0), (False, 16, 0))
    for c in (False, True) if not (c and o)])
def test_stft(window, frame_length, onesided, complex_in):
    sig = RNG.standard_normal((2, 70, 2 if complex_in else 1)).astype(np.float32)
    ins = {"signal": sig, "frame_step": np.array(6, np.int64),
           "window": np.hanning(16).astype(np.float32) if window else None,
           "frame_length": None if frame_length is None else np.array(frame_length, np.int64)}
    while list(ins.values())[-1] is None:
        ins.popitem()
    check_node("STFT", ins, ["y"], opset=17, onesided=onesided, atol=1e-4)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_windows(op, periodic, dtype):
    check_node(op, {"size": np.array(11, np.int64)}, ["y"], opset=17, periodic=periodic,
               output_datatype=dtype, atol=1e-6)


@pytest.mark.parametrize("mels,n_fft,rate,lo,hi", [(8, 16, 8192, 0.0, 4096.0),
                                                   (10, 64, 16000, 20.0, 7000.0),
                                                   (20, 32, 8000, 100.0, 4000.0)])
def test_mel_weight_matrix(mels, n_fft, rate, lo, hi):
    ins = {"num_mel_bins": np.array(mels, np.int64), "dft_length": np.array(n_fft, np.int64),
           "sample_rate": np.array(rate, np.int64),
           "lower_edge_hertz": np.array(lo, np.float32),
           "upper_edge_hertz": np.array(hi, np.float32)}
    check_node("MelWeightMatrix", ins, ["y"], opset=17)
