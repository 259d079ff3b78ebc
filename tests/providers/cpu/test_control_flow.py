"""If / Loop / Scan against the ONNX reference evaluator and onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.oracle import check_model, run_actorrt

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def _model(nodes, inputs, outputs, opset=21, name="g"):
    g = helper.make_graph(nodes, name, inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, dtype, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


# ------------------------------------------------------------------------ If

def _if_model(opset=21):
    then_g = helper.make_graph([helper.make_node("Add", ["x", "y"], ["t"])], "then", [],
                               [_vi("t", F, [3])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "y"], ["e"])], "else", [],
                               [_vi("e", F, [3])])
    node = helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)
    return _model([node], [_vi("c", B, []), _vi("x", F, [3]), _vi("y", F, [3])],
                  [_vi("out", F, [3])], opset=opset)


@pytest.mark.parametrize("cond", [True, False])
@pytest.mark.parametrize("opset", [11, 13, 21])
def test_if_reads_outer_scope(cond, opset):
    x = np.array([1, 2, 3], np.float32)
    y = np.array([10, 20, 30], np.float32)
    check_model(_if_model(opset), {"c": np.array(cond), "x": x, "y": y})


def test_if_branch_returns_sequence():
    then_g = helper.make_graph([helper.make_node("SequenceConstruct", ["x", "x"], ["s"])],
                               "then", [], [helper.make_tensor_sequence_value_info("s", F, None)])
    else_g = helper.make_graph([helper.make_node("SequenceConstruct", ["x"], ["s2"])],
                               "else", [], [helper.make_tensor_sequence_value_info("s2", F, None)])
    node = helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)
    m = _model([node], [_vi("c", B, []), _vi("x", F, [2])],
               [helper.make_tensor_sequence_value_info("out", F, None)])
    for c in (True, False):
        check_model(m, {"c": np.array(c), "x": np.array([1, 2], np.float32)})


# ---------------------------------------------------------------------- Loop

def _loop_body(scan=True):
    """body(i, cond, acc) -> (cond', acc + x * i, [acc]) with x from the outer scope;
    cond' = (acc < limit)."""
    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Add", ["acc", "xi"], ["acc_out"]),
        helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
        helper.make_node("Less", ["total", "limit"], ["cond_out"]),
    ]
    outs = [_vi("cond_out", B, []), _vi("acc_out", F, [2])]
    if scan:
        nodes.append(helper.make_node("Identity", ["acc"], ["scan_out"]))
        outs.append(_vi("scan_out", F, [2]))
    return helper.make_graph(nodes, "body", [_vi("i", I64, []), _vi("cond", B, []),
                                             _vi("acc", F, [2])], outs)


def _loop_model(with_m=True, with_cond=True):
    node = helper.make_node("Loop", ["M" if with_m else "", "c" if with_cond else "", "a0"],
                            ["acc_final", "scans"], body=_loop_body())
    ins = [_vi("a0", F, [2]), _vi("x", F, [2]), _vi("limit", F, [])]
    if with_m:
        ins.append(_vi("M", I64, []))
    if with_cond:
        ins.append(_vi("c", B, []))
    return _model([node], ins, [_vi("acc_final", F, [2]), _vi("scans", F, [None, 2])])


@pytest.mark.parametrize("with_m,with_cond,m,limit", [
    (True, True, 5, 1e9),      # trip count ends the loop
    (True, True, 10, 20.0),    # condition ends it first
    (True, False, 4, 0.0),     # M only: the condition is ignored
    (False, True, 0, 20.0),    # cond only
    (True, True, 0, 1e9),      # zero iterations: initial values, empty scan output
])
def test_loop(with_m, with_cond, m, limit):
    feeds = {"a0": np.array([1, 2], np.float32), "x": np.array([0.5, 1.5], np.float32),
             "limit": np.array(limit, np.float32)}
    if with_m:
        feeds["M"] = np.array(m, np.int64)
    if with_cond:
        feeds["c"] = np.array(True)
    model = _loop_model(with_m, with_cond)
    if (m == 0 and with_m) or not with_cond:
        # the reference evaluator cannot build an empty scan output and treats an
        # omitted condition as false; onnxruntime follows the spec
        check_model(model, feeds, peer="ort")
    else:
        check_model(model, feeds)


def test_loop_false_initial_condition():
    feeds = {"a0": np.array([1, 2], np.float32), "x": np.array([0.5, 1.5], np.float32),
             "limit": np.array(1e9, np.float32), "M": np.array(3, np.int64),
             "c": np.array(False)}
    acc, scans = run_actorrt(_loop_model(), feeds)
    np.testing.assert_array_equal(acc, feeds["a0"])
    assert scans.shape == (0, 2) and scans.dtype == np.float32


def test_loop_sequence_carried():
    """A sequence loop-carried value grows by one element per iteration."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Unsqueeze", ["i", "zero"], ["i1"]),
         helper.make_node("SequenceInsert", ["seq", "i1"], ["seq_out"])],
        "body", [_vi("i", I64, []), _vi("cond", B, []),
                 helper.make_tensor_sequence_value_info("seq", I64, None)],
        [_vi("cond_out", B, []), helper.make_tensor_sequence_value_info("seq_out", I64, None)],
        initializer=[helper.make_tensor("zero", I64, [1], [0])])
    nodes = [helper.make_node("SequenceEmpty", [], ["s0"], dtype=I64),
             helper.make_node("Loop", ["M", "", "s0"], ["s_final"], body=body)]
    m = _model(nodes, [_vi("M", I64, [])],
               [helper.make_tensor_sequence_value_info("s_final", I64, None)])
    got = check_model(m, {"M": np.array(4, np.int64)}, peer="ort")
    assert [int(a[0]) for a in got[0]] == [0, 1, 2, 3]


# ---------------------------------------------------------------------- Scan

def _scan_body(rank_in=2):
    """state (2,) + x slice -> state + x, y = x * 2 (scan output)."""
    shape = [2] if rank_in == 2 else [2, 1]
    nodes = [helper.make_node("Add", ["s", "xs"], ["s_out"]),
             helper.make_node("Add", ["xs", "xs"], ["y"])]
    return helper.make_graph(nodes, "body", [_vi("s", F, shape), _vi("xs", F, shape)],
                             [_vi("s_out", F, shape), _vi("y", F, shape)])


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir", [
    (0, 0, 0, 0), (0, 1, 0, 0), (1, 0, 0, 0), (0, 0, 1, 1), (1, 1, -1, 1), (-2, 0, 0, 1)])
def test_scan9_axes_and_directions(in_axis, in_dir, out_axis, out_dir):
    node = helper.make_node("Scan", ["s0", "x"], ["s_final", "ys"], body=_scan_body(),
                            num_scan_inputs=1, scan_input_axes=[in_axis],
                            scan_input_directions=[in_dir], scan_output_axes=[out_axis],
                            scan_output_directions=[out_dir])
    x_shape = [3, 2] if in_axis % 2 == 0 else [2, 3]
    m = _model([node], [_vi("s0", F, [2]), _vi("x", F, x_shape)],
               [_vi("s_final", F, [2]), _vi("ys", F, None)])
    x = np.arange(6, dtype=np.float32).reshape(x_shape) + 1
    check_model(m, {"s0": np.array([0.5, -1], np.float32), "x": x}, peer="ort")


def test_scan9_zero_length():
    node = helper.make_node("Scan", ["s0", "x"], ["s_final", "ys"], body=_scan_body(),
                            num_scan_inputs=1)
    m = _model([node], [_vi("s0", F, [2]), _vi("x", F, [None, 2])],
               [_vi("s_final", F, [2]), _vi("ys", F, None)])
    s, ys = run_actorrt(m, {"s0": np.array([1, 2], np.float32),
                            "x": np.zeros((0, 2), np.float32)})
    np.testing.assert_array_equal(s, [1, 2])
    assert ys.shape == (0, 2) and ys.dtype == np.float32


def test_scan8_sequence_lens_and_direction():
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "xs"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y"])],
        "body", [_vi("s", F, [2]), _vi("xs", F, [2])], [_vi("s_out", F, [2]), _vi("y", F, [2])])
    node = helper.make_node("Scan", ["lens", "s0", "x"], ["s_final", "ys"], body=body,
                            num_scan_inputs=1, directions=[1])
    m = _model([node], [_vi("lens", I64, [2]), _vi("s0", F, [2, 2]),
                        _vi("x", F, [2, 3, 2])],
               [_vi("s_final", F, [2, 2]), _vi("ys", F, [2, 3, 2])], opset=8)
    x = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    feeds = {"lens": np.array([3, 2], np.int64), "s0": np.zeros((2, 2), np.float32), "x": x}
    check_model(m, feeds, peer="ort")


def test_scan8_without_sequence_lens():
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "xs"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y"])],
        "body", [_vi("s", F, [2]), _vi("xs", F, [2])], [_vi("s_out", F, [2]), _vi("y", F, [2])])
    node = helper.make_node("Scan", ["", "s0", "x"], ["s_final", "ys"], body=body,
                            num_scan_inputs=1)
    m = _model([node], [_vi("s0", F, [1, 2]), _vi("x", F, [1, 3, 2])],
               [_vi("s_final", F, [1, 2]), _vi("ys", F, [1, 3, 2])], opset=8)
    feeds = {"s0": np.ones((1, 2), np.float32),
             "x": np.arange(6, dtype=np.float32).reshape(1, 3, 2)}
    check_model(m, feeds, peer="ort")


def test_loop_with_nested_if_reading_outer_scope():
    """An If inside a Loop body reads a value from the outermost graph."""
    then_g = helper.make_graph([helper.make_node("Add", ["acc", "x"], ["t"])], "then", [],
                               [_vi("t", F, [2])])
    else_g = helper.make_graph([helper.make_node("Sub", ["acc", "x"], ["e"])], "else", [],
                               [_vi("e", F, [2])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Less", ["i", "two"], ["small"]),
         helper.make_node("If", ["small"], ["acc_out"], then_branch=then_g,
                          else_branch=else_g)],
        "body", [_vi("i", I64, []), _vi("cond", B, []), _vi("acc", F, [2])],
        [_vi("cond_out", B, []), _vi("acc_out", F, [2])],
        initializer=[helper.make_tensor("two", I64, [], [2])])
    node = helper.make_node("Loop", ["M", "", "a0"], ["out"], body=body)
    m = _model([node], [_vi("M", I64, []), _vi("a0", F, [2]), _vi("x", F, [2])],
               [_vi("out", F, [2])])
    # the reference evaluator loses the outer-scope value two levels down
    check_model(m, {"M": np.array(5, np.int64), "a0": np.zeros(2, np.float32),
                    "x": np.array([1, 2], np.float32)}, peer="ort")
