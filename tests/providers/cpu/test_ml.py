"""ai.onnx.ml ops against the ONNX reference evaluator / onnxruntime."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.oracle import (assert_close, check_model, run_actorrt, run_onnxruntime,
                          run_reference)

ML = "ai.onnx.ml"


def _ml_model(op, inputs, outputs, ml_opset, *, opset=21, **attrs):
    """A one-node ai.onnx.ml model; ``inputs`` maps names to sample arrays."""
    node = helper.make_node(op, list(inputs), list(outputs), domain=ML, **attrs)
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    g = helper.make_graph([node], op, vis, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset),
                                               helper.make_opsetid(ML, ml_opset)])


def _strs(*items, shape=None):
    a = np.empty(len(items), dtype=object)
    a[:] = list(items)
    return a if shape is None else a.reshape(shape)


# ----------------------------------------------------------- simple ops

@pytest.mark.parametrize("shape,idx", [((3, 4), [0, 2]), ((2, 3, 4), [3]), ((4,), [1, 3]),
                                       ((3, 4), [[1, 2]])])
def test_array_feature_extractor(shape, idx):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    m = _ml_model("ArrayFeatureExtractor", {"x": x, "i": np.array(idx, np.int64)}, ["y"], 1)
    check_model(m, {"x": x, "i": np.array(idx, np.int64)})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_binarizer(dtype):
    x = np.array([[-1, 0, 0.5], [2, 1, 3]]).astype(dtype)
    m = _ml_model("Binarizer", {"x": x}, ["y"], 1, threshold=0.5)
    check_model(m, {"x": x})


# ----------------------------------------------------------- LabelEncoder

def test_label_encoder_v1_string_to_int():
    x = _strs("b", "zz", "a", "c")
    m = _ml_model("LabelEncoder", {"x": x}, ["y"], 1, classes_strings=["a", "b", "c"],
                  default_int64=-7)
    check_model(m, {"x": x}, peer="ort")


def test_label_encoder_v1_int_to_string():
    x = np.array([2, 0, 5], np.int64)
    m = _ml_model("LabelEncoder", {"x": x}, ["y"], 1, classes_strings=["a", "b", "c"],
                  default_string="none")
    check_model(m, {"x": x}, peer="ort")


@pytest.mark.parametrize("keys,values,x,defaults", [
    ({"keys_strings": ["a", "b", "c"]}, {"values_int64s": [1, 2, 3]},
     _strs("c", "x", "a", "b", shape=(2, 2)), {"default_int64": 42}),
    ({"keys_int64s": [5, 6]}, {"values_strings": ["five", "six"]},
     np.array([5, 6, 7], np.int64), {"default_string": "?"}),
    ({"keys_floats": [0.5, 1.5]}, {"values_floats": [10.0, 20.0]},
     np.array([1.5, 0.5, 2.0], np.float32), {}),
    ({"keys_strings": ["x"]}, {"values_strings": ["y"]}, _strs("x", "q"), {}),
])
@pytest.mark.parametrize("ml_opset", [2, 4])
def test_label_encoder_lists(keys, values, x, defaults, ml_opset):
    m = _ml_model("LabelEncoder", {"x": x}, ["y"], ml_opset, **keys, **values, **defaults)
    check_model(m, {"x": x}, peer="ort")


@pytest.mark.parametrize("ktype,vtype", [(np.int64, np.float64), (np.float64, np.int16),
                                         (np.int32, np.int64)])
def test_label_encoder_tensor_attrs(ktype, vtype):
    keys = np.array([1, 3, 4], ktype)
    values = np.array([7, 8, 9], vtype)
    x = np.array([[4, 2], [1, 3]], ktype)
    m = _ml_model("LabelEncoder", {"x": x}, ["y"], 4,
                  keys_tensor=numpy_helper.from_array(keys, "k"),
                  values_tensor=numpy_helper.from_array(values, "v"),
                  default_tensor=numpy_helper.from_array(np.array([-5], vtype), "d"))
    check_model(m, {"x": x})


def test_label_encoder_repeated_key_keeps_last():
    """Spec (opset 4): a repeated key takes its last value (onnxruntime keeps the
    first, so the reference evaluator is the peer)."""
    x = np.array([5, 6, 7], np.int64)
    m = _ml_model("LabelEncoder", {"x": x}, ["y"], 4, keys_int64s=[5, 6, 5],
                  values_strings=["five", "six", "FIVE"], default_string="?")
    (got,) = run_actorrt(m, {"x": x})
    (want,) = run_reference(m, {"x": x})
    assert got.dtype == object and got.tolist() == want.tolist()


def test_label_encoder_nan_key():
    x = np.array([np.nan, 1.0, 2.0], np.float32)
    m = _ml_model("LabelEncoder", {"x": x}, ["y"], 4, keys_floats=[1.0, float("nan")],
                  values_int64s=[10, 99])
    (y,) = run_actorrt(m, {"x": x})
    np.testing.assert_array_equal(y, [99, 10, -1])
    assert y.dtype == np.int64


# ----------------------------------------------------------- trees

def _t(arr, dtype=np.float32, name="t"):
    return numpy_helper.from_array(np.asarray(arr, dtype), name)


def _v5_attrs(modes=(0, 0, 1), splits=(0.5, 1.0, -0.5), members=None):
    """Two trees: tree 0 = nodes 0, 1 (node 1 under node 0's false side),
    tree 1 = node 2; five leaves over two targets."""
    a = dict(
        nodes_featureids=[0, 1, 2], nodes_modes=_t(modes, np.uint8, "m"),
        nodes_splits=_t(splits, np.float32, "s"),
        nodes_truenodeids=[0, 1, 3], nodes_trueleafs=[1, 1, 1],
        nodes_falsenodeids=[1, 2, 4], nodes_falseleafs=[0, 1, 1],
        leaf_targetids=[0, 1, 0, 1, 0],
        leaf_weights=_t([1.0, 10.0, 100.0, 1000.0, 10000.0], np.float32, "w"),
        tree_roots=[0, 2], n_targets=2)
    if members is not None:
        a["membership_values"] = _t(members, np.float32, "mv")
    return a


X_TREES = np.array([[0.2, 2.0, -1.0], [0.7, 0.5, 0.0], [np.nan, 3.0, 1.0], [1.0, 1.0, -0.5],
                    [5.0, -2.0, 7.0]], np.float32)


@pytest.mark.parametrize("agg", [0, 1, 2, 3])
@pytest.mark.parametrize("modes", [(0, 0, 1), (2, 3, 4), (5, 1, 0)])
def test_tree_ensemble_v5_modes_and_aggregates(agg, modes):
    m = _ml_model("TreeEnsemble", {"x": X_TREES}, ["y"], 5, aggregate_function=agg,
                  **_v5_attrs(modes))
    check_model(m, {"x": X_TREES})


def test_tree_ensemble_v5_membership_and_missing():
    attrs = _v5_attrs(modes=(6, 0, 6), members=[0.2, 5.0, np.nan, 1.0, -0.5, np.nan])
    attrs["nodes_missing_value_tracks_true"] = [1, 0, 0]
    m = _ml_model("TreeEnsemble", {"x": X_TREES}, ["y"], 5, **attrs)
    check_model(m, {"x": X_TREES})


@pytest.mark.parametrize("post", [1, 2, 3, 4])
def test_tree_ensemble_v5_post_transform(post):
    """The spec numbers SOFTMAX 1 and LOGISTIC 2; onnxruntime 1.32 reads them the
    other way round, so its model gets the swapped code."""
    x = X_TREES[:, :] * 0.001
    attrs = _v5_attrs()
    attrs["leaf_weights"] = _t([0.1, 0.2, 0.3, 0.0, 0.25], np.float32, "w")
    m = _ml_model("TreeEnsemble", {"x": x}, ["y"], 5, post_transform=post, **attrs)
    ort_post = {1: 2, 2: 1}.get(post, post)
    m_ort = _ml_model("TreeEnsemble", {"x": x}, ["y"], 5, post_transform=ort_post, **attrs)
    assert_close(run_actorrt(m, {"x": x}), run_onnxruntime(m_ort, {"x": x}), rtol=1e-3,
                 atol=1e-4)


def test_tree_ensemble_v5_double():
    x = X_TREES.astype(np.float64)
    attrs = _v5_attrs()
    attrs["nodes_splits"] = _t([0.5, 1.0, -0.5], np.float64, "s")
    attrs["leaf_weights"] = _t([1.0, 10.0, 100.0, 1000.0, 10000.0], np.float64, "w")
    m = _ml_model("TreeEnsemble", {"x": x}, ["y"], 5, **attrs)
    check_model(m, {"x": x})


def _classic_nodes():
    """Tree 0: node 0 (x0 <= 0.5) -> leaf 1 / node 2 (x1 < 1) -> leaves 3, 4.
    Tree 1: node 0 (x2 >= 0) -> leaves 1, 2."""
    return dict(
        nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
        nodes_featureids=[0, 0, 1, 0, 0, 2, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "BRANCH_LT", "LEAF", "LEAF", "BRANCH_GTE", "LEAF",
                     "LEAF"],
        nodes_values=[0.5, 0, 1.0, 0, 0, 0.0, 0, 0],
        nodes_truenodeids=[1, 0, 3, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 0, 4, 0, 0, 2, 0, 0])


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_tree_ensemble_regressor(agg, post):
    attrs = dict(_classic_nodes(), n_targets=2, aggregate_function=agg, post_transform=post,
                 target_treeids=[0, 0, 0, 0, 1, 1], target_nodeids=[1, 3, 4, 4, 1, 2],
                 target_ids=[0, 1, 0, 1, 0, 1], target_weights=[0.5, 1.5, -1.0, 2.0, 0.25, 3.0],
                 base_values=[0.1, -0.2])
    m = _ml_model("TreeEnsembleRegressor", {"x": X_TREES}, ["y"], 3, **attrs)
    check_model(m, {"x": X_TREES}, peer="ort", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("labels", [{"classlabels_int64s": [3, 5, 9]},
                                    {"classlabels_strings": ["a", "b", "c"]}])
@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC"])
@pytest.mark.parametrize("base", [None, [0.1, 0.2, 0.3]])
def test_tree_ensemble_classifier_multiclass(labels, post, base):
    attrs = dict(_classic_nodes(), post_transform=post, **labels,
                 class_treeids=[0, 0, 0, 1, 1, 1], class_nodeids=[1, 3, 4, 1, 2, 2],
                 class_ids=[0, 1, 2, 2, 0, 1], class_weights=[0.5, 1.5, 1.0, 0.25, 0.6, 0.3])
    if base is not None:
        attrs["base_values"] = base
    m = _ml_model("TreeEnsembleClassifier", {"x": X_TREES}, ["label", "scores"], 3, **attrs)
    check_model(m, {"x": X_TREES}, peer="ort", rtol=1e-4, atol=1e-5)


def test_tree_ensemble_classifier_binary_declined():
    attrs = dict(_classic_nodes(), classlabels_int64s=[0, 1],
                 class_treeids=[0], class_nodeids=[1], class_ids=[0], class_weights=[1.0])
    m = _ml_model("TreeEnsembleClassifier", {"x": X_TREES}, ["label", "scores"], 3, **attrs)
    with pytest.raises(Exception, match="binary"):
        run_actorrt(m, {"x": X_TREES})
