"""``actorrt._dtypes.native``: constants carry numpy's own dtype objects, so the
kernels' identity tests (``x.dtype is F32``) take their fast paths on them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt
from actorrt import _dtypes
from actorrt._plan.values import tensor_to_numpy


def test_native_replaces_an_equal_dtype_object_with_numpys_own():
    a = np.frombuffer(np.arange(6, dtype=np.float32).tobytes(),
                      dtype=np.dtype(np.float32).newbyteorder("<"))
    assert a.dtype == np.float32 and a.dtype is not np.dtype(np.float32)
    b = _dtypes.native(a)
    assert b.dtype is np.dtype(np.float32) and np.shares_memory(a, b)
    np.testing.assert_array_equal(a, b)
    for dt in (np.int64, np.int8, np.uint16, np.float64, np.bool_, np.complex64):
        x = np.zeros(3, np.dtype(dt).newbyteorder("<") if np.dtype(dt).itemsize > 1 else dt)
        assert _dtypes.native(x).dtype is np.dtype(dt)


def test_native_keeps_other_arrays():
    big = np.arange(4, dtype=">f4")  # another byte order: not the same values as '<f4' bits
    assert _dtypes.native(big) is big
    bf = np.zeros(3, ml_dtypes.bfloat16)
    assert _dtypes.native(bf) is bf
    s = np.array(["a"], dtype=object)
    assert _dtypes.native(s) is s
    plain = np.zeros(2, np.float32)
    assert _dtypes.native(plain) is plain


def test_loaded_constants_carry_numpys_dtype_objects():
    t = ir.serde.deserialize_tensor(numpy_helper.from_array(np.ones(3, np.float32), "w"))
    assert tensor_to_numpy(t).dtype is np.dtype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["w", "i"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("i", TP.INT64, [1])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with actorrt.InferenceSession(m.SerializeToString()) as sess:
        y = sess.run(None, {"i": np.array([2], np.int64)})[0]
    assert y.dtype is np.dtype(np.float32)  # computed from the constant: numpy's object too
    np.testing.assert_array_equal(y, [[6, 7, 8]])
