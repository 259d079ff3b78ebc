"""Decoder-block fusion (actorrt.providers.cpu.llm._fusion).

Oracles: the same graph run node by node (``fuse_kernels=False``: the
original kernels, themselves checked against onnxruntime elsewhere) and
onnxruntime on the same file. Models: 2-layer llamas built from tiny random
GGUFs by ``actorrt.genai``'s builder (the graph the fusion was written for),
prefill then decode steps with KV buffers that have spare capacity (appended
in place, as the engine runs them), batch 2 with different lengths.
"""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
ort = pytest.importorskip("onnxruntime")

from actorrt import KernelError, SessionOptions, open_session  # noqa: E402
from actorrt.genai import models as models_mod  # noqa: E402
from actorrt.genai.models import load_genai_config, prepare_model  # noqa: E402
from actorrt.providers.cpu.llm import _contrib_int8 as ci  # noqa: E402
from actorrt.providers.cpu.llm import _contrib_numba as nbk  # noqa: E402
from actorrt.providers.cpu.llm import _fusion  # noqa: E402
from actorrt.providers.cpu.llm import _block_kernels  # noqa: E402
from tests.genai.test_builder import write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.skipif(not nbk.HAVE_NUMBA, reason="the fused kernels need numba")

WEIGHTS = {"q4_1": dict(qtype="Q4_1", embed="Q8_0"), "q4_0": dict(qtype="Q4_0", embed="Q8_0"),
           "q8_0": dict(qtype="Q8_0", embed="Q8_0")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """weights kind -> (model folder, genai config)."""
    out = {}
    for kind, kw in WEIGHTS.items():
        tmp = tmp_path_factory.mktemp(kind)
        folder = prepare_model(write_tiny_gguf(tmp / "tiny.gguf", **kw), home=tmp / "home",
                               progress=False)
        out[kind] = (folder, load_genai_config(folder))
    return out


def model_path(tiny, kind: str, level: int):
    folder, cfg = tiny[kind]
    return models_mod.model_file(folder, level), cfg


def decode_feeds(cfg, steps=(5, 1, 1), batch_lengths=(1,), capacity=16, seed=0):
    """Feeds of a prefill then decode steps: batch rows of the given extra
    past lengths (left as padding), KV buffers of ``capacity`` positions."""
    rng = np.random.default_rng(seed)
    bsz = len(batch_lengths)
    kv = {n: np.zeros((bsz, cfg.num_kv_heads, capacity, cfg.head_dim), np.float32)
          for n in cfg.kv_input_names()}
    lengths = [0] * bsz
    for s in steps:
        ids = rng.integers(3, 280, (bsz, s))
        total = max(lengths) + s
        mask = np.zeros((bsz, total), np.int64)
        for b in range(bsz):
            mask[b, :lengths[b] + s] = 1
        yield {"input_ids": ids, "attention_mask": mask, **kv}, kv
        lengths = [n + s for n in lengths]


async def run_steps(path, cfg, options, extra=(), **kw):
    """logits and present KV of every step (copies); ``extra[i]``: more feeds
    of step i."""
    got = []
    async with open_session(path, None, options) as sess:
        names = cfg.kv_input_names()
        fusions = list(sess.plan.fusions)
        state = None
        for i, (feeds, kv) in enumerate(decode_feeds(cfg, **kw)):
            if i < len(extra):
                feeds.update(extra[i])
            if state is not None:
                feeds.update(state)
            outs = await sess.run(None, feeds, donate=names)
            by = dict(zip([o.name for o in sess.get_outputs()], outs))
            state = {n: by[o] for n, o in zip(names, cfg.kv_output_names())}
            got.append([np.array(by["logits"])] + [np.array(by[o]) for o in cfg.kv_output_names()])
    return got, fusions


@contextlib.contextmanager
def kernel_threads(n: int):
    """The parallel kernels on ``n`` threads inside the block."""
    old = nbk.num_threads()
    nbk.set_num_threads(n)
    try:
        yield
    finally:
        nbk.set_num_threads(old)


def assert_steps_close(a, b, rtol):
    for sa, sb in zip(a, b):
        for x, y in zip(sa, sb):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * max(1.0, np.abs(y).max()))


@pytest.mark.parametrize("kind", list(WEIGHTS))
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("batch_lengths", [(0,), (0, 2)])
async def test_fused_blocks_match_the_nodes(tiny, kind, level, batch_lengths):
    if level == 4 and not ci.HAVE_INT8_DOT:
        pytest.skip("accuracy_level 4 keeps float32 activations without AVX2")
    path, cfg = model_path(tiny, kind, level)
    steps = (4, 1, 1, 1) if len(batch_lengths) == 1 else (3, 1, 1)
    fused, fusions = await run_steps(path, cfg, SessionOptions(), steps=steps,
                                     batch_lengths=batch_lengths)
    plain, none = await run_steps(path, cfg, SessionOptions(fuse_kernels=False), steps=steps,
                                  batch_lengths=batch_lengths)
    blocks = [f for f in fusions if f[0].endswith("/DecoderBlock")]
    stacks = [f for f in fusions if f[0].endswith("/DecoderStack")]
    assert len(blocks) == cfg.num_layers and not none
    assert all(len(names) == 11 for _, names in blocks)  # packed QKV: 11 nodes a layer
    # int8 blocks then run as one stack, with the LM head
    assert stacks == ([("model.layers.0..1/DecoderStack",
                        tuple(n for n, _ in blocks) + ("lm_head/MatMulNBits",))]
                      if level == 4 else [])
    assert_steps_close(fused, plain, 1e-5)


@pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")
@pytest.mark.parametrize("kind", list(WEIGHTS))
@pytest.mark.parametrize("threads", [1, 2])
async def test_stack_equals_the_blocks(tiny, kind, threads, monkeypatch):
    # the stacked layers run the blocks' stage program: the same bits as the
    # blocks run one call each; prefill and decode, batch rows of different
    # lengths, one and two threads
    path, cfg = model_path(tiny, kind, 4)
    monkeypatch.setattr(_fusion, "REGION_MIN_WORK", 0)
    monkeypatch.setattr(_fusion, "CHUNK_COLUMNS", 8)
    calls = []
    region = _block_kernels.region_stack
    monkeypatch.setattr(_block_kernels, "region_stack",
                        lambda *a: (calls.append(1), region(*a))[1])
    with kernel_threads(threads):
        stacked, fusions = await run_steps(path, cfg, SessionOptions(), steps=(5, 1, 1),
                                           batch_lengths=(0, 2))
        monkeypatch.setattr(_fusion, "STACK_BLOCKS", False)
        blocks, fusions2 = await run_steps(path, cfg, SessionOptions(), steps=(5, 1, 1),
                                           batch_lengths=(0, 2))
    assert fusions[-1][0].endswith("/DecoderStack") and len(calls) == 3  # every step
    assert not any(f[0].endswith("/DecoderStack") for f in fusions2)
    for a, b in zip(stacked, blocks):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("batch_lengths", [(0, 3), (0, 1, 2, 3, 4, 5)])
async def test_parallel_region_equals_one_thread(tiny, kind, batch_lengths, monkeypatch):
    # the int8 block's stage program run by a team of threads claiming chunks
    # gives the same bits as one thread running every chunk; six rows: the
    # row-wise stages' chunks of ROW_CHUNK rows split a decode batch (4 + 2)
    path, cfg = model_path(tiny, kind, 4)
    monkeypatch.setattr(_fusion, "CHUNK_COLUMNS", 8)
    monkeypatch.setattr(_fusion, "REGION_MIN_WORK", 1 << 40)
    one, _ = await run_steps(path, cfg, SessionOptions(), steps=(6, 1, 1),
                             batch_lengths=batch_lengths)
    monkeypatch.setattr(_fusion, "REGION_MIN_WORK", 0)
    with kernel_threads(2):
        team, _ = await run_steps(path, cfg, SessionOptions(), steps=(6, 1, 1),
                                  batch_lengths=batch_lengths)
    for a, b in zip(one, team):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
async def test_prompt_rows_in_row_tiles_equal_the_nodes_and_one_thread(tiny, kind, monkeypatch):
    # a prompt of more rows than a row tile (ROW_BLOCK): the projection
    # stages' (row tile, column chunk) work items, claimed by two threads,
    # give the bits one thread gives, and the unfused graph's values
    path, cfg = model_path(tiny, kind, 4)
    rows = ci.ROW_BLOCK + 7  # two row tiles a batch row; 2 x 71 rows: three
    steps = (rows, 1, 1)
    monkeypatch.setattr(_fusion, "CHUNK_COLUMNS", 8)
    monkeypatch.setattr(_fusion, "REGION_MIN_WORK", 1 << 40)
    one, _ = await run_steps(path, cfg, SessionOptions(), steps=steps, batch_lengths=(0, 3),
                             capacity=rows + 8)
    monkeypatch.setattr(_fusion, "REGION_MIN_WORK", 0)
    with kernel_threads(2):
        team, fusions = await run_steps(path, cfg, SessionOptions(), steps=steps,
                                        batch_lengths=(0, 3), capacity=rows + 8)
    assert fusions[-1][0].endswith("/DecoderStack")
    for a, b in zip(one, team):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    plain, _ = await run_steps(path, cfg, SessionOptions(fuse_kernels=False), steps=steps,
                               batch_lengths=(0, 3), capacity=rows + 8)
    # layer 0's keys and values: every row through the q/k/v stage's row
    # tiles from the same int8 activations as the nodes (the embedding)
    for a, b in zip(team, plain):
        for x, y in zip(a[1:3], b[1:3]):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(y).max()))
    # later layers quantize activations the fused and node-by-node graphs
    # compute in other float orders: a value on a rounding tie may land one
    # int8 step apart and move that position's logits a little (a wrong row
    # tile would move many rows by far more)
    for a, b in zip(team, plain):
        x, y = a[0].reshape(-1, a[0].shape[-1]), b[0].reshape(-1, b[0].shape[-1])
        scale = np.abs(y).max()
        off = np.abs(x - y).max(-1)
        assert np.all(off <= 0.05 * scale), off.max() / scale
        assert np.mean(off <= 1e-5 * max(1.0, scale)) >= 0.97, np.mean(off <= 1e-5 * scale)


@pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")
@pytest.mark.parametrize("batch_lengths", [(0,), (0, 3)])
async def test_decode_attention_in_spans(tiny, batch_lengths, monkeypatch):
    # a decode step splits each (batch row, KV head) pair's cached rows into
    # spans merged afterwards (flash-decoding): the node-by-node values to
    # float tolerance, and the same bits on a team of threads as on one (the
    # split does not depend on the thread count). The tiny model has 2 KV
    # heads: SPAN_UNITS 4 -> batch 1 in 2 spans, batch 2 in 1 (4 pairs); 8 ->
    # up to 4 / 2 (at least span_rows cached rows a span)
    path, cfg = model_path(tiny, "q4_1", 4)
    span_rows = 3  # 9-12 cached rows: 3 or 4 spans of batch 1 with SPAN_UNITS 8
    monkeypatch.setattr(_fusion, "CHUNK_COLUMNS", 8)
    monkeypatch.setattr(_fusion, "SPAN_ROWS", span_rows)
    # (a prefill of 8: with 9 and batch 2, the fused and the node-by-node
    # norms round one int8 activation differently, with or without spans)
    steps, cap = (8, 1, 1, 1, 1), 24
    plain, _ = await run_steps(path, cfg, SessionOptions(fuse_kernels=False), steps=steps,
                               batch_lengths=batch_lengths, capacity=cap)
    counts = []  # the span counts the stack's trace records, per step
    record = _fusion.tracing.kernel_variant
    monkeypatch.setattr(_fusion.tracing, "kernel_variant", lambda *a: (
        counts.append(a[-1]) if a[1] == "decoder-stack" else None, record(*a))[1])
    for units in (4, 8):
        monkeypatch.setattr(_fusion, "SPAN_UNITS", units)
        runs = []
        for threads, min_work in ((1, 1 << 40), (2, 0)):
            monkeypatch.setattr(_fusion, "REGION_MIN_WORK", min_work)
            with kernel_threads(threads):
                runs.append((await run_steps(path, cfg, SessionOptions(), steps=steps,
                                             batch_lengths=batch_lengths, capacity=cap))[0])
        one, team = runs
        for a, b in zip(one, team):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
        assert_steps_close(team, plain, 1e-5)
    # per run: the prefill in one span, then the decode steps'
    pairs = len(batch_lengths) * cfg.num_kv_heads
    want = [[1] + [max(1, min(-(-units // pairs), (steps[0] + k) // span_rows))
                   for k in range(1, len(steps))] for units in (4, 8)]
    assert counts == [n for w in want for n in w + w]


@pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")
async def test_stack_takes_in_the_lm_head(tiny, monkeypatch):
    # the LM head (int8 MatMulNBits on the last layer's output) runs in the
    # stack's parallel region: the same bits as the head run as its own step
    # after the stack, prefill and decode, batch 2; the trace says so (every
    # weight kind's stack, head included, equals the blocks run one by one:
    # test_stack_equals_the_blocks)
    path, cfg = model_path(tiny, "q4_1", 4)
    monkeypatch.setattr(_fusion, "REGION_MIN_WORK", 0)
    monkeypatch.setattr(_fusion, "CHUNK_COLUMNS", 8)
    notes = []
    record = _fusion.tracing.kernel_variant
    monkeypatch.setattr(_fusion.tracing, "kernel_variant", lambda *a: (
        notes.append(a[2] % a[3:]) if a[1] == "decoder-stack" else None, record(*a))[1])
    with kernel_threads(2):
        fused, fusions = await run_steps(path, cfg, SessionOptions(), steps=(5, 1, 1),
                                         batch_lengths=(0, 2))
        monkeypatch.setattr(_fusion, "STACK_HEAD", False)
        apart, fusions2 = await run_steps(path, cfg, SessionOptions(), steps=(5, 1, 1),
                                          batch_lengths=(0, 2))
    assert fusions[-1][1][-1] == "lm_head/MatMulNBits"
    assert "lm_head/MatMulNBits" not in fusions2[-1][1]
    assert len(notes) == 6 and all("and the LM head" in n for n in notes[:3])
    assert not any("LM head" in n for n in notes[3:])
    for a, b in zip(fused, apart):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")
async def test_stack_head_reads_only_the_picked_rows(tiny, monkeypatch):
    # a last_logits file: the GatherND picking one position a row joins the
    # stack with the head; the region's logits are the rows of the full
    # file's at those positions (prefill of 5, batch 2 with a negative
    # position; then decode steps), as the unfused nodes give them; a
    # position out of range is GatherND's error, under the stack's name
    folder, cfg = tiny["q4_1"]
    path = models_mod.model_file(folder, 4, last_logits=True)
    monkeypatch.setattr(_fusion, "REGION_MIN_WORK", 0)
    notes = []
    record = _fusion.tracing.kernel_variant
    monkeypatch.setattr(_fusion.tracing, "kernel_variant", lambda *a: (
        notes.append(a[2] % a[3:]) if a[1] == "decoder-stack" else None, record(*a))[1])
    key = models_mod.LOGITS_POSITIONS
    picks = [np.array([4, -3]), np.zeros(2, np.int64), np.zeros(2, np.int64)]
    extra = [{key: p.astype(np.int64).reshape(2, 1, 1)} for p in picks]
    run = dict(steps=(5, 1, 1), batch_lengths=(0, 2))
    with kernel_threads(2):
        got, fusions = await run_steps(path, cfg, SessionOptions(), extra=extra, **run)
        ours = list(notes)
        full, _ = await run_steps(model_path(tiny, "q4_1", 4)[0], cfg, SessionOptions(), **run)
        plain, none = await run_steps(path, cfg, SessionOptions(fuse_kernels=False), extra=extra,
                                      **run)
    assert fusions[-1][1][-2:] == ("logits_positions/GatherND", "lm_head/MatMulNBits")
    assert not none and len(ours) == 3 and all("and the LM head" in n for n in ours)
    for step, (g, f, p) in enumerate(zip(got, full, plain)):
        rows = [4, 2] if step == 0 else [0, 0]
        assert g[0].shape == (2, 1, f[0].shape[2])
        np.testing.assert_allclose(g[0][:, 0], f[0][[0, 1], rows], rtol=1e-5, atol=1e-5)
        assert_steps_close([g], [p], 1e-5)
        for x, y in zip(g[1:], f[1:]):  # the same KV cache
            np.testing.assert_array_equal(x, y)
    (feeds, _), = decode_feeds(cfg, steps=(5,), batch_lengths=(0, 2))
    feeds[key] = np.array([5, 0], np.int64).reshape(2, 1, 1)
    async with open_session(path) as sess:
        with pytest.raises(KernelError, match=r"DecoderStack.*out of range"):
            await sess.run(None, feeds)


async def test_fused_model_matches_onnxruntime(tiny):
    # the float32-activation variant against the peer, prefill and decode
    path, cfg = model_path(tiny, "q4_1", 0)
    got, fusions = await run_steps(path, cfg, SessionOptions(), steps=(5, 1, 1))
    assert fusions
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = cfg.kv_input_names()
    state = None
    for i, (feeds, _) in enumerate(decode_feeds(cfg, steps=(5, 1, 1))):
        n = feeds["attention_mask"].shape[1] - feeds["input_ids"].shape[1]
        feeds = dict(feeds)
        for nm in names:  # onnxruntime's convention: a past of exactly the cached length
            feeds[nm] = state[nm] if state is not None else feeds[nm][:, :, :n]
        outs = sess.run(None, feeds)
        by = dict(zip([o.name for o in sess.get_outputs()], outs))
        state = {nm: by[o] for nm, o in zip(names, cfg.kv_output_names())}
        scale = np.abs(by["logits"]).max()
        np.testing.assert_allclose(got[i][0], by["logits"], rtol=1e-4, atol=1e-4 * scale)


async def test_fused_block_error_names_the_original_node(tiny):
    # seqlens_k = -1 (an all-zero mask row) leaves the compiled path; the
    # original GroupQueryAttention kernel raises and is named
    path, cfg = model_path(tiny, "q4_1", 0)
    (feeds, _), *_ = decode_feeds(cfg, steps=(2,))
    feeds["attention_mask"] = np.zeros_like(feeds["attention_mask"])
    async with open_session(path) as sess:
        assert sess.plan.fusions
        with pytest.raises(KernelError) as err:
            await sess.run(None, feeds)
    assert "GroupQueryAttention" in str(err.value)
    assert err.value.node == "model.layers.0/attn/GroupQueryAttention"


async def test_float64_inputs_run_the_original_kernels(tiny, monkeypatch):
    # a value the compiled path does not take (here: a non-contiguous hidden
    # state) runs the original kernels one after another, same result
    path, cfg = model_path(tiny, "q4_1", 0)
    calls = []
    orig = _fusion.DecoderBlock._fallback

    def spy(self, *inputs):
        calls.append(self.node.name)
        return orig(self, *inputs)

    monkeypatch.setattr(_fusion.DecoderBlock, "_fallback", spy)
    async with open_session(path) as sess:
        step = next(s for s in sess.plan.steps if s.node.op_type == _fusion.FUSED_OP)
        block = step.fn
        plain = step.kernel._fallback
        rng = np.random.default_rng(1)
        h = rng.standard_normal((1, 3, 64 * 2)).astype(np.float32)[:, :, ::2]  # strided
        res = rng.standard_normal((1, 3, 64)).astype(np.float32)
        kv = [np.zeros((1, cfg.num_kv_heads, 8, cfg.head_dim), np.float32) for _ in range(2)]
        consts = step.kernel.match["consts"]
        cos, sin = (consts[s] for s in step.inputs[6:8])
        args = (h, res, *kv, np.array([2], np.int32), np.array([3], np.int32), cos, sin)
        got = block(*args)
        assert calls == [step.node.name]
        kv2 = [np.zeros_like(k) for k in kv]
        want = plain(np.ascontiguousarray(h), res, *kv2, *args[4:])
        for x, y in zip(got, want):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


async def test_a_block_whose_intermediate_is_read_outside_is_not_fused(tiny):
    path, cfg = model_path(tiny, "q4_1", 0)
    model = onnx.load(str(path), load_external_data=False)
    gate = next(n for n in model.graph.node if n.name.endswith("layers.1/mlp/act/Sigmoid"))
    model.graph.output.append(onnx.helper.make_tensor_value_info(gate.output[0],
                                                                 onnx.TensorProto.FLOAT, None))
    copy = path.parent / "extra_output.onnx"
    onnx.save(model, str(copy))
    try:
        async with open_session(copy) as sess:
            fused = [names for name, names in sess.plan.fusions if name.endswith("/DecoderBlock")]
        assert len(fused) == 1 and "model.layers.0/attn/GroupQueryAttention" in fused[0]
    finally:
        copy.unlink()


async def test_fusion_is_traced(tiny, tmp_path):
    import json
    path, cfg = model_path(tiny, "q4_1", 0)
    trace = tmp_path / "trace.json"
    async with open_session(path, None, SessionOptions(trace_path=str(trace))) as sess:
        (feeds, _), *_ = decode_feeds(cfg, steps=(3,))
        await sess.run(None, feeds)
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    spans = [e for e in events if e.get("name", "").endswith("/DecoderBlock")]
    assert spans and "decoder-block" in json.dumps(spans[0])


@pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")
async def test_stage_profile_records_timings_and_keeps_the_bits(tiny, monkeypatch):
    # the profiling hook (_fusion.STAGE_PROFILE): the profiled stack computes
    # the same bits as the unprofiled one and adds cycle counts per stage
    path, cfg = model_path(tiny, "q4_1", 4)
    monkeypatch.setattr(_fusion, "REGION_MIN_WORK", 0)
    monkeypatch.setattr(_fusion, "CHUNK_COLUMNS", 8)
    with kernel_threads(2):
        plain, _ = await run_steps(path, cfg, SessionOptions(), steps=(5, 1, 1),
                                   batch_lengths=(0, 2))
        prof = np.zeros((cfg.num_layers + 1, _block_kernels.PROFILE_SLOTS), np.int64)
        monkeypatch.setattr(_fusion, "STAGE_PROFILE", prof)
        timed, _ = await run_steps(path, cfg, SessionOptions(), steps=(5, 1, 1),
                                   batch_lengths=(0, 2))
    for a, b in zip(timed, plain):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert not prof[:, :_block_kernels.PROFILE_WAIT].any()  # no counters leak out
    exits = prof[:cfg.num_layers, _block_kernels.PROFILE_EXIT:]
    for st in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9):  # every decoder stage of every layer left
        assert (exits[:, st] > 0).all()
    assert (prof[:, _block_kernels.PROFILE_WAIT:_block_kernels.PROFILE_EXIT] >= 0).all()


@pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")
async def test_stack_without_room_in_place_runs_the_blocks(tiny, monkeypatch):
    # KV buffers not donated (read-only) or a layer whose key and value
    # buffers overlap: the blocks run one after another, same values
    path, cfg = model_path(tiny, "q4_1", 4)
    calls = []
    region = _block_kernels.region_stack
    monkeypatch.setattr(_block_kernels, "region_stack",
                        lambda *a: (calls.append(1), region(*a))[1])
    async with open_session(path) as sess:
        step = next(s for s in sess.plan.steps if s.node.op_type == _fusion.STACK_OP)
        rng = np.random.default_rng(2)
        h = rng.standard_normal((1, 2, 64)).astype(np.float32)
        res = rng.standard_normal((1, 2, 64)).astype(np.float32)
        consts = step.kernel.blocks[0].kernel.match["consts"]
        cos, sin = (consts[s] for s in step.kernel.blocks[0].inputs[6:8])
        shape = (1, cfg.num_kv_heads, 8, cfg.head_dim)
        kv = [np.zeros(shape, np.float32) for _ in range(4)]
        for k in kv:  # four cached positions; two new ones are appended
            k[:, :, :4] = rng.standard_normal(k[:, :, :4].shape)
        lengths = (np.array([4], np.int32), np.array([5], np.int32), cos, sin)
        want = step.kernel.run(h, res, *lengths, *[k.copy() for k in kv])
        read_only = [k.copy() for k in kv]
        for k in read_only:
            k.flags.writeable = False
        got = step.fn(h, res, *lengths, *read_only)
        assert not calls
        for x, y in zip(got, want):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
        shared = [k.copy() for k in kv]
        shared[3] = shared[2]  # layer 1: key and value in one buffer
        got = step.fn(h, res, *lengths, *shared)
        assert not calls  # the stack declined before writing
        want = step.kernel.run(h, res, *lengths, *[k.copy() for k in shared])
        for x, y in zip(got, want):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
        got = step.fn(h, res, *lengths, *[k.copy() for k in kv])  # in place: the stack
        assert len(calls) == 1
        for x, y in zip(got, step.kernel.run(h, res, *lengths, *[k.copy() for k in kv])):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
        # the same buffers again (checked once, known by identity), then the
        # same arrays behind read-only views: the stack, then the blocks
        mine = [k.copy() for k in kv]
        ref = [k.copy() for k in kv]
        lengths6 = (np.array([5], np.int32), np.array([6], np.int32), cos, sin)
        for lens in (lengths, lengths6):
            got = step.fn(h, res, *lens, *mine)
            want = step.kernel.run(h, res, *lens, *ref)
            for x, y in zip(got, want):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
        assert len(calls) == 3
        views = [k.view() for k in mine]
        views[1].flags.writeable = False
        before = [k.copy() for k in mine]
        before[1].flags.writeable = False
        got = step.fn(h, res, *lengths, *views)
        assert len(calls) == 3
        for x, y in zip(got, step.kernel.run(h, res, *lengths, *before)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_expf_and_silu_match_numpy():
    # the vectorizable exp of the fused SiLU stage against numpy in float64:
    # relative error below 2e-7 where e^x is a normal float32, clamped outside
    from numba import njit

    @njit
    def exps(x, out):
        for i in range(x.size):
            out[i] = nbk._expf(x[i])

    x = np.concatenate([np.linspace(-87.3, 88.3, 100_001), [-1e4, 1e4, -np.inf, np.inf]]
                       ).astype(np.float32)
    got = np.empty_like(x)
    exps(x, got)
    want = np.exp(x[:-4].astype(np.float64))
    assert np.max(np.abs(got[:-4] - want) / want) < 2e-7
    assert 0 < got[-4] == got[-2] < 1.2e-38  # the smallest normal float32, about
    assert np.isfinite(got[-3]) and got[-3] == got[-1] > 2e38
    rng = np.random.default_rng(3)
    gate = (rng.standard_normal((3, 1536)) * 8).astype(np.float32)
    up = rng.standard_normal((3, 1536)).astype(np.float32)
    g64 = gate.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * up
    out = gate.copy()
    nbk._silu_mul(out, up, 1, 3)  # rows 1..2 only
    np.testing.assert_array_equal(out[0], gate[0])
    np.testing.assert_allclose(out[1:], want[1:], rtol=1e-6, atol=1e-6)
