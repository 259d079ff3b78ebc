"""Malformed tensor data and invalid graphs are refused at load with a
ModelLoadError naming the tensor, node and value; onnxruntime (the peer)
refuses every invalid graph here too, and loads every valid neighbour."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import actorrt

ort.set_default_logger_severity(4)


def _vi(name, shape=(4,), t=TP.FLOAT):
    return helper.make_tensor_value_info(name, t, list(shape) if shape is not None else None)


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),), functions=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, functions=list(functions),
                             opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _with_weight(t):
    """y = x + w, ``w`` the given (possibly broken) initializer."""
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x")],
                  [_vi("y")], [t])


def _tensor(dtype=TP.FLOAT, dims=(4,), **fields):
    t = onnx.TensorProto()
    t.name, t.data_type = "w", dtype
    t.dims.extend(dims)
    for k, v in fields.items():
        if k == "raw_data":
            t.raw_data = v
        else:
            getattr(t, k).extend(v)
    return t


# ------------------------------------------------------------ inline data

INLINE = {
    "short raw_data": (_tensor(raw_data=b"\0" * 12), "raw_data holds 12 bytes.*needs 16"),
    "long raw_data": (_tensor(raw_data=b"\0" * 20), "raw_data holds 20 bytes"),
    "short float_data": (_tensor(float_data=[1, 2, 3]), "float_data holds 3 values.*needs 4"),
    "long float_data": (_tensor(float_data=[1] * 5), "float_data holds 5 values"),
    "short int64_data": (_tensor(TP.INT64, int64_data=[1]), "int64_data holds 1 values"),
    "short int32_data (float16)": (_tensor(TP.FLOAT16, int32_data=[0, 0]),
                                   "int32_data holds 2 values.*FLOAT16.*needs 4"),
    "short double_data (complex128)": (_tensor(TP.COMPLEX128, double_data=[0] * 7),
                                       "double_data holds 7 values.*needs 8"),
    "short uint64_data (uint32)": (_tensor(TP.UINT32, uint64_data=[1]), "uint64_data holds 1"),
    "int4 packing": (_tensor(TP.INT4, dims=(5,), int32_data=[0, 0]), "holds 2 values.*needs 3"),
    "short string_data": (_tensor(TP.STRING, string_data=[b"a"]), "string_data holds 1 strings"),
    "no data": (_tensor(), "float_data holds 0 values"),
    "negative dim": (_tensor(dims=(-4,), float_data=[]), r"negative dimension"),
    "undefined type": (_tensor(TP.UNDEFINED, raw_data=b""), "element type is undefined"),
}


@pytest.mark.parametrize("case", INLINE, ids=list(INLINE))
def test_malformed_inline_data_names_the_initializer(case):
    t, match = INLINE[case]
    m = _with_weight(t)
    for src in (m, m.SerializeToString()):
        with pytest.raises(actorrt.ModelLoadError, match=rf"initializer 'w': .*{match}"):
            actorrt.InferenceSession(src)


def test_well_formed_neighbours_load():
    # every typed field at the right count, and packed 4-bit / complex data
    cases = [(_tensor(float_data=[1, 2, 3, 4]), np.float32([1, 2, 3, 4])),
             (_tensor(raw_data=np.float32([4, 3, 2, 1]).tobytes()), np.float32([4, 3, 2, 1]))]
    for t, w in cases:
        with actorrt.InferenceSession(_with_weight(t)) as s:
            np.testing.assert_array_equal(s.run(None, {"x": np.zeros(4, np.float32)})[0], w)


def test_malformed_constant_value_names_the_node():
    c = helper.make_node("Constant", [], ["w"], name="const", value=_tensor(raw_data=b"\0" * 3))
    m = _model([c, helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")], [_vi("y")])
    with pytest.raises(actorrt.ModelLoadError,
                       match="attribute 'value' of node 'const'.*raw_data holds 3 bytes"):
        actorrt.InferenceSession(m)


# ------------------------------------------------------------ external data


def _external(tmp_path, entries, file_bytes=16):
    (tmp_path / "w.bin").write_bytes(b"\0" * file_bytes)
    t = _tensor()
    t.data_location = TP.EXTERNAL
    for k, v in entries:
        e = t.external_data.add()
        e.key, e.value = k, v
    path = tmp_path / "m.onnx"
    onnx.save(_with_weight(t), str(path))
    return path


EXTERNAL = {
    "offset past the end, no length": ([("location", "w.bin"), ("offset", "100")],
                                       r"holds 16 bytes, tensor needs bytes 100\.\.116"),
    "offset + bytes past the end": ([("location", "w.bin"), ("offset", "4")], "holds 16 bytes"),
    "offset not a number": ([("location", "w.bin"), ("offset", "abc")],
                            "offset 'abc' is not a non-negative integer"),
    "offset float": ([("location", "w.bin"), ("offset", "1.5")], "offset '1.5' is not"),
    "negative offset": ([("location", "w.bin"), ("offset", "-4")], "offset '-4' is not"),
    "length not a number": ([("location", "w.bin"), ("length", "16x")], "length '16x' is not"),
    "length mismatch": ([("location", "w.bin"), ("length", "8")],
                        "length 8 does not match the 16 bytes"),
    "NUL in location": ([("location", "w.bin\0../../etc/passwd")], "contains a NUL byte"),
    "no location": ([("offset", "0")], "has no location"),
    "unknown key": ([("location", "w.bin"), ("basepath", "/etc")], "unknown external data keys"),
    "duplicate key": ([("location", "w.bin"), ("location", "/etc/passwd")], "appears twice"),
    "a directory": ([("location", ".")], "is not a regular file"),
}


@pytest.mark.parametrize("case", EXTERNAL, ids=list(EXTERNAL))
def test_malformed_external_data_names_the_initializer(tmp_path, case):
    entries, match = EXTERNAL[case]
    path = _external(tmp_path, entries)
    with pytest.raises(actorrt.ModelLoadError, match=rf"initializer 'w': .*{match}"):
        actorrt.InferenceSession(path)


def test_external_data_with_offset_and_length_loads(tmp_path):
    path = _external(tmp_path, [("location", "w.bin"), ("offset", "16"), ("length", "16")],
                     file_bytes=32)
    with actorrt.InferenceSession(path) as s:
        np.testing.assert_array_equal(s.run(None, {"x": np.ones(4, np.float32)})[0], 1)


# ------------------------------------------------------------ invalid graphs


def _branch(name, outs):
    return helper.make_graph([helper.make_node("Relu", ["x"], [o]) for o in outs], name, [],
                             [_vi(o) for o in outs])


def _loop_body(n_in):
    ins = [_vi("i", [], TP.INT64), _vi("c", [], TP.BOOL), _vi("s")][:n_in]
    return helper.make_graph([helper.make_node("Identity", ["c"], ["co"]),
                              helper.make_node("Relu", ["x"], ["so"])], "body", ins,
                             [_vi("co", [], TP.BOOL), _vi("so")])


def _scan_body(n_in):
    ins = [_vi("st", [4]), _vi("el", [4])][:n_in]
    return helper.make_graph([helper.make_node("Identity", ["st"], ["st_o"]),
                              helper.make_node("Identity", ["st"], ["sc_o"])], "sbody", ins,
                             [_vi("st_o", [4]), _vi("sc_o", [4])])


LEAKY_STRING = helper.make_node("LeakyRelu", ["x"], ["y"], name="lr")
_a = LEAKY_STRING.attribute.add()
_a.name, _a.type, _a.s = "alpha", onnx.AttributeProto.STRING, b"big"

INVALID = {
    "output nothing produces": (
        _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x")],
               [_vi("y"), _vi("z")]), "graph output 'z' is not produced by any node"),
    "undefined node input": (
        _model([helper.make_node("Add", ["x", "q"], ["y"], name="add")], [_vi("x")], [_vi("y")]),
        r"\[model 'g', node 'add'\] input 'q' of node 'add' \(Add\) is not defined"),
    "undefined input in a subgraph": (
        _model([helper.make_node("If", ["c"], ["y"], name="iff",
                                 then_branch=helper.make_graph(
                                     [helper.make_node("Relu", ["nope"], ["t"], name="in")],
                                     "then", [], [_vi("t")]),
                                 else_branch=_branch("else", ["e"]))],
               [_vi("x"), _vi("c", [], TP.BOOL)], [_vi("y")]),
        "input 'nope' of node 'in' .* in graph 'then' of attribute 'then_branch' of node 'iff'"),
    "If branch with the wrong output count": (
        _model([helper.make_node("If", ["c"], ["y"], name="iff",
                                 then_branch=_branch("then", ["a", "b"]),
                                 else_branch=_branch("else", ["e"]))],
               [_vi("x"), _vi("c", [], TP.BOOL)], [_vi("y")]),
        "node 'iff' .*then_branch gives 2 outputs, but the node has 1"),
    "attribute of the wrong type": (
        _model([LEAKY_STRING], [_vi("x")], [_vi("y")]),
        r"\[model 'g', node 'lr'\] .*alpha.*Expected: 'FLOAT', actual: 'STRING'"),
    "int attribute for a float one": (
        _model([helper.make_node("LeakyRelu", ["x"], ["y"], name="lr", alpha=2)], [_vi("x")],
               [_vi("y")]), r"node 'lr'.*alpha.*Expected: 'FLOAT', actual: 'INT'"),
    "Loop body with the wrong input count": (
        _model([helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=_loop_body(2))],
               [_vi("x"), _vi("n", [], TP.INT64)], [_vi("y")]),
        "node 'loop' .*body takes 2 inputs, .* must take 3"),
    "Scan body with the wrong input count": (
        _model([helper.make_node("Scan", ["x", "xs"], ["y", "ys"], name="scan", num_scan_inputs=1,
                                 body=_scan_body(1))],
               [_vi("x"), _vi("xs", [3, 4])], [_vi("y"), _vi("ys", [3, 4])]),
        "node 'scan' .*body takes 1 inputs, but the node binds 2"),
    "duplicate output names": (
        _model([helper.make_node("Relu", ["x"], ["y"], name="a"),
                helper.make_node("Neg", ["x"], ["y"], name="b")], [_vi("x")], [_vi("y")]),
        "value 'y' is assigned twice: by node 'a' \\(Relu\\) and by node 'b' \\(Neg\\)"),
    "node output shadowing a graph input": (
        _model([helper.make_node("Relu", ["x"], ["x"], name="a")], [_vi("x")], [_vi("x")]),
        "value 'x' is assigned twice: by a graph input and by node 'a'"),
    "opset import missing for a domain": (
        _model([helper.make_node("Foo", ["x"], ["y"], domain="custom.ops", name="foo")],
               [_vi("x")], [_vi("y")]), r"node 'foo'.*No opset import for domain 'custom.ops'"),
    "undefined input in a function": (
        _model([helper.make_node("F", ["x"], ["y"], domain="local", name="call")], [_vi("x")],
               [_vi("y")], opsets=(("", 17), ("local", 1)),
               functions=[helper.make_function("local", "F", ["a"], ["b"],
                                               [helper.make_node("Add", ["a", "zz"], ["b"],
                                                                 name="fadd")],
                                               [helper.make_opsetid("", 17)])]),
        "input 'zz' of node 'fadd' .* in function 'local:F' is not defined"),
    "too many inputs for the schema": (
        _model([helper.make_node("Relu", ["x", "x"], ["y"], name="r")], [_vi("x")], [_vi("y")]),
        r"node 'r'.*input size 2 not in range"),
}


@pytest.mark.parametrize("case", INVALID, ids=list(INVALID))
def test_invalid_graph_is_refused_at_load(case):
    m, match = INVALID[case]
    with pytest.raises(Exception):  # the peer refuses it too: the model really is invalid
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for src in (m, m.SerializeToString()):
        with pytest.raises(actorrt.ModelLoadError, match=match):
            actorrt.InferenceSession(src)


def test_invalid_graph_from_a_path(tmp_path):
    m, match = INVALID["If branch with the wrong output count"]
    onnx.save(m, str(tmp_path / "m.onnx"))
    with pytest.raises(actorrt.ModelLoadError, match=match):
        actorrt.InferenceSession(tmp_path / "m.onnx")


def _run_both(m, feeds):
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = ref.run(None, feeds)
    with actorrt.InferenceSession(m) as s:
        got = s.run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


VALID = {
    # nodes out of order: the loader sorts them; the error after them is still found
    # (more cases are added below the dict)
    "unsorted nodes": _model([helper.make_node("Neg", ["t"], ["y"]),
                              helper.make_node("Relu", ["x"], ["t"])], [_vi("x")], [_vi("y")]),
    "no declared output shape or type": _model(
        [helper.make_node("Relu", ["x"], ["y"])], [_vi("x")],
        [helper.make_empty_tensor_value_info("y")]),
    "no declared shapes": _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", None)],
                                 [_vi("y", None)]),
    "initializer that is also a graph input": _model(
        [helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x"), _vi("w")], [_vi("y")],
        [numpy_helper.from_array(np.float32([1, 2, 3, 4]), "w")]),
    "graph input passed through as an output": _model(
        [helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y"), _vi("x")]),
    "subgraph reading the outer scope": _model(
        [helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", ["a"]),
                          else_branch=helper.make_graph(
                              [helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [_vi("e")]))],
        [_vi("x"), _vi("c", [], TP.BOOL)], [_vi("y")]),
    "com.microsoft without its opset import": _model(
        [helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")], [_vi("x")],
        [_vi("y")]),
}


def _ir3(m):
    m.ir_version = 3
    return m


# IR 3 wants every initializer listed as a graph input; onnxruntime's optimizer
# writes new (folded) initializers without listing them and keeps IR 3, and
# onnxruntime loads such files
VALID["IR 3 initializer not listed as a graph input"] = _ir3(_model(
    [helper.make_node("Add", ["x", "k"], ["t"]), helper.make_node("Mul", ["t", "v"], ["y"])],
    [_vi("x"), _vi("k")], [_vi("y")],
    [numpy_helper.from_array(np.float32([1, 2, 3, 4]), "k"),
     numpy_helper.from_array(np.float32([2, 2, 3, 3]), "v")]))


@pytest.mark.parametrize("case", VALID, ids=list(VALID))
def test_valid_neighbours_load_and_match_the_peer(case):
    m = VALID[case]
    feeds = {"x": np.float32([-1, 2, -3, 4])}
    if any(i.name == "c" for i in m.graph.input):
        feeds["c"] = np.array(False)
    if any(i.name == "w" for i in m.graph.input):
        feeds["w"] = np.float32([5, 6, 7, 8])
    _run_both(m, feeds)


def test_unsorted_model_still_gets_the_later_finding_checked():
    # out of order first (tolerated), then a wrong attribute type the checker
    # only sees in the sorted copy
    lr = onnx.NodeProto()
    lr.CopyFrom(LEAKY_STRING)
    lr.input[0] = "t"
    m = _model([lr, helper.make_node("Relu", ["x"], ["t"])], [_vi("x")], [_vi("y")])
    with pytest.raises(actorrt.ModelLoadError, match=r"node 'lr'.*actual: 'STRING'"):
        actorrt.InferenceSession(m)


def test_ir3_model_saved_by_onnxruntimes_optimizer_loads_and_matches(tmp_path):
    # an IR 3 model (every initializer a graph input, as IR 3 requires) whose
    # constant subgraph onnxruntime folds into a new, unlisted initializer
    w = numpy_helper.from_array(np.float32([1, 2, 3, 4]), "w")
    m = _ir3(_model([helper.make_node("Exp", ["w"], ["e"]),
                     helper.make_node("Add", ["x", "e"], ["y"])],
                    [_vi("x"), _vi("w")], [_vi("y")], [w]))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "saved.onnx")
    ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    saved = onnx.load(str(tmp_path / "saved.onnx"))
    listed = {i.name for i in saved.graph.input}
    assert saved.ir_version == 3
    assert any(t.name not in listed for t in saved.graph.initializer)  # the case at hand
    feeds = {"x": np.float32([-1, 2, -3, 4])}
    for i in saved.graph.input:  # inputs the optimizer left without a consumer
        if i.name != "x":
            feeds[i.name] = np.float32([1, 2, 3, 4])
    _run_both(saved, feeds)
