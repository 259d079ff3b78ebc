"""com.microsoft activations, (Skip)(Simplified)LayerNormalization and
RotaryEmbedding against onnxruntime."""

import numpy as np
import pytest

from tests.oracle import check_node

MS = "com.microsoft"
rng = np.random.default_rng(0)
X = (rng.standard_normal((2, 3, 8)) * 3).astype(np.float32)
BIAS = rng.standard_normal(8).astype(np.float32)
GAMMA = rng.standard_normal(8).astype(np.float32)


def ort(op, inputs, outputs=("y",), *, domain=MS, tol=1e-5, **attrs):
    return check_node(op, inputs, outputs, domain=domain, peer="ort", rtol=max(tol, 1e-4),
                      atol=tol, **attrs)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_activations(dtype):
    x, b = X.astype(dtype), BIAS.astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-2
    ort("Gelu", {"x": x}, tol=tol)
    ort("BiasGelu", {"x": x, "b": b}, tol=tol)
    ort("FastGelu", {"x": x}, tol=tol)
    ort("FastGelu", {"x": x, "b": b}, tol=tol)
    ort("QuickGelu", {"x": x}, tol=tol)
    ort("QuickGelu", {"x": x}, tol=tol, alpha=1.0)


def test_gelu_tails():
    x = np.linspace(-12, 12, 97, dtype=np.float32)
    ort("Gelu", {"x": x})
    ort("QuickGelu", {"x": x * 10})


@pytest.mark.parametrize("path", ["numba", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_simplified_layer_norm(dtype, path, monkeypatch):
    from actorrt.providers.cpu.llm import _contrib_numba as nbk
    if path == "numba" and not nbk.HAVE_NUMBA:
        pytest.skip("numba not installed")
    if path == "numpy":
        monkeypatch.setattr(nbk, "HAVE_NUMBA", False)
    x, s, g, b = (a.astype(dtype) for a in (X, X[::-1].copy(), GAMMA, BIAS))
    tol = 1e-5 if dtype == np.float32 else 1e-2
    ort("SkipSimplifiedLayerNormalization", {"x": x, "s": s, "g": g}, ("y", "m", "i", "sum"),
        tol=tol, epsilon=1e-6)
    ort("SkipSimplifiedLayerNormalization", {"x": x, "s": s, "g": g, "bias": b},
        ("y", "", "", "sum"), tol=tol)
    ort("SkipSimplifiedLayerNormalization", {"x": x[0], "s": s[0], "g": g}, ("y",), tol=tol)


def test_skip_layer_norm():
    ort("SkipLayerNormalization", {"x": X, "s": X[0:1].copy(), "g": GAMMA, "be": BIAS,
                                   "bias": BIAS}, ("y", "m", "i", "sum"))
    ort("SkipLayerNormalization", {"x": X, "s": X[0].copy(), "g": GAMMA}, ("y",), epsilon=1e-5)


def test_simplified_layer_norm_onnx_domain():
    ort("SimplifiedLayerNormalization", {"x": X, "g": GAMMA}, ("y", "i"), domain="")
    ort("SimplifiedLayerNormalization", {"x": np.stack([X, 3 * X]), "g": GAMMA}, ("y", "i"),
        domain="")  # the compiled path on a 3-D input
    ort("SimplifiedLayerNormalization", {"x": X, "g": GAMMA.reshape(1, 8).repeat(3, 0)},
        ("y", "i"), domain="", axis=1, epsilon=1e-3)
    ort("SimplifiedLayerNormalization", {"x": X.astype(np.float16),
                                         "g": GAMMA.astype(np.float16)}, domain="", tol=1e-2)


B, S, N, D, MAXP = 2, 3, 4, 16, 32
ANG = rng.standard_normal((MAXP, D // 2)).astype(np.float32)
COS, SIN = np.cos(ANG), np.sin(ANG)
POS = rng.integers(0, MAXP, (B, S)).astype(np.int64)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding(interleaved):
    x3 = rng.standard_normal((B, S, N * D)).astype(np.float32)
    x4 = rng.standard_normal((B, N, S, D)).astype(np.float32)
    for x in (x3, x4):
        ort("RotaryEmbedding", {"x": x, "p": POS, "c": COS, "s": SIN}, interleaved=interleaved)
        ort("RotaryEmbedding", {"x": x, "p": np.array([5], np.int64), "c": COS, "s": SIN},
            interleaved=interleaved, scale=0.5, is_packed_batching=1)
        ort("RotaryEmbedding", {"x": x, "p": POS, "c": COS[:, :4].copy(), "s": SIN[:, :4].copy()},
            interleaved=interleaved, num_heads=N, rotary_embedding_dim=8)
    ort("RotaryEmbedding", {"x": x3.astype(np.float16), "p": POS, "c": COS.astype(np.float16),
                            "s": SIN.astype(np.float16)}, tol=1e-2, num_heads=N)
