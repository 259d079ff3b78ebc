"""A vectorised tree-ensemble evaluator shared by the ai.onnx.ml tree kernels.

Every tree format is first converted to one flat node table: node ``i`` has a
comparison ``mode[i]`` (``LEAF`` for leaves), ``feature[i]``, ``split[i]``,
children ``true_child[i]`` / ``false_child[i]`` and ``missing_true[i]``; a
leaf's contributions are the ``(target, weight)`` pairs
``entries[entry_start[i]:entry_start[i] + entry_count[i]]``. Evaluation moves
every (sample, tree) pair one level down per step, so the Python loop runs
once per tree level, never per sample.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = 0, 1, 2, 3, 4, 5, 6, -1

MODE_NAMES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT,
              "BRANCH_EQ": EQ, "BRANCH_NEQ": NEQ, "BRANCH_MEMBER": MEMBER, "LEAF": LEAF}

AVERAGE, SUM, MIN, MAX = 0, 1, 2, 3
AGGREGATE_NAMES = {"AVERAGE": AVERAGE, "SUM": SUM, "MIN": MIN, "MAX": MAX}

POST_NAMES = {"NONE": 0, "SOFTMAX": 1, "LOGISTIC": 2, "SOFTMAX_ZERO": 3, "PROBIT": 4}


@attrs.define
class Forest:
    """A flat node table (see the module docstring). ``members`` maps a MEMBER
    node to the sorted values of its set."""

    mode: np.ndarray
    feature: np.ndarray
    split: np.ndarray
    true_child: np.ndarray
    false_child: np.ndarray
    missing_true: np.ndarray
    roots: np.ndarray
    entry_start: np.ndarray
    entry_count: np.ndarray
    entry_target: np.ndarray
    entry_weight: np.ndarray
    members: dict[int, np.ndarray] = attrs.Factory(dict)

    def leaves(self, X: np.ndarray) -> np.ndarray:
        """Leaf node index reached by each sample in each tree: ``(N, trees)``.

        Raises:
            ValueError: a node reads a feature ``X`` does not have.
        """
        X = np.asarray(X)
        n = X.shape[0]
        cur = np.broadcast_to(self.roots, (n, len(self.roots))).copy()
        rows = np.broadcast_to(np.arange(n)[:, None], cur.shape)
        if self.feature.size and X.shape[1] <= int(self.feature.max(initial=-1)):
            raise ValueError(f"the trees read feature {int(self.feature.max())} but X has "
                             f"{X.shape[1]} features")
        for _ in range(len(self.mode) + 1):
            active = self.mode[cur] != LEAF
            if not active.any():
                return cur
            idx = cur[active]
            xv = X[rows[active], self.feature[idx]].astype(np.float64)
            cond = self._compare(self.mode[idx], xv, self.split[idx], idx)
            cond |= self.missing_true[idx] & np.isnan(xv)
            cur[active] = np.where(cond, self.true_child[idx], self.false_child[idx])
        raise ValueError("the tree ensemble has a cycle")

    def _compare(self, mode, x, split, idx) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            out = np.select([mode == LEQ, mode == LT, mode == GTE, mode == GT, mode == EQ,
                             mode == NEQ],
                            [x <= split, x < split, x >= split, x > split, x == split,
                             x != split], False)
        if self.members:
            is_member = mode == MEMBER
            for node in np.unique(idx[is_member]):
                sel = idx == node
                out[sel] = np.isin(x[sel], self.members[int(node)])
        return out

    def aggregate(self, X: np.ndarray, n_targets: int, aggregate: int, *,
                  empty_value: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Per-sample, per-target aggregate of the reached leaves' weights,
        float64 ``(N, n_targets)``, and whether any leaf contributed (bool, same
        shape). Targets no leaf contributes to hold ``empty_value`` under
        MIN/MAX, 0 otherwise.

        Raises:
            ValueError: a leaf names a target ``>= n_targets``.
        """
        leaf = self.leaves(X)
        n, trees = leaf.shape
        counts = self.entry_count[leaf].reshape(-1)
        starts = self.entry_start[leaf].reshape(-1)
        sample = np.repeat(np.repeat(np.arange(n), trees), counts)
        offs = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        entry = np.repeat(starts, counts) + offs
        target = self.entry_target[entry]
        weight = self.entry_weight[entry].astype(np.float64)
        if target.size and (target.max() >= n_targets or target.min() < 0):
            raise ValueError(f"a leaf names target {int(target.max())}, n_targets is "
                             f"{n_targets}")
        hit = np.zeros((n, n_targets), bool)
        hit[sample, target] = True
        if aggregate in (SUM, AVERAGE):
            out = np.zeros((n, n_targets), np.float64)
            np.add.at(out, (sample, target), weight)
            if aggregate == AVERAGE and trees:
                out /= trees
            return out, hit
        if aggregate not in (MIN, MAX):
            raise ValueError(f"unknown aggregate_function {aggregate}")
        ufunc = np.minimum if aggregate == MIN else np.maximum
        out = np.full((n, n_targets), np.inf if aggregate == MIN else -np.inf)
        ufunc.at(out, (sample, target), weight)
        return np.where(hit, out, empty_value), hit


def _erfinv(x: np.ndarray) -> np.ndarray:
    """The closed-form inverse-erf approximation onnxruntime's PROBIT uses."""
    sgn = np.where(x < 0, -1.0, 1.0)
    t = (1 - x) * (1 + x)
    with np.errstate(divide="ignore"):
        lg = np.log(t)
    v = 2 / (math.pi * 0.147) + 0.5 * lg
    v2 = 1 / 0.147 * lg
    return sgn * np.sqrt(-v + np.sqrt(v * v - v2))


def post_transform(scores: np.ndarray, kind: int) -> np.ndarray:
    """Apply an ai.onnx.ml post transform (NONE, SOFTMAX, LOGISTIC,
    SOFTMAX_ZERO, PROBIT) to ``(N, targets)`` float64 scores.

    Raises:
        ValueError: an unknown transform.
    """
    if kind == 0:
        return scores
    if kind == 1:
        e = np.exp(scores - scores.max(axis=1, keepdims=True, initial=-np.inf))
        return e / e.sum(axis=1, keepdims=True)
    if kind == 2:
        return 1.0 / (1.0 + np.exp(-scores))
    if kind == 3:
        nz = scores != 0
        m = np.where(nz, scores, -np.inf).max(axis=1, keepdims=True, initial=-np.inf)
        e = np.where(nz, np.exp(scores - np.where(np.isinf(m), 0, m)), 0.0)
        s = e.sum(axis=1, keepdims=True)
        return np.divide(e, s, out=np.zeros_like(e), where=s > 0)
    if kind == 4:
        return math.sqrt(2) * _erfinv(2 * scores - 1)
    raise ValueError(f"unknown post_transform {kind}")


def forest_from_v5(a: dict) -> Forest:
    """A :class:`Forest` from ai.onnx.ml TreeEnsemble (opset 5) attributes."""
    modes = np.asarray(a["nodes_modes"]).reshape(-1).astype(np.int64)
    n = len(modes)
    n_leaves = len(a["leaf_weights"])
    true_ids = np.asarray(a["nodes_truenodeids"], np.int64)
    false_ids = np.asarray(a["nodes_falsenodeids"], np.int64)
    true_leaf = np.asarray(a["nodes_trueleafs"], bool)
    false_leaf = np.asarray(a["nodes_falseleafs"], bool)
    missing = a.get("nodes_missing_value_tracks_true")
    missing = np.zeros(n, bool) if missing is None or not len(missing) else np.asarray(
        missing, bool)
    members: dict[int, np.ndarray] = {}
    member_nodes = np.nonzero(modes == MEMBER)[0]
    if member_nodes.size:
        mv = a.get("membership_values")
        if mv is None:
            raise ValueError("set-membership nodes need membership_values")
        vals = np.asarray(mv, np.float64).reshape(-1)
        cuts = np.nonzero(np.isnan(vals))[0]
        if len(cuts) != len(member_nodes):
            raise ValueError("membership_values must hold one NaN-terminated set per "
                             "set-membership node")
        groups = np.split(vals, cuts + 1)[:len(cuts)]
        for node, g in zip(member_nodes, groups):
            members[int(node)] = np.sort(g[:-1])
    leaf_mode = np.full(n_leaves, LEAF, np.int64)
    zeros = np.zeros(n_leaves, np.int64)
    return Forest(
        mode=np.concatenate([modes, leaf_mode]),
        feature=np.concatenate([np.asarray(a["nodes_featureids"], np.int64), zeros]),
        split=np.concatenate([np.asarray(a["nodes_splits"], np.float64).reshape(-1),
                              np.zeros(n_leaves)]),
        true_child=np.concatenate([np.where(true_leaf, true_ids + n, true_ids), zeros]),
        false_child=np.concatenate([np.where(false_leaf, false_ids + n, false_ids), zeros]),
        missing_true=np.concatenate([missing, np.zeros(n_leaves, bool)]),
        roots=np.asarray(a["tree_roots"], np.int64),
        entry_start=np.concatenate([np.zeros(n, np.int64), np.arange(n_leaves)]),
        entry_count=np.concatenate([np.zeros(n, np.int64), np.ones(n_leaves, np.int64)]),
        entry_target=np.asarray(a["leaf_targetids"], np.int64),
        entry_weight=np.asarray(a["leaf_weights"], np.float64).reshape(-1),
        members=members)


def forest_from_classic(a: dict, prefix: str) -> Forest:
    """A :class:`Forest` from TreeEnsembleRegressor / TreeEnsembleClassifier
    attributes; ``prefix`` is ``"target"`` or ``"class"`` (leaf entries
    ``<prefix>_treeids/_nodeids/_ids/_weights``).

    Raises:
        ValueError: a child or leaf entry names a node that does not exist.
    """
    tree = np.asarray(a["nodes_treeids"], np.int64)
    node = np.asarray(a["nodes_nodeids"], np.int64)
    n = len(tree)
    modes = np.array([MODE_NAMES[m] for m in a["nodes_modes"]], np.int64)
    values = a.get("nodes_values_as_tensor")
    values = a.get("nodes_values") if values is None else values
    split = np.zeros(n) if values is None else np.asarray(values, np.float64).reshape(-1)
    # (tree, node) -> flat index
    key = tree * (int(node.max(initial=0)) + 1) + node
    order = np.argsort(key, kind="stable")
    skey = key[order]
    width = int(node.max(initial=0)) + 1

    def lookup(t, nid, what):
        k = np.asarray(t, np.int64) * width + np.asarray(nid, np.int64)
        pos = np.minimum(np.searchsorted(skey, k), max(n - 1, 0))
        if n == 0 or (skey[pos] != k).any():
            raise ValueError(f"{what} names a node that is not in the ensemble")
        return order[pos]

    internal = modes != LEAF
    true_child = np.zeros(n, np.int64)
    false_child = np.zeros(n, np.int64)
    true_child[internal] = lookup(tree[internal], np.asarray(a["nodes_truenodeids"])[internal],
                                  "nodes_truenodeids")
    false_child[internal] = lookup(tree[internal],
                                   np.asarray(a["nodes_falsenodeids"])[internal],
                                   "nodes_falsenodeids")
    missing = a.get("nodes_missing_value_tracks_true")
    missing = np.zeros(n, bool) if missing is None or not len(missing) else np.asarray(
        missing, bool)
    # roots: nodes no other node points to, one per tree in tree-id order
    pointed = np.zeros(n, bool)
    pointed[true_child[internal]] = True
    pointed[false_child[internal]] = True
    root_idx = np.nonzero(~pointed)[0]
    root_idx = root_idx[np.argsort(tree[root_idx], kind="stable")]
    # leaf entries grouped by leaf node
    weights = a.get(f"{prefix}_weights_as_tensor")
    weights = a.get(f"{prefix}_weights") if weights is None else weights
    e_node = lookup(a[f"{prefix}_treeids"], a[f"{prefix}_nodeids"], f"{prefix}_nodeids") \
        if len(a.get(f"{prefix}_treeids") or []) else np.zeros(0, np.int64)
    e_order = np.argsort(e_node, kind="stable")
    e_node = e_node[e_order]
    counts = np.bincount(e_node, minlength=n).astype(np.int64)
    return Forest(
        mode=modes, feature=np.asarray(a["nodes_featureids"], np.int64), split=split,
        true_child=true_child, false_child=false_child, missing_true=missing,
        roots=root_idx, entry_start=np.cumsum(counts) - counts, entry_count=counts,
        entry_target=np.asarray(a[f"{prefix}_ids"], np.int64)[e_order],
        entry_weight=np.asarray(weights, np.float64).reshape(-1)[e_order])
