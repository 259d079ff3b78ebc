"""Loading: paths, bytes, protos; external data memory-mapped and checked."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt


def _model_with_weight(w):
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add")], "ext",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [len(w)])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [len(w)])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _save_external(tmp_path, w, location="weights.bin"):
    m = _model_with_weight(w)
    path = tmp_path / "model.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    return path


def test_path_bytes_and_proto_all_load(tmp_path):
    w = np.arange(4, dtype=np.float32)
    m = _model_with_weight(w)
    p = tmp_path / "m.onnx"
    onnx.save(m, str(p))
    x = np.ones(4, np.float32)
    for src in (str(p), p, p.read_bytes(), m):
        with actorrt.InferenceSession(src) as s:
            np.testing.assert_array_equal(s.run(None, {"x": x})[0], x + w)


def test_external_data_is_read(tmp_path):
    w = np.arange(1000, dtype=np.float32)
    path = _save_external(tmp_path, w)
    assert (tmp_path / "weights.bin").stat().st_size == 4000
    with actorrt.InferenceSession(path) as s:
        np.testing.assert_array_equal(s.run(None, {"x": np.zeros(1000, np.float32)})[0], w)


def test_missing_external_data_file(tmp_path):
    path = _save_external(tmp_path, np.ones(8, np.float32))
    os.remove(tmp_path / "weights.bin")
    with pytest.raises(actorrt.ModelLoadError, match=r"initializer 'w': external data file .*weights.bin' is missing"):
        actorrt.InferenceSession(path)


def test_truncated_external_data_file(tmp_path):
    path = _save_external(tmp_path, np.ones(8, np.float32))
    with open(tmp_path / "weights.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(actorrt.ModelLoadError, match="holds 10 bytes"):
        actorrt.InferenceSession(path)


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd", "sub/../../x.bin"])
def test_external_data_escaping_the_folder_is_refused(tmp_path, location):
    sub = tmp_path / "model_dir"
    sub.mkdir()
    m = _model_with_weight(np.ones(2, np.float32))
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TP.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", location
    (tmp_path / "outside.bin").write_bytes(b"\0" * 8)
    path = sub / "model.onnx"
    onnx.save(m, str(path))
    with pytest.raises(actorrt.ModelLoadError, match="initializer 'w'") as ei:
        actorrt.InferenceSession(path)
    assert "escapes" in str(ei.value) or "relative path" in str(ei.value)


def test_malformed_protobuf_bytes():
    with pytest.raises(actorrt.ModelLoadError, match="cannot parse"):
        actorrt.InferenceSession(b"\x08\x07\x12\xff\xff\xff garbage")


def test_missing_file(tmp_path):
    with pytest.raises(actorrt.ModelLoadError, match="does not exist"):
        actorrt.InferenceSession(tmp_path / "nope.onnx")


def test_external_data_from_bytes_is_refused(tmp_path):
    path = _save_external(tmp_path, np.ones(8, np.float32))
    with pytest.raises(actorrt.ModelLoadError, match="not given as a path"):
        actorrt.InferenceSession(path.read_bytes())


def test_model_local_functions_are_inlined():
    fn = helper.make_function("local", "Twice", ["a"], ["b"],
                              [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="local")], "f",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2])])
    m = helper.make_model(g, functions=[fn], opset_imports=[helper.make_opsetid("", 17),
                                                            helper.make_opsetid("local", 1)])
    with actorrt.InferenceSession(m) as s:
        np.testing.assert_array_equal(s.run(None, {"x": np.float32([1, 2])})[0], [2, 4])
