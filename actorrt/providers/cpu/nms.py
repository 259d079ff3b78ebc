"""Greedy non-maximum suppression.

Box corners are computed once per batch; the greedy pass loops once per
*selected* box, comparing it with the surviving candidates in one vectorised
step (no N x N matrix).

Spec: ONNX NonMaxSuppression (opsets 10, 11).
"""

from __future__ import annotations

import numpy as np

from .._contract import KernelSizedOutput
from ._index_util import as_int, as_scalar
from .registry import cpu_kernel

__all__ = ["NonMaxSuppression", "pairwise_iou"]


def _corners(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """``(x_min, y_min, x_max, y_max)`` of ``boxes`` (N, 4)."""
    if center_point_box:
        xc, yc, w, h = boxes[:, 0], boxes[:, 1], boxes[:, 2] / 2, boxes[:, 3] / 2
        return xc - w, yc - h, xc + w, yc + h
    y1, x1, y2, x2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    return np.minimum(x1, x2), np.minimum(y1, y2), np.maximum(x1, x2), np.maximum(y1, y2)


def _iou(corners: tuple[np.ndarray, ...], i, j) -> np.ndarray:
    """IoU of boxes ``i`` and ``j`` (broadcasting index arrays) given their
    corners; 0 where they do not overlap or either has no area."""
    x0, y0, x1, y1 = corners
    iw = np.minimum(x1[i], x1[j]) - np.maximum(x0[i], x0[j])
    ih = np.minimum(y1[i], y1[j]) - np.maximum(y0[i], y0[j])
    inter = iw * ih
    a_i = (x1[i] - x0[i]) * (y1[i] - y0[i])
    a_j = (x1[j] - x0[j]) * (y1[j] - y0[j])
    union = a_i + a_j - inter
    valid = (iw > 0) & (ih > 0) & (inter > 0) & (a_i > 0) & (a_j > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(valid, inter / np.where(valid, union, 1), 0).astype(x0.dtype, copy=False)


def pairwise_iou(boxes: np.ndarray, center_point_box: int = 0) -> np.ndarray:
    """IoU of every pair of ``boxes`` (N, 4) as an (N, N) matrix in the boxes'
    dtype; 0 where the boxes do not overlap or either has no area."""
    n = np.arange(boxes.shape[0])
    return _iou(_corners(boxes, center_point_box), n[:, None], n[None, :])


def _select(scores: np.ndarray, corners: tuple[np.ndarray, ...], limit: int, iou_threshold,
            score_threshold) -> list[int]:
    """Greedy selection for one (batch, class): box indices in selection order.
    Each kept box is compared with the still-alive candidates only (O(N) memory)."""
    cand = np.arange(scores.shape[0])
    if score_threshold is not None:
        cand = cand[scores > score_threshold]
    # higher score first, equal scores: lower box index first
    order = cand[np.argsort(-scores[cand].astype(np.float64), kind="stable")]
    picked: list[int] = []
    while order.size and len(picked) < limit:
        box = int(order[0])
        picked.append(box)
        rest = order[1:]
        order = rest[~(_iou(corners, box, rest) > iou_threshold)]
    return picked


@cpu_kernel("NonMaxSuppression", since=(10, 11), kernel_sized_outputs=True,
            flops=lambda node: 0.0)
def NonMaxSuppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                      score_threshold=None, *, center_point_box=0):
    """ONNX NonMaxSuppression (opsets 10, 11): greedy per-(batch, class) selection
    of boxes (batch, N, 4) by scores (batch, classes, N); boxes whose IoU with a
    kept box exceeds ``iou_threshold`` are dropped, scores must exceed
    ``score_threshold``. Output int64 (num_selected, 3) rows
    ``[batch, class, box]``."""
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise ValueError(f"NonMaxSuppression: boxes {boxes.shape} must be (batch, N, 4) and "
                         f"scores {scores.shape} (batch, classes, N)")
    nb, nbox = boxes.shape[:2]
    if scores.shape[0] != nb or scores.shape[2] != nbox:
        raise ValueError(f"NonMaxSuppression: scores {scores.shape} do not match boxes "
                         f"{boxes.shape}")
    present = lambda t: t is not None and np.asarray(t).size > 0  # noqa: E731
    limit = max(as_int(max_output_boxes_per_class), 0) if present(max_output_boxes_per_class) \
        else 0
    iou_t = as_scalar(iou_threshold) if present(iou_threshold) else boxes.dtype.type(0)
    score_t = as_scalar(score_threshold) if present(score_threshold) else None
    rows: list[tuple[int, int, int]] = []
    if limit > 0 and nbox > 0:
        for b in range(nb):
            corners = _corners(boxes[b], center_point_box)
            for c in range(scores.shape[1]):
                rows.extend((b, c, i) for i in _select(scores[b, c], corners, limit, iou_t,
                                                        score_t))
    out = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return KernelSizedOutput(data=out.reshape(-1), shape=out.shape, dtype=out.dtype)
