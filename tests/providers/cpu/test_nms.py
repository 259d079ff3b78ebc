"""NonMaxSuppression against the ONNX reference evaluator."""

import numpy as np
import pytest

from tests.oracle import check_node

rng = np.random.default_rng(2)


def _inputs(nb=2, nc=3, n=20, center=0, score_threshold=True):
    xy = rng.uniform(0, 10, (nb, n, 2)).astype(np.float32)
    wh = rng.uniform(0.5, 4, (nb, n, 2)).astype(np.float32)
    boxes = np.concatenate([xy, wh], -1) if center else np.concatenate([xy, xy + wh], -1)
    scores = rng.uniform(0, 1, (nb, nc, n)).astype(np.float32)
    scores[0, 0, :4] = 0.5  # ties
    feeds = {"b": boxes, "s": scores, "m": np.array([5], np.int64),
             "i": np.array([0.3], np.float32)}
    if score_threshold:
        feeds["t"] = np.array([0.2], np.float32)
    return feeds


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("thr", [True, False])
def test_nms_random(center, thr):
    check_node("NonMaxSuppression", _inputs(center=center, score_threshold=thr),
               center_point_box=center)


def test_nms_no_limit_selects_nothing():
    feeds = _inputs()
    feeds["m"] = np.array([0], np.int64)
    check_node("NonMaxSuppression", feeds)


def test_nms_identical_boxes():
    boxes = np.tile(np.array([[0, 0, 1, 1]], np.float32), (1, 6, 1))
    scores = np.full((1, 1, 6), 0.9, np.float32)
    check_node("NonMaxSuppression", {"b": boxes, "s": scores, "m": np.array([3], np.int64),
                                     "i": np.array([0.5], np.float32)})


def test_nms_many_boxes_uses_no_quadratic_memory():
    feeds = _inputs(nb=1, nc=2, n=3000)
    feeds["m"] = np.array([50], np.int64)
    check_node("NonMaxSuppression", feeds)
