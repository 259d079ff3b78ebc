"""Real models against onnxruntime (rtol 1e-4 / atol 1e-5): the nine light
model-zoo nets shipped in the onnx wheel (also against their shipped outputs)
and models exported from PyTorch with the dynamo exporter at opset 18
(tools/export_test_models.py)."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import actorrt
from tests.oracle import assert_close, run_onnxruntime

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
DATA = Path(__file__).parent / "data"
LIGHT_MODELS = sorted(p.stem for p in LIGHT.glob("light_*.onnx"))


def _dummy(vi):
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                  for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def test_all_nine_light_models_are_found():
    assert len(LIGHT_MODELS) == 9


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_onnxruntime_and_shipped_output(name):
    path = LIGHT / f"{name}.onnx"
    model = onnx.load(str(path))
    inits = {i.name for i in model.graph.initializer}
    feeds = {vi.name: _dummy(vi) for vi in model.graph.input if vi.name not in inits}
    with actorrt.InferenceSession(path) as sess:
        got = sess.run(None, feeds)
    want = run_onnxruntime(model, feeds)
    shipped = numpy_helper.to_array(onnx.load_tensor(str(LIGHT / f"{name}_output_0.pb")))
    logits = _softmax_input(model)
    if logits is not None:
        # a final Softmax: its input compared too; where that input's values
        # tie to float32 resolution (squeezenet on this feed: every logit
        # ~6.7e9, one float32 step 512), the Softmax output depends on the
        # GEMM's summation order only, so the logits are what is compared
        with actorrt.InferenceSession(logits) as sess:
            got_l = sess.run(None, feeds)
        want_l = run_onnxruntime(logits, feeds)
        assert_close(got_l, want_l, rtol=1e-4, atol=1e-5)
        z = want_l[0].astype(np.float64)
        if np.ptp(z) <= 4 * np.spacing(np.abs(z).max().astype(np.float32)):
            return
    assert_close(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[0], shipped, rtol=1e-3, atol=1e-5)


def _softmax_input(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` with the input of the Softmax making its first output as
    its only output, or None when no Softmax makes it."""
    out = model.graph.output[0].name
    node = next((n for n in model.graph.node if out in n.output), None)
    if node is None or node.op_type != "Softmax":
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.append(onnx.helper.make_tensor_value_info(node.input[0],
                                                             onnx.TensorProto.FLOAT, None))
    return m


def test_resnet_style_cnn_from_pytorch():
    model = onnx.load(str(DATA / "resnetish.onnx"))
    x = np.random.default_rng(0).standard_normal((3, 3, 64, 64)).astype(np.float32)
    with actorrt.InferenceSession(model) as sess:
        got = sess.run(None, {"pixels": x})
    assert_close(got, run_onnxruntime(model, {"pixels": x}), rtol=1e-4, atol=1e-5)


def test_bert_style_encoder_from_pytorch():
    model = onnx.load(str(DATA / "bertish.onnx"))
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 100, (2, 12)).astype(np.int64)
    mask = np.ones((2, 12), np.int64)
    mask[1, 8:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    with actorrt.InferenceSession(model) as sess:
        got = sess.run(None, feeds)
    assert_close(got, run_onnxruntime(model, feeds), rtol=1e-4, atol=1e-5)


def test_gpt2_style_decoder_step_by_step_with_past():
    model = onnx.load(str(DATA / "gpt2ish.onnx"))
    import onnxruntime as ort
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    past = [rng.standard_normal((1, 4, 1, 16)).astype(np.float32) for _ in range(4)]
    names = ["past_key.0", "past_value.0", "past_key.1", "past_value.1"]
    ids = np.array([[5, 17, 42]], np.int64)
    ours_past, ref_past = list(past), list(past)
    with actorrt.InferenceSession(model) as sess:
        for step in range(8):
            feeds = {"input_ids": ids, **dict(zip(names, ours_past))}
            got = sess.run(None, feeds)
            want = ref.run(None, {"input_ids": ids, **dict(zip(names, ref_past))})
            assert_close(got, want, rtol=1e-4, atol=1e-5)
            ours_past, ref_past = got[1:], want[1:]
            ids = np.argmax(want[0][:, -1:], axis=-1).astype(np.int64)
