"""RNN / GRU / LSTM against the ONNX reference evaluator, and against
onnxruntime for what the reference ignores (sequence_lens, activations, clip)."""

import numpy as np
import pytest

from tests.oracle import check_node

RNG = np.random.default_rng(1)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def rnn_inputs(op, *, T=5, B=3, I=4, H=6, dirs=1, layout=0, bias=True, init=False,
               peep=False, lens=None):
    g = GATES[op]
    x = RNG.standard_normal((B, T, I) if layout else (T, B, I)).astype(np.float32)
    ins = {"X": x,
           "W": (RNG.standard_normal((dirs, g * H, I)) * 0.5).astype(np.float32),
           "R": (RNG.standard_normal((dirs, g * H, H)) * 0.5).astype(np.float32),
           "B": (RNG.standard_normal((dirs, 2 * g * H)) * 0.3).astype(np.float32)
           if bias else None,
           "sequence_lens": None if lens is None else np.array(lens, dtype=np.int32),
           "initial_h": None}
    state_shape = (B, dirs, H) if layout else (dirs, B, H)
    if init:
        ins["initial_h"] = RNG.standard_normal(state_shape).astype(np.float32)
    if op == "LSTM":
        ins["initial_c"] = RNG.standard_normal(state_shape).astype(np.float32) if init else None
        ins["P"] = RNG.standard_normal((dirs, 3 * H)).astype(np.float32) if peep else None
    while list(ins.values())[-1] is None:
        ins.popitem()
    return ins


def outs(op):
    return ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent_matches_reference(op, direction, layout):
    dirs = 2 if direction == "bidirectional" else 1
    ins = rnn_inputs(op, dirs=dirs, layout=layout, init=True, peep=op == "LSTM")
    check_node(op, ins, outs(op), opset=22, hidden_size=6, direction=direction, layout=layout)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_defaults_no_bias(op):
    check_node(op, rnn_inputs(op, bias=False), outs(op), opset=14, hidden_size=6)


def test_gru_linear_before_reset():
    check_node("GRU", rnn_inputs("GRU", init=True, dirs=2), outs("GRU"), opset=22,
               hidden_size=6, direction="bidirectional", linear_before_reset=1)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_sequence_lens_vs_ort(op, direction):
    dirs = 2 if direction == "bidirectional" else 1
    ins = rnn_inputs(op, dirs=dirs, init=True, lens=[5, 2, 3])
    check_node(op, ins, outs(op), opset=14, peer="ort", hidden_size=6, direction=direction)


@pytest.mark.parametrize("op,acts,alpha,beta", [
    ("RNN", ["Relu"], None, None),
    ("RNN", ["LeakyRelu", "HardSigmoid"], [0.2, 0.3], [0.4]),
    ("GRU", ["HardSigmoid", "Softsign"], [0.3], [0.6]),
    ("LSTM", ["Sigmoid", "Affine", "ScaledTanh"], [0.7, 1.2], [0.1, 0.9]),
])
def test_recurrent_activations_vs_ort(op, acts, alpha, beta):
    dirs = 2 if op == "RNN" and len(acts) == 2 else 1
    attrs = {"activations": acts}
    if dirs == 2:
        attrs["direction"] = "bidirectional"
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    check_node(op, rnn_inputs(op, dirs=dirs, init=True), outs(op), opset=14, peer="ort",
               hidden_size=6, **attrs)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_clip_vs_ort(op):
    check_node(op, rnn_inputs(op, init=True), outs(op), opset=14, peer="ort",
               hidden_size=6, clip=0.5)


def test_lstm_input_forget_vs_ort():
    check_node("LSTM", rnn_inputs("LSTM", init=True, peep=True), outs("LSTM"), opset=14,
               peer="ort", hidden_size=6, input_forget=1)


def test_lstm_float64():
    ins = {k: v.astype(np.float64) if v is not None and v.dtype == np.float32 else v
           for k, v in rnn_inputs("LSTM", init=True).items()}
    check_node("LSTM", ins, outs("LSTM"), opset=22, hidden_size=6, rtol=1e-10, atol=1e-12)
