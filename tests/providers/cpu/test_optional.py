"""Optional ops against the ONNX reference evaluator / onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.oracle import check_model, run_actorrt

F = TensorProto.FLOAT


def _opt_tensor(name):
    return helper.make_value_info(
        name, helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2])))


def _opt_seq(name):
    return helper.make_value_info(name, helper.make_optional_type_proto(
        helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))))


def _model(nodes, inputs, outputs, opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


X = np.array([1.5, -2], np.float32)


@pytest.mark.parametrize("opset", [15, 18, 21])
def test_optional_wraps_tensor_then_get_and_has(opset):
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalGetElement", ["o"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("has", TensorProto.BOOL, []),
                helper.make_tensor_value_info("y", F, [2])], opset=opset)
    # the reference evaluator wraps OptionalGetElement's tensor in a list
    got = check_model(m, {"x": X}, peer="ort")
    assert got[0].dtype == np.bool_ and got[0].shape == ()


def test_empty_optional_from_type_attribute():
    tp = helper.make_tensor_type_proto(F, [2])
    nodes = [helper.make_node("Optional", [], ["o"], type=tp),
             helper.make_node("OptionalHasElement", ["o"], ["has"])]
    m = _model(nodes, [], [_opt_tensor("o"),
                           helper.make_tensor_value_info("has", TensorProto.BOOL, [])])
    o, has = run_actorrt(m, {})
    assert o is None and not bool(has)


@pytest.mark.parametrize("value", [None, X])
def test_optional_graph_input(value):
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"])]
    m = _model(nodes, [_opt_tensor("o")],
               [helper.make_tensor_value_info("has", TensorProto.BOOL, [])])
    feeds = {} if value is None else {"o": value}
    (has,) = run_actorrt(m, feeds)
    assert bool(has) == (value is not None)


def test_has_element_without_input_is_false():
    m = _model([helper.make_node("OptionalHasElement", [""], ["has"])], [],
               [helper.make_tensor_value_info("has", TensorProto.BOOL, [])])
    check_model(m, {})


def test_optional_sequence_get_element():
    nodes = [helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
             helper.make_node("Optional", ["s"], ["o"]),
             helper.make_node("OptionalGetElement", ["o"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_sequence_value_info("y", F, None)])
    check_model(m, {"x": X}, peer="ort")


def test_get_element_of_plain_tensor_opset18():
    m = _model([helper.make_node("OptionalGetElement", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", F, [2])])
    check_model(m, {"x": X})


def test_get_element_of_empty_optional_raises():
    m = _model([helper.make_node("OptionalGetElement", ["o"], ["y"])], [_opt_tensor("o")],
               [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(Exception, match="empty optional"):
        run_actorrt(m, {})
