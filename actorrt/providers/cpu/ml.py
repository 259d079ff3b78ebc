"""Traditional-ML ops of the ai.onnx.ml domain.

Spec: ai.onnx.ml ArrayFeatureExtractor (1), Binarizer (1), LabelEncoder
(1, 2, 4), TreeEnsemble (5), TreeEnsembleRegressor (1, 3, 5),
TreeEnsembleClassifier (1, 3, 5; three or more classes).
"""

from __future__ import annotations

import numpy as np

from .._contract import Kernel, NodeSpec, deny, require
from ._ml_trees import (AGGREGATE_NAMES, POST_NAMES, SUM, forest_from_classic,
                        forest_from_v5, post_transform)
from .registry import cpu_kernel

ML = "ai.onnx.ml"


@cpu_kernel("ArrayFeatureExtractor", since=1, domain=ML)
def ArrayFeatureExtractor(X, Y):
    """ai.onnx.ml ArrayFeatureExtractor (1): ``X[..., Y]`` over the last axis,
    output ``X.shape[:-1] + [Y.size]`` (``[1, Y.size]`` for a 1-D ``X``)."""
    x = np.asarray(X)
    idx = np.asarray(Y, dtype=np.int64).reshape(-1)
    last = x.shape[-1] if x.ndim else 0
    if idx.size and (idx.min() < 0 or idx.max() >= last):
        raise IndexError(f"indices {idx.tolist()} out of range for a last dim of {last}")
    out = np.take(x, idx, axis=-1)
    return out.reshape(1, idx.size) if x.ndim == 1 else out


@cpu_kernel("Binarizer", since=1, domain=ML)
def Binarizer(X, *, threshold=0.0):
    """ai.onnx.ml Binarizer (1): 1 where ``X > threshold`` else 0, X's dtype."""
    x = np.asarray(X)
    return (x > x.dtype.type(threshold)).astype(x.dtype)


# ---------------------------------------------------------------- LabelEncoder

def _first(a: dict, *names):
    for n in names:
        v = a.get(n)
        if v is not None:
            return n, v
    return None, None


@cpu_kernel("LabelEncoder", since=(1, 2, 4), domain=ML)
class LabelEncoder(Kernel):
    """ai.onnx.ml LabelEncoder (1, 2, 4): map each element through the
    ``keys_*`` -> ``values_*`` table (opset 1: ``classes_strings`` index <->
    string), ``default_*`` when absent; NaN keys match NaN inputs and a repeated
    key keeps its last value. Output shape = input shape, dtype of the values."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        a = node.attrs
        if node.opset < 2:
            require(a.get("classes_strings") is not None, "LabelEncoder-1 needs classes_strings")
            return
        k, _ = _first(a, "keys_tensor", "keys_strings", "keys_int64s", "keys_floats")
        v, _ = _first(a, "values_tensor", "values_strings", "values_int64s", "values_floats")
        require(k is not None and v is not None, "LabelEncoder needs keys_* and values_*")

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        a = node.attrs
        if node.opset < 2:
            self._init_v1(node)
            return
        kname, keys = _first(a, "keys_tensor", "keys_strings", "keys_int64s", "keys_floats")
        vname, values = _first(a, "values_tensor", "values_strings", "values_int64s",
                               "values_floats")
        self.keys = self._as_array(kname, keys)
        self.values = self._as_array(vname, values)
        if len(self.keys) != len(self.values):
            raise ValueError(f"LabelEncoder has {len(self.keys)} keys and {len(self.values)} "
                             f"values")
        vdt = self.values.dtype
        if vname == "values_tensor":
            d = a.get("default_tensor")
            if d is not None:
                default = np.asarray(d).reshape(-1)[0]
            elif vdt == object:
                default = "_Unused"
            elif vdt.kind == "f":
                default = -0.0
            else:
                default = -1
        elif vdt == object:
            default = a.get("default_string", "_Unused")
        elif vdt.kind == "f":
            default = a.get("default_float", -0.0)
        else:
            default = a.get("default_int64", -1)
        self.default = np.asarray(default, dtype=vdt)
        self._sort()

    @staticmethod
    def _as_array(name: str, v) -> np.ndarray:
        if name.endswith("_tensor"):
            return np.asarray(v).reshape(-1)
        if name.endswith("_strings"):
            out = np.empty(len(v), dtype=object)
            out[:] = list(v)
            return out
        return np.asarray(v, dtype=np.int64 if name.endswith("_int64s") else np.float32)

    def _init_v1(self, node: NodeSpec) -> None:
        a = node.attrs
        classes = self._as_array("classes_strings", a["classes_strings"])
        in_type = node.input_type(0)
        from_strings = in_type.dtype == 8 if in_type is not None and in_type.dtype else None
        if from_strings is None:
            from_strings = "default_int64" in a or "default_string" not in a
        if from_strings:
            self.keys, self.values = classes, np.arange(len(classes), dtype=np.int64)
            self.default = np.asarray(a.get("default_int64", -1), np.int64)
        else:
            self.keys, self.values = np.arange(len(classes), dtype=np.int64), classes
            self.default = np.asarray(a.get("default_string", "_Unused"), object)
        self._sort()

    def _sort(self) -> None:
        order = np.argsort(self.keys, kind="stable")
        self.sorted_keys = self.keys[order]
        self.sorted_values = self.values[order]
        nan_value = None
        if self.keys.dtype.kind == "f":
            nan = np.isnan(self.keys)
            if nan.any():
                nan_value = self.values[np.nonzero(nan)[0][-1]]
                keep = ~np.isnan(self.sorted_keys)
                self.sorted_keys = self.sorted_keys[keep]
                self.sorted_values = self.sorted_values[keep]
        self.nan_value = nan_value

    def run(self, X):
        x = np.asarray(X)
        if self.sorted_keys.dtype == object:
            x = x.astype(object)
        elif x.dtype == object or x.dtype.kind != self.sorted_keys.dtype.kind:
            raise TypeError(f"LabelEncoder input is {x.dtype}, its keys are "
                            f"{self.sorted_keys.dtype}")
        out = np.full(x.shape, self.default, dtype=self.values.dtype)
        if self.sorted_keys.size:
            pos = np.searchsorted(self.sorted_keys, x, side="right") - 1
            posc = np.maximum(pos, 0)
            hit = (pos >= 0) & (self.sorted_keys[posc] == x)
            out[hit] = self.sorted_values[posc[hit]]
        if self.nan_value is not None:
            out[np.isnan(x)] = self.nan_value
        return out


# ---------------------------------------------------------------- trees

@cpu_kernel("TreeEnsemble", since=5, domain=ML)
class TreeEnsemble(Kernel):
    """ai.onnx.ml TreeEnsemble (5): X ``(N, F)`` float/double/float16 -> Y
    ``(N, n_targets)`` of X's dtype; leaves' weights aggregated per target
    (AVERAGE/SUM/MIN/MAX; targets no leaf reaches hold the dtype's max/min
    under MIN/MAX) then ``post_transform``."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        a = node.attrs
        for name in ("nodes_splits", "nodes_featureids", "nodes_modes", "nodes_truenodeids",
                     "nodes_falsenodeids", "nodes_trueleafs", "nodes_falseleafs",
                     "leaf_targetids", "leaf_weights", "tree_roots"):
            require(a.get(name) is not None, "TreeEnsemble needs attribute %s", name)

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        a = node.attrs
        self.forest = forest_from_v5(a)
        self.n_targets = int(a.get("n_targets") or (int(self.forest.entry_target.max(
            initial=-1)) + 1))
        self.aggregate = int(a.get("aggregate_function", SUM))
        self.post = int(a.get("post_transform", 0))

    def run(self, X):
        x = np.asarray(X)
        if x.ndim != 2:
            raise ValueError(f"TreeEnsemble input must be (N, F), got {list(x.shape)}")
        info = np.finfo(x.dtype)
        empty = info.max if self.aggregate == 2 else info.min
        scores, _ = self.forest.aggregate(x, self.n_targets, self.aggregate, empty_value=empty)
        return post_transform(scores, self.post).astype(x.dtype)


def _floats(a: dict, name: str):
    v = a.get(name + "_as_tensor")
    return a.get(name) if v is None else np.asarray(v).reshape(-1)


def _feature_rows(X, op: str) -> np.ndarray:
    """X as (N, F) rows (a 1-D X is one row).

    Raises:
        ValueError: X is neither (F,) nor (N, F).
    """
    x = np.asarray(X)
    x = x.reshape(1, -1) if x.ndim == 1 else x
    if x.ndim != 2:
        raise ValueError(f"{op} input must be (N, F), got {list(x.shape)}")
    return x


@cpu_kernel("TreeEnsembleRegressor", since=(1, 3, 5), domain=ML)
class TreeEnsembleRegressor(Kernel):
    """ai.onnx.ml TreeEnsembleRegressor (1, 3, 5): X ``(N, F)`` -> float32
    ``(N, n_targets)``: per-target SUM/AVERAGE/MIN/MAX of the reached leaves'
    ``target_weights`` plus ``base_values``, then ``post_transform``."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        a = node.attrs
        for name in ("nodes_treeids", "nodes_nodeids", "nodes_modes", "nodes_featureids",
                     "target_ids", "target_nodeids", "target_treeids"):
            require(a.get(name) is not None, "TreeEnsembleRegressor needs attribute %s", name)
        require(a.get("aggregate_function", "SUM") in AGGREGATE_NAMES,
                "unknown aggregate_function %r", a.get("aggregate_function"))
        require(a.get("post_transform", "NONE") in POST_NAMES,
                "unknown post_transform %r", a.get("post_transform"))

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        a = node.attrs
        self.forest = forest_from_classic(a, "target")
        self.n_targets = int(a.get("n_targets") or (int(self.forest.entry_target.max(
            initial=-1)) + 1))
        base = _floats(a, "base_values")
        self.base = (np.zeros(self.n_targets) if base is None or not len(base)
                     else np.asarray(base, np.float64))
        self.aggregate = AGGREGATE_NAMES[a.get("aggregate_function", "SUM")]
        self.post = POST_NAMES[a.get("post_transform", "NONE")]

    def run(self, X):
        x = _feature_rows(X, "TreeEnsembleRegressor")
        scores, _ = self.forest.aggregate(x, self.n_targets, self.aggregate)
        return post_transform(scores + self.base, self.post).astype(np.float32)


@cpu_kernel("TreeEnsembleClassifier", since=(1, 3, 5), domain=ML)
class TreeEnsembleClassifier(Kernel):
    """ai.onnx.ml TreeEnsembleClassifier (1, 3, 5) with three or more classes:
    X ``(N, F)`` -> label ``(N,)`` (int64 or string, the best-scoring class) and
    float32 scores ``(N, classes)`` (summed ``class_weights`` plus
    ``base_values``, then ``post_transform``). Binary ensembles, whose score
    layout onnxruntime special-cases, are declined."""

    multi_output = True

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        a = node.attrs
        for name in ("nodes_treeids", "nodes_nodeids", "nodes_modes", "nodes_featureids",
                     "class_ids", "class_nodeids", "class_treeids"):
            require(a.get(name) is not None, "TreeEnsembleClassifier needs attribute %s", name)
        labels = a.get("classlabels_int64s")
        labels = a.get("classlabels_strings") if labels is None else labels
        require(labels is not None, "TreeEnsembleClassifier needs classlabels_*")
        if len(labels) < 3:
            deny("TreeEnsembleClassifier with %d classes (binary scoring) is not supported",
                 len(labels))
        require(a.get("post_transform", "NONE") in POST_NAMES,
                "unknown post_transform %r", a.get("post_transform"))

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        a = node.attrs
        self.forest = forest_from_classic(a, "class")
        if a.get("classlabels_int64s") is not None:
            self.labels = np.asarray(a["classlabels_int64s"], np.int64)
        else:
            self.labels = np.empty(len(a["classlabels_strings"]), object)
            self.labels[:] = list(a["classlabels_strings"])
        base = _floats(a, "base_values")
        self.base = None if base is None or not len(base) else np.asarray(base, np.float64)
        self.post = POST_NAMES[a.get("post_transform", "NONE")]

    def run(self, X):
        x = _feature_rows(X, "TreeEnsembleClassifier")
        scores, hit = self.forest.aggregate(x, len(self.labels), SUM)
        if self.base is not None:
            scores = scores + self.base
            hit = np.ones_like(hit)
        best = np.argmax(np.where(hit, scores, -np.inf), axis=1)
        return self.labels[best], post_transform(scores, self.post).astype(np.float32)
