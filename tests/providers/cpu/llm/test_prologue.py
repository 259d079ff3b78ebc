"""Input-prologue fusions (actorrt.providers.cpu.llm._prologue): attention-mask
lengths and the block-quantized embedding.

Oracles: the ONNX reference evaluator on the same graph, and the same graph
run node by node (``fuse_kernels=False``) for errors.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from actorrt import InvalidArgumentError, KernelError, SessionOptions, open_session
from actorrt.providers.cpu.llm import _prologue

V, NB, BS, HIDDEN = 40, 3, 8, 24


def prologue_model(*, dtype=np.uint8, ids_type=TP.INT64, target=(0, 0, -1), index=(1,),
                   zero=128.0, extra_outputs=(), seed=0) -> onnx.ModelProto:
    """The prologue actorrt.genai's builder emits: mask -> (seqlens_k,
    total_sequence_length), ids -> dequantized embedding rows."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    table = rng.integers(info.min, info.max + 1, (V, NB, BS)).astype(dtype)
    scales = (rng.random(V * NB) * 0.1 + 0.01).astype(np.float32)
    inits = [
        nh.from_array(table, "table"), nh.from_array(scales, "scales_flat"),
        nh.from_array(np.array([V, NB], np.int64), "scales_shape"),
        nh.from_array(np.array([zero], np.float32), "zero"),
        nh.from_array(np.array([-1], np.int64), "axis_last"),
        nh.from_array(np.array(target, np.int64), "target"),
        nh.from_array(np.array([1], np.int64), "axis1"),
        nh.from_array(np.array([1], np.int64), "one"),
        nh.from_array(np.array(1, np.int64).reshape(index), "idx1"),
    ]
    nodes = [
        oh.make_node("ReduceSum", ["attention_mask", "axis1"], ["rs"], keepdims=0, name="m/rs"),
        oh.make_node("Sub", ["rs", "one"], ["sub"], name="m/sub"),
        oh.make_node("Cast", ["sub"], ["seqlens_k"], to=TP.INT32, name="m/cast"),
        oh.make_node("Shape", ["attention_mask"], ["shape"], name="m/shape"),
        oh.make_node("Gather", ["shape", "idx1"], ["tot"], axis=0, name="m/gather"),
        oh.make_node("Cast", ["tot"], ["total_sequence_length"], to=TP.INT32, name="m/cast2"),
        oh.make_node("Reshape", ["scales_flat", "scales_shape"], ["scales"], name="e/rs"),
        oh.make_node("Gather", ["table", "input_ids"], ["gq"], name="e/gather_q"),
        oh.make_node("Cast", ["gq"], ["cq"], to=TP.FLOAT, name="e/cast"),
        oh.make_node("Sub", ["cq", "zero"], ["zq"], name="e/sub"),
        oh.make_node("Gather", ["scales", "input_ids"], ["gs"], name="e/gather_s"),
        oh.make_node("Unsqueeze", ["gs", "axis_last"], ["us"], name="e/unsqueeze"),
        oh.make_node("Mul", ["zq", "us"], ["mul"], name="e/mul"),
        oh.make_node("Reshape", ["mul", "target"], ["embeds"], name="e/reshape"),
    ]
    outputs = [oh.make_tensor_value_info("seqlens_k", TP.INT32, None),
               oh.make_tensor_value_info("total_sequence_length", TP.INT32, None),
               oh.make_tensor_value_info("embeds", TP.FLOAT, None)]
    outputs += [oh.make_tensor_value_info(n, TP.UNDEFINED, None) for n in extra_outputs]
    graph = oh.make_graph(
        nodes, "prologue",
        [oh.make_tensor_value_info("input_ids", ids_type, ["batch", "seq"]),
         oh.make_tensor_value_info("attention_mask", TP.INT64, ["batch", "total"])],
        outputs, initializer=inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)])


async def run(model, feeds, **options):
    async with open_session(model, options=SessionOptions(**options)) as sess:
        out = await sess.run(None, feeds)
        return out, [f[0] for f in sess.plan.fusions], [s.node.op_type for s in sess.plan.steps]


async def run_error(model, feeds, errors, **options):
    """The error a run raises (caught inside the session)."""
    async with open_session(model, options=SessionOptions(**options)) as sess:
        with pytest.raises(errors) as info:
            await sess.run(None, feeds)
        return info.value


def feeds_of(ids, lengths, total):
    mask = np.zeros((len(lengths), total), np.int64)
    for b, n in enumerate(lengths):
        mask[b, total - n:] = 1  # left padding, as a batch of different lengths has
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("ids_type", [TP.INT64, TP.INT32])
async def test_fused_prologue_matches_the_reference(dtype, ids_type):
    model = prologue_model(dtype=dtype, ids_type=ids_type, zero=128.0 if dtype == np.uint8
                           else 0.0)
    ids = np.array([[3, 39, 0], [-1, 7, -40]], onnx.helper.tensor_dtype_to_np_dtype(ids_type))
    feeds = feeds_of(ids, (5, 3), 6)
    got, fusions, ops = await run(model, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    assert ops == [_prologue.MASK_OP, _prologue.GATHER_OP]
    assert fusions == ["m/MaskLengths", "e/QuantizedGather"]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)  # same float32 steps: bit for bit
    assert got[0].tolist() == [4, 2] and got[1].tolist() == [6]  # the spec, by hand


@pytest.mark.parametrize("target", [(2, 3, HIDDEN), (-1, HIDDEN), (0, -1), (6, 1, 4, 6)])
@pytest.mark.parametrize("index", [(1,), ()])
async def test_reshape_targets_and_scalar_index(target, index):
    model = prologue_model(target=target, index=index)
    feeds = feeds_of(np.array([[1, 2, 3], [4, 5, 6]], np.int64), (2, 6), 6)
    got, fusions, _ = await run(model, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    assert len(fusions) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


async def test_out_of_range_id_raises_the_gathers_error():
    model = prologue_model()
    feeds = feeds_of(np.array([[1, V]], np.int64), (2,), 2)
    fused = await run_error(model, feeds, KernelError)
    plain = await run_error(model, feeds, KernelError, fuse_kernels=False)
    assert fused.node == plain.node == "e/gather_q"
    assert "out of range" in str(fused) and "out of range" in str(plain)


async def test_a_target_the_reshape_rejects_raises_its_error():
    model = prologue_model(target=(5, -1))  # 2 * 3 * 24 values: not a multiple of 5
    feeds = feeds_of(np.array([[1, 2, 3], [4, 5, 6]], np.int64), (2, 6), 6)
    errors = (KernelError, InvalidArgumentError)
    fused = await run_error(model, feeds, errors)
    plain = await run_error(model, feeds, errors, fuse_kernels=False)
    assert type(fused) is type(plain)
    assert fused.node == plain.node == "e/reshape"


async def test_an_intermediate_read_outside_is_not_fused():
    model = prologue_model(extra_outputs=("gs", "rs"))
    feeds = feeds_of(np.array([[1, 2]], np.int64), (2,), 2)
    got, fusions, ops = await run(model, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    assert fusions == []
    assert "ReduceSum" in ops and "Unsqueeze" in ops
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


async def test_unfused_option_keeps_the_nodes():
    model = prologue_model()
    feeds = feeds_of(np.array([[1, 2]], np.int64), (2,), 2)
    got, fusions, ops = await run(model, feeds, fuse_kernels=False)
    assert fusions == [] and len(ops) == 13  # the scales Reshape folds into a constant
    fused, _, _ = await run(model, feeds)
    for g, w in zip(got, fused):
        np.testing.assert_array_equal(g, w)


def test_numpy_path_matches_the_compiled_one(monkeypatch):
    """Without numba the fused gather runs in numpy: same values."""
    rng = np.random.default_rng(1)
    table = rng.integers(0, 256, (V, NB, BS)).astype(np.uint8)
    scales = rng.random((V, NB)).astype(np.float32)
    ids = np.array([[0, 5, -1, 39]], np.int64)
    outs = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(_prologue._nb, "HAVE_NUMBA", False)
        k = _prologue.QuantizedGather(_node(), [], {}, (0,), (1,), table, scales, 128.0,
                                      (0, 0, -1))
        outs.append(k.compile()(ids))
    want = ((table[ids].astype(np.float32) - np.float32(128)) * scales[ids][..., None]
            ).reshape(1, 4, NB * BS)
    for got in outs:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("index_shape", [(1,), ()])
def test_mask_lengths_numpy_path_matches_the_compiled_one(monkeypatch, index_shape):
    """The fused mask lengths with and without numba: ReduceSum (int64), Sub,
    Cast to int32 as ONNX defines them (numpy's wrapping cast), also for
    sums past the int32 range and a (B, 0) mask."""
    masks = [np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int64),
             np.array([[1 << 31, 1 << 31, 5]], np.int64),
             np.zeros((2, 0), np.int64)]
    for mask in masks:
        outs = []
        for compiled in (True, False):
            if not compiled:
                monkeypatch.setattr(_prologue._nb, "HAVE_NUMBA", False)
            k = _prologue.MaskLengths(_node(), [], {}, (0,), (1, 2), index_shape)
            outs.append(k.compile()(mask))
        monkeypatch.undo()
        want_seq = (mask.sum(axis=1) - 1).astype(np.int32)
        want_tot = np.full(index_shape, mask.shape[1], np.int64).astype(np.int32)
        for seq, tot in outs:
            assert seq.dtype == np.int32 and tot.dtype == np.int32
            np.testing.assert_array_equal(seq, want_seq)
            assert tot.shape == index_shape
            np.testing.assert_array_equal(tot, want_tot)


def _node():
    from actorrt.providers._contract import NodeSpec
    return NodeSpec(name="e/QuantizedGather", op_type=_prologue.GATHER_OP,
                    domain=_prologue.DOMAIN, opset=1, attrs={}, inputs=("input_ids",),
                    outputs=("embeds",))
