"""Sequence ops against the ONNX reference evaluator / onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.oracle import check_model, run_actorrt

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _vi(name, dtype, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def _seq(name, dtype=F):
    return helper.make_tensor_sequence_value_info(name, dtype, None)


def _model(nodes, inputs, outputs, opset=21):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


A = np.arange(6, dtype=np.float32).reshape(2, 3)
Bv = np.arange(6, 12, dtype=np.float32).reshape(2, 3)
C = np.arange(12, 18, dtype=np.float32).reshape(2, 3)


def _abc_feeds(**extra):
    return {"a": A, "b": Bv, "c": C, **extra}


def _abc_inputs(*extra):
    return [_vi("a", F, [2, 3]), _vi("b", F, [2, 3]), _vi("c", F, [2, 3]), *extra]


@pytest.mark.parametrize("pos", [None, 0, 1, 2, -1, -2])
def test_sequence_insert(pos):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "c"] + (["p"] if pos is not None else []),
                              ["out"])]
    extra = [_vi("p", I64, [])] if pos is not None else []
    feeds = _abc_feeds(**({"p": np.array(pos, np.int64)} if pos is not None else {}))
    # the reference evaluator wraps position == len(seq) to 0; the spec appends
    check_model(_model(nodes, _abc_inputs(*extra), [_seq("out")]), feeds,
                peer="ort" if pos == 2 else "reference")


@pytest.mark.parametrize("pos", [0, 1, 2, -1, -3])
def test_sequence_at(pos):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["out"])]
    check_model(_model(nodes, _abc_inputs(_vi("p", I64, [])), [_vi("out", F, None)]),
                _abc_feeds(p=np.array(pos, np.int64)))


@pytest.mark.parametrize("pos", [None, 0, 1, -1])
def test_sequence_erase_and_length(pos):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("SequenceErase", ["s"] + (["p"] if pos is not None else []),
                              ["out"]),
             helper.make_node("SequenceLength", ["out"], ["n"])]
    extra = [_vi("p", I64, [])] if pos is not None else []
    feeds = _abc_feeds(**({"p": np.array(pos, np.int64)} if pos is not None else {}))
    got = check_model(_model(nodes, _abc_inputs(*extra), [_seq("out"), _vi("n", I64, [])]),
                      feeds)
    assert got[1].dtype == np.int64 and got[1].shape == ()


def test_sequence_at_out_of_range_raises():
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["out"])]
    m = _model(nodes, _abc_inputs(_vi("p", I64, [])), [_vi("out", F, None)])
    with pytest.raises(Exception, match="out of range"):
        run_actorrt(m, _abc_feeds(p=np.array(3, np.int64)))


def test_sequence_empty_then_insert():
    nodes = [helper.make_node("SequenceEmpty", [], ["s"], dtype=F),
             helper.make_node("SequenceInsert", ["s", "a"], ["s2"]),
             helper.make_node("SequenceLength", ["s2"], ["n"])]
    check_model(_model(nodes, [_vi("a", F, [2, 3])], [_seq("s2"), _vi("n", I64, [])]),
                {"a": A})


@pytest.mark.parametrize("axis,new_axis", [(0, 0), (1, 0), (-1, 0), (0, 1), (2, 1), (-1, 1)])
def test_concat_from_sequence(axis, new_axis):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["out"], axis=axis,
                              new_axis=new_axis)]
    check_model(_model(nodes, _abc_inputs(), [_vi("out", F, None)]), _abc_feeds())


@pytest.mark.parametrize("split,axis,keepdims", [
    (None, 0, 1), (None, 1, 0), (None, -1, 1), (2, 1, 1), (np.array([1, 3], np.int64), 1, 1),
    (np.array(4, np.int64), 1, 1)])
@pytest.mark.parametrize("opset", [11, 24])
def test_split_to_sequence(split, axis, keepdims, opset):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    ins = ["x"]
    vis = [_vi("x", F, [2, 4])]
    feeds = {"x": x}
    if split is not None:
        split = np.asarray(split, np.int64)
        ins.append("split")
        vis.append(_vi("split", I64, list(split.shape)))
        feeds["split"] = split
    node = helper.make_node("SplitToSequence", ins, ["out"], axis=axis, keepdims=keepdims)
    check_model(_model([node], vis, [_seq("out")], opset=opset), feeds)


def _seqmap_add_body():
    return helper.make_graph([helper.make_node("Add", ["e", "t"], ["o"]),
                              helper.make_node("Shape", ["e"], ["shp"])],
                             "body", [_vi("e", F, None), _vi("t", F, None)],
                             [_vi("o", F, None), _vi("shp", I64, [None])])


def test_sequence_map_sequence_and_tensor():
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceMap", ["s", "c"], ["o", "shp"], body=_seqmap_add_body())]
    check_model(_model(nodes, _abc_inputs(), [_seq("o"), _seq("shp", I64)]), _abc_feeds())


def test_sequence_map_two_sequences():
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceConstruct", ["c", "a"], ["s2"]),
             helper.make_node("SequenceMap", ["s", "s2"], ["o", "shp"], body=_seqmap_add_body())]
    check_model(_model(nodes, _abc_inputs(), [_seq("o"), _seq("shp", I64)]), _abc_feeds())


def test_sequence_map_reads_outer_scope():
    body = helper.make_graph([helper.make_node("Mul", ["e", "c"], ["o"])], "body",
                             [_vi("e", F, None)], [_vi("o", F, None)])
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceMap", ["s"], ["o"], body=body)]
    check_model(_model(nodes, _abc_inputs(), [_seq("o")]), _abc_feeds(), peer="ort")


def test_sequence_graph_input_and_output():
    node = helper.make_node("SequenceInsert", ["s", "a"], ["out"])
    m = _model([node], [_seq("s"), _vi("a", F, [2, 3])], [_seq("out")])
    check_model(m, {"s": [Bv, C], "a": A})
