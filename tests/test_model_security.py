"""No tensor of a model reads a file outside the model's folder.

Every place a tensor can sit (initializers, sparse initializers, Constant
values, TENSOR / TENSORS / SPARSE_TENSOR attributes, subgraphs, model-local
functions and their subgraphs) is tried with locations that escape: an
absolute path, ``../``, a symlinked file, a symlinked folder. Each must be
refused with ModelLoadError naming the tensor, for a path, bytes and a
ModelProto, and the secret's bytes must never show up anywhere.
"""

import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt

SECRET = b"TOPSECRET-do-not-leak-0123456789" * 4  # 128 bytes, any float view of it is odd


def _ext(location, dims=(4,), name="leak", offset=None, length=None):
    t = onnx.TensorProto()
    t.name = name
    t.data_type = TP.FLOAT
    t.dims.extend(dims)
    t.data_location = TP.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            e = t.external_data.add()
            e.key, e.value = k, str(v)
    return t


def _fn_model(fn_nodes, out="b"):
    """y = Leak(x) with ``Leak`` a model-local function of ``fn_nodes`` whose
    output ``out`` is a float[4]."""
    fn = helper.make_function("local", "Leak", ["a"], [out], fn_nodes,
                              [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("Leak", ["x"], ["y"], domain="local", name="call")],
                          "g", [helper.make_tensor_value_info("x", TP.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [4])])
    return helper.make_model(g, functions=[fn], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])


def _const_fn_model(tensor):
    return _fn_model([helper.make_node("Constant", [], ["c"], value=tensor, name="k"),
                      helper.make_node("Add", ["a", "c"], ["b"])])


@pytest.fixture
def layout(tmp_path):
    """``tmp/model/`` (the model's folder, with ``link.bin`` -> ../secret.bin and
    ``sub`` -> ../outside/) and the secret at ``tmp/secret.bin`` and
    ``tmp/outside/secret.bin``."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "secret.bin").write_bytes(SECRET)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.bin").write_bytes(SECRET)
    os.symlink(tmp_path / "secret.bin", model_dir / "link.bin")
    os.symlink(tmp_path / "outside", model_dir / "sub")
    os.symlink("/etc/passwd", model_dir / "passwd")
    return model_dir


ESCAPES = ["/etc/passwd", "../secret.bin", "sub/../../secret.bin", "link.bin", "sub/secret.bin",
           "passwd", str("..") + os.sep + "outside" + os.sep + "secret.bin"]


def _refused(src, match):
    with pytest.raises(actorrt.ModelLoadError, match=match) as ei:
        with actorrt.InferenceSession(src) as s:  # pragma: no cover - must not load
            s.run(None, {"x": np.zeros(4, np.float32)})
    text = str(ei.value) + repr(ei.value.args)
    assert "TOPSECRET" not in text and "root:" not in text
    return ei.value


def _assert_no_secret_read(capfd):
    out, err = capfd.readouterr()
    assert "TOPSECRET" not in out + err and "root:x" not in out + err


@pytest.mark.parametrize("location", ESCAPES)
def test_function_constant_escape_from_a_path(layout, location, capfd):
    path = layout / "m.onnx"
    onnx.save(_const_fn_model(_ext(location)), str(path))
    e = _refused(path, r"tensor 'leak' in attribute 'value' of node 'k' in function 'local:Leak'")
    assert "escapes" in str(e) or "relative path" in str(e)
    _assert_no_secret_read(capfd)


@pytest.mark.parametrize("location", ["/etc/passwd", "../secret.bin", "weights.bin"])
@pytest.mark.parametrize("as_", ["bytes", "proto"])
def test_function_constant_without_a_folder_refuses_any_file(layout, location, as_, capfd):
    (layout / "weights.bin").write_bytes(b"\0" * 16)
    m = _const_fn_model(_ext(location))
    src = m.SerializeToString() if as_ == "bytes" else m
    _refused(src, r"tensor 'leak' in attribute 'value' of node 'k' in function 'local:Leak'"
                  r".*not given as a path")
    _assert_no_secret_read(capfd)


def test_escape_is_refused_whatever_the_working_directory(layout, monkeypatch):
    # a relative location must not be resolved against the process's cwd
    monkeypatch.chdir(layout.parent / "outside")
    path = layout / "m.onnx"
    onnx.save(_const_fn_model(_ext("secret.bin")), str(path))
    _refused(path, "'leak'.*is missing")


def test_function_constant_with_in_folder_data_works(tmp_path, monkeypatch):
    w = np.float32([1.5, -2, 3, 4])
    (tmp_path / "w.bin").write_bytes(b"\0" * 8 + w.tobytes())
    path = tmp_path / "m.onnx"
    onnx.save(_const_fn_model(_ext("w.bin", offset=8, length=16)), str(path))
    monkeypatch.chdir("/")  # relative to the model's folder, not the cwd
    with actorrt.InferenceSession(path) as s:
        np.testing.assert_array_equal(s.run(None, {"x": np.ones(4, np.float32)})[0], w + 1)


def test_tensors_attribute_in_a_function(layout):
    node = helper.make_node("Identity", ["a"], ["b"], name="idn")
    a = node.attribute.add()
    a.name, a.type = "payload", onnx.AttributeProto.TENSORS
    a.tensors.append(numpy_helper.from_array(np.zeros(1, np.float32), "fine"))
    a.tensors.append(_ext("../secret.bin"))
    path = layout / "m.onnx"
    onnx.save(_fn_model([node]), str(path))
    _refused(path, r"tensor 'leak' \(item 1\) in attribute 'payload' of node 'idn' in function")


def test_mislabelled_attribute_still_checked(layout):
    # declared FLOAT, but a tensor field is filled: the check reads every field
    node = helper.make_node("Identity", ["a"], ["b"], name="idn")
    a = node.attribute.add()
    a.name, a.type, a.f = "alpha", onnx.AttributeProto.FLOAT, 1.0
    a.t.CopyFrom(_ext("/etc/passwd"))
    path = layout / "m.onnx"
    onnx.save(_fn_model([node]), str(path))
    _refused(path, r"tensor 'leak' in attribute 'alpha' of node 'idn'")


def _sparse(values):
    s = onnx.SparseTensorProto()
    s.values.CopyFrom(values)
    s.indices.CopyFrom(numpy_helper.from_array(np.int64([0, 1, 2, 3]), "idx"))
    s.dims.extend([4])
    return s


def test_sparse_tensor_attribute_values_and_indices(layout):
    node = helper.make_node("Constant", [], ["c"], name="sp")
    a = node.attribute.add()
    a.name, a.type = "sparse_value", onnx.AttributeProto.SPARSE_TENSOR
    a.sparse_tensor.CopyFrom(_sparse(_ext("../secret.bin")))
    path = layout / "m.onnx"
    onnx.save(_fn_model([node, helper.make_node("Add", ["a", "c"], ["b"])]), str(path))
    _refused(path, r"sparse tensor 'leak' \(values\) of attribute 'sparse_value' of node 'sp'")
    # indices escaping
    s = _sparse(numpy_helper.from_array(np.ones(4, np.float32), "vals"))
    s.indices.CopyFrom(_ext("/etc/passwd", name="idx"))
    s.indices.data_type = TP.INT64
    a.sparse_tensor.CopyFrom(s)
    onnx.save(_fn_model([node, helper.make_node("Add", ["a", "c"], ["b"])]), str(path))
    _refused(path, r"sparse tensor 'vals' \(indices\) of attribute 'sparse_value' of node 'sp'")


def test_sparse_tensors_attribute(layout):
    node = helper.make_node("Identity", ["a"], ["b"], name="idn")
    a = node.attribute.add()
    a.name, a.type = "many", onnx.AttributeProto.SPARSE_TENSORS
    a.sparse_tensors.add().CopyFrom(_sparse(_ext("link.bin")))
    path = layout / "m.onnx"
    onnx.save(_fn_model([node]), str(path))
    _refused(path, r"sparse tensor \(item 0\) 'leak' \(values\) of attribute 'many' of node 'idn'.*escapes")


def test_sparse_initializer(layout):
    m = _fn_model([helper.make_node("Identity", ["a"], ["b"])])
    m.graph.sparse_initializer.add().CopyFrom(_sparse(_ext("/etc/passwd")))
    path = layout / "m.onnx"
    onnx.save(m, str(path))
    _refused(path, r"sparse initializer 'leak' \(values\)")


def _then(branch_value):
    return helper.make_graph([helper.make_node("Constant", [], ["t"], value=branch_value,
                                               name="inner")], "then_g", [],
                             [helper.make_tensor_value_info("t", TP.FLOAT, [4])])


def _if_node(then, name="iff"):
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], name="ec",
                                                value=numpy_helper.from_array(
                                                    np.zeros(4, np.float32), "z"))],
                              "else_g", [], [helper.make_tensor_value_info("e", TP.FLOAT, [4])])
    return helper.make_node("If", ["cond"], ["r"], then_branch=then, else_branch=other, name=name)


def test_if_subgraph_inside_a_function(layout):
    nodes = [helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(
        np.array(True), "cv")), _if_node(_then(_ext("sub/secret.bin"))),
        helper.make_node("Add", ["a", "r"], ["b"])]
    path = layout / "m.onnx"
    onnx.save(_fn_model(nodes), str(path))
    _refused(path, r"tensor 'leak' in attribute 'value' of node 'inner' in graph 'then_g' of "
                   r"attribute 'then_branch' of node 'iff' in function 'local:Leak'")


def test_loop_body_inside_a_function(layout):
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Constant", [], ["v"], value=_ext("/etc/passwd"), name="deep"),
         helper.make_node("Add", ["s_in", "v"], ["s_out"])],
        "body", [helper.make_tensor_value_info("i", TP.INT64, []),
                 helper.make_tensor_value_info("c_in", TP.BOOL, []),
                 helper.make_tensor_value_info("s_in", TP.FLOAT, [4])],
        [helper.make_tensor_value_info("c_out", TP.BOOL, []),
         helper.make_tensor_value_info("s_out", TP.FLOAT, [4])])
    nodes = [helper.make_node("Constant", [], ["n"], value=numpy_helper.from_array(np.int64(2))),
             helper.make_node("Loop", ["n", "", "a"], ["b"], body=body, name="loop")]
    path = layout / "m.onnx"
    onnx.save(_fn_model(nodes), str(path))
    _refused(path, r"node 'deep' in graph 'body' of attribute 'body' of node 'loop' in function")


def test_function_attribute_default(layout):
    m = _fn_model([helper.make_node("Identity", ["a"], ["b"])])
    a = m.functions[0].attribute_proto.add()
    a.name, a.type = "w", onnx.AttributeProto.TENSOR
    a.t.CopyFrom(_ext("../secret.bin"))
    path = layout / "m.onnx"
    onnx.save(m, str(path))
    _refused(path, r"the default of attribute 'w' in function 'local:Leak'")


def test_main_graph_subgraph_initializer(layout):
    then = helper.make_graph([helper.make_node("Identity", ["leak"], ["t"])], "then_g", [],
                             [helper.make_tensor_value_info("t", TP.FLOAT, [4])],
                             [_ext("link.bin")])
    g = helper.make_graph([_if_node(then)], "g", [helper.make_tensor_value_info("cond", TP.BOOL, [])],
                          [helper.make_tensor_value_info("r", TP.FLOAT, [4])])
    path = layout / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    _refused(path, r"initializer 'leak' in graph 'then_g' of attribute 'then_branch' of node 'iff'")


def test_hard_link_is_refused(layout):
    os.link(layout.parent / "secret.bin", layout / "hard.bin")
    path = layout / "m.onnx"
    onnx.save(_const_fn_model(_ext("hard.bin")), str(path))
    _refused(path, "hard links")


def test_onnx_ir_model_external_tensors_need_their_folder(tmp_path):
    w = np.arange(4, dtype=np.float32)
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    g = helper.make_graph([helper.make_node("Add", ["x", "leak"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [4])], [_ext("w.bin")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    # onnx_ir.load sets each tensor's folder: loads
    with actorrt.InferenceSession(ir.load(str(path))) as s:
        np.testing.assert_array_equal(s.run(None, {"x": np.zeros(4, np.float32)})[0], w)
    # no folder: relative to the cwd, refused
    m = ir.serde.deserialize_model(onnx.load(str(path), load_external_data=False))
    with pytest.raises(actorrt.ModelLoadError, match="'leak'.*no base folder"):
        actorrt.InferenceSession(m)
    # a folder, but the location escapes it
    (tmp_path / "sub").mkdir()
    m = ir.load(str(path))
    m.graph.initializers["leak"].const_value = ir.ExternalTensor(
        "../w.bin", None, None, ir.DataType.FLOAT, shape=ir.Shape([4]), name="leak",
        base_dir=str(tmp_path / "sub"))
    with pytest.raises(actorrt.ModelLoadError, match="'leak'.*escapes"):
        actorrt.InferenceSession(m)
