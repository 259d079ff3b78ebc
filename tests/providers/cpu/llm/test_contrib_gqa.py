"""com.microsoft GroupQueryAttention against onnxruntime (CPU)."""

import numpy as np
import pytest
from onnx import helper

from actorrt.providers.cpu.llm import _contrib_numba as nbk
from tests.oracle import assert_close, run_actorrt, run_onnxruntime

NAMES = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
         "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink"]


@pytest.fixture(autouse=True, params=["fused", "numpy"])
def kernel_path(request, monkeypatch):
    """Every case runs on both kernels: the numba one (rotary, append and
    attention fused) and the numpy one."""
    if request.param == "fused" and not nbk.HAVE_NUMBA:
        pytest.skip("numba not installed")
    if request.param == "numpy":
        monkeypatch.setattr(nbk, "HAVE_NUMBA", False)
    return request.param


def gqa_model(feeds, **attrs):
    names = [n if feeds.get(n) is not None else "" for n in NAMES]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain="com.microsoft", **attrs)
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in feeds.items() if v is not None]
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output]
    g = helper.make_graph([node], "gqa", ins, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                               helper.make_opsetid("com.microsoft", 1)])


def case(rng, *, b=1, s=1, past=0, seqlens, total, h=4, kvh=2, d=16, packed=False, rotary=False,
         max_pos=64, rot_dim=None, pos_ids=False, bias=False, sink=False, dtype=np.float32):
    f = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    feeds = {}
    if packed:
        feeds["query"] = f(b, s, (h + 2 * kvh) * d)
    else:
        feeds.update(query=f(b, s, h * d), key=f(b, s, kvh * d), value=f(b, s, kvh * d))
    feeds["past_key"] = f(b, kvh, past, d)
    feeds["past_value"] = f(b, kvh, past, d)
    feeds["seqlens_k"] = np.asarray(seqlens, np.int32)
    feeds["total_sequence_length"] = np.asarray(total, np.int32)
    if rotary:
        ang = rng.random((max_pos, (rot_dim or d) // 2)) * 6
        feeds["cos_cache"] = np.cos(ang).astype(dtype)
        feeds["sin_cache"] = np.sin(ang).astype(dtype)
    if pos_ids:
        start = np.asarray(seqlens) + 1 - s
        feeds["position_ids"] = (np.maximum(start, 0)[:, None] + np.arange(s)).astype(np.int64)
    if bias:
        feeds["attention_bias"] = f(b, 1, s, total)
    if sink:
        feeds["head_sink"] = f(h)
    return feeds


def check(feeds, *, valid_rows=None, rtol=1e-4, atol=1e-5, **attrs):
    attrs.setdefault("num_heads", 4)
    attrs.setdefault("kv_num_heads", 2)
    m = gqa_model(feeds, **attrs)
    feeds = {k: v for k, v in feeds.items() if v is not None}
    want = run_onnxruntime(m, feeds)
    got = run_actorrt(m, feeds)
    if valid_rows is not None:  # padded query rows are unspecified
        for out in (got, want):
            for bi, n in enumerate(valid_rows):
                out[0][bi, n:] = 0
    assert_close(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("rotary", [False, True])
def test_prefill_then_decode(packed, rotary):
    rng = np.random.default_rng(0)
    kw = dict(packed=packed, rotary=rotary)
    check(case(rng, s=5, seqlens=[4], total=5, **kw), do_rotary=int(rotary))
    check(case(rng, s=1, past=5, seqlens=[5], total=6, **kw), do_rotary=int(rotary))


def test_decode_shared_buffer():
    rng = np.random.default_rng(1)  # past/present buffer of max length 12
    check(case(rng, b=2, s=1, past=12, seqlens=[6, 3], total=7, rotary=True), do_rotary=1)


def test_batched_prefill_right_padding():
    rng = np.random.default_rng(2)
    # padded rows match onnxruntime too (they attend causally to the padded keys)
    check(case(rng, b=2, s=5, seqlens=[4, 2], total=5, rotary=True), do_rotary=1)
    check(case(rng, b=3, s=4, past=0, seqlens=[3, 0, 1], total=4), local_window_size=2)


def test_single_token_prompt_and_window_decode():
    rng = np.random.default_rng(9)
    check(case(rng, b=2, s=1, seqlens=[0, 0], total=1, rotary=True), do_rotary=1)
    check(case(rng, b=2, s=1, past=16, seqlens=[9, 4], total=10, rotary=True), do_rotary=1,
          local_window_size=3, softcap=3.0)


def test_large_batch_runs_the_parallel_kernel():
    # batch x heads x rows x keys x head size >= GQA_PARALLEL_MIN_WORK
    rng = np.random.default_rng(12)
    assert 8 * 4 * 1 * 128 * 64 >= nbk.GQA_PARALLEL_MIN_WORK  # also > serial-size cases above
    check(case(rng, b=8, s=1, past=128, seqlens=[127, 60, 3, 90, 100, 10, 127, 50], total=128,
               d=64, rotary=True, max_pos=128), do_rotary=1)


def test_batched_decode_different_lengths():
    rng = np.random.default_rng(3)
    check(case(rng, b=2, s=1, past=6, seqlens=[6, 2], total=7, rotary=True), do_rotary=1)


def test_subsequent_prompt():
    rng = np.random.default_rng(4)
    check(case(rng, s=3, past=4, seqlens=[6], total=7, rotary=True), do_rotary=1)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_interleaved_partial_and_position_ids(interleaved):
    rng = np.random.default_rng(5)
    check(case(rng, s=4, seqlens=[3], total=4, rotary=True, d=32, rot_dim=16),
          do_rotary=1, rotary_interleaved=interleaved)
    check(case(rng, s=1, past=3, seqlens=[3], total=4, rotary=True, pos_ids=True),
          do_rotary=1, rotary_interleaved=interleaved)


@pytest.mark.parametrize("attrs", [dict(scale=0.3), dict(softcap=2.0), dict(local_window_size=2),
                                   dict(smooth_softmax=1), dict(num_heads=6, kv_num_heads=3),
                                   dict(num_heads=4, kv_num_heads=4)])
def test_attributes(attrs):
    rng = np.random.default_rng(6)
    h, kvh = attrs.get("num_heads", 4), attrs.get("kv_num_heads", 2)
    check(case(rng, s=6, seqlens=[5], total=6, h=h, kvh=kvh), **attrs)
    check(case(rng, s=1, past=6, seqlens=[6], total=7, h=h, kvh=kvh), **attrs)


def test_attention_bias_and_head_sink():
    rng = np.random.default_rng(7)
    check(case(rng, s=5, seqlens=[4], total=5, bias=True))
    check(case(rng, s=1, past=4, seqlens=[4], total=5, bias=True))
    check(case(rng, s=5, seqlens=[4], total=5, sink=True))
    check(case(rng, s=1, past=4, seqlens=[4], total=5, sink=True))


def test_float16():
    rng = np.random.default_rng(8)
    check(case(rng, s=4, seqlens=[3], total=4, rotary=True, dtype=np.float16), do_rotary=1,
          rtol=2e-2, atol=2e-2)
    check(case(rng, s=1, past=4, seqlens=[4], total=5, dtype=np.float16), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("what", ["seqlens", "positions", "key", "prompt_seqlens",
                                  "negative_seqlens", "total_short", "total_two", "seqlens_count",
                                  "value_missing"])
def test_bad_inputs_raise_kernel_error(what):
    """Both kernels reject inputs that do not fit, naming the node; the fused
    one checks before touching the (possibly donated) cache."""
    import actorrt
    rng = np.random.default_rng(11)
    feeds = case(rng, b=2, s=1, past=4, seqlens=[4, 2], total=5, rotary=True, max_pos=8)
    if what == "seqlens":
        feeds["seqlens_k"] = np.asarray([9, 2], np.int32)  # row 9 outside a length-9 present
        feeds["total_sequence_length"] = np.asarray(9, np.int32)
        feeds["past_key"] = feeds["past_key"][:, :, :3]
        feeds["past_value"] = feeds["past_value"][:, :, :3]
        msg = "do not fit|shorter|out of range"
    elif what == "prompt_seqlens":  # onnxruntime: "seqlens_k[0] = 10 is out of range [0, 4)"
        feeds = case(rng, b=2, s=4, past=0, seqlens=[10, 2], total=4, rotary=True, max_pos=8)
        msg = r"seqlens_k\[0\] = 10 is out of range \[0, 4\)"
    elif what == "negative_seqlens":
        feeds["seqlens_k"] = np.asarray([4, -1], np.int32)
        msg = r"seqlens_k\[1\] = -1 is out of range"
    elif what == "total_short":  # total_sequence_length below the new tokens
        feeds = case(rng, b=1, s=4, past=6, seqlens=[3], total=3, rotary=True, max_pos=16)
        msg = "total_sequence_length 3 is shorter than sequence_length 4"
    elif what == "total_two":
        feeds["total_sequence_length"] = np.asarray([5, 6], np.int32)
        msg = "total_sequence_length must hold one value"
    elif what == "seqlens_count":
        feeds["seqlens_k"] = np.asarray([4, 2, 2], np.int32)
        msg = "seqlens_k has 3 entries for a batch of 2"
    elif what == "value_missing":
        del feeds["value"]
        msg = "key and value must both be given"
    elif what == "positions":  # position 8 >= 8 cos rows
        feeds = case(rng, b=2, s=1, past=8, seqlens=[8, 2], total=9, rotary=True, max_pos=8)
        msg = "exceed cos_cache"
    else:
        feeds["key"] = feeds["key"][:, :, :-1].copy()
        msg = "key|shape|broadcast"
    m = gqa_model(feeds, num_heads=4, kv_num_heads=2, do_rotary=1)
    with pytest.raises(actorrt.KernelError, match=msg):
        run_actorrt(m, feeds)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("b,s,past,seqlens,total", [(1, 1, 8, [5], 6), (2, 1, 8, [5, 2], 6),
                                                    (2, 4, 0, [3, 2], 4), (1, 3, 6, [5], 6)])
def test_compiled_closure_equals_run(kernel_path, b, s, past, seqlens, total, packed):
    """compile()'s hot-path closure (numba path) gives run()'s outputs bit for
    bit, in place on a donated buffer as run() does; the numpy path keeps run."""
    from actorrt.providers import NodeSpec
    from actorrt.providers.cpu.llm._contrib_gqa import GroupQueryAttention
    feeds = case(np.random.default_rng(b * 10 + s), b=b, s=s, past=past, seqlens=seqlens,
                 total=total, rotary=True, packed=packed)
    node = NodeSpec(name="g", op_type="GroupQueryAttention", domain="com.microsoft", opset=1,
                    attrs=dict(num_heads=4, kv_num_heads=2, do_rotary=1),
                    inputs=tuple(NAMES[:9]), outputs=("y", "pk", "pv"))
    kern = GroupQueryAttention(node)
    fell_back, run = [], kern.run
    kern.run = lambda *x: fell_back.append(1) or run(*x)  # what the closure falls back to
    fn = kern.compile()
    assert (fn == kern.run) is (kernel_path == "numpy")
    a = [None if feeds.get(n) is None else feeds[n].copy() for n in NAMES[:9]]
    r = [None if feeds.get(n) is None else feeds[n].copy() for n in NAMES[:9]]
    got, want = fn(*a), run(*r)
    assert fell_back == ([1] if kernel_path == "numpy" else [])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert (got[1] is a[3]) is (want[1] is r[3])
    bad = [None if feeds.get(n) is None else feeds[n].copy() for n in NAMES[:9]]
    bad[5] = np.asarray([total] * b, np.int32)  # seqlens_k must be < total
    with pytest.raises(ValueError, match=r"seqlens_k\[0\] = %d is out of range" % total):
        fn(*bad)
