"""Whole-model benchmarks against onnxruntime, at 1 and 2 threads.

    python benchmarks/bench_models.py [--threads 1,2] [--models a,b] [--rounds 5] [--budget 0.3]

Every thread count runs in its own child process whose BLAS/numba/OpenMP
pools are sized before numpy loads (``OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS``);
actorrt also gets ``SessionOptions.intra_op_num_threads`` when it has that
field, onnxruntime ``intra_op_num_threads`` (default graph optimizations,
``inter_op_num_threads = 1``). Per model: both sessions run once and their
outputs are compared (max abs error over the output's max abs value, printed
as ``err``), then ``--rounds`` interleaved rounds, each timing actorrt and
onnxruntime for about ``--budget`` seconds; a round's ratio is
actorrt time / onnxruntime time in that round; the table prints both medians
and the median of the per-round ratios (< 1: actorrt faster).

Models (built here with ``onnx.helper`` unless noted; random weights, fixed
seeds):

* ``mlp``: 4 x Gemm 1024x1024 (+bias), batch 64
* ``mobilenetish``: MobileNet-v1-style stem + 6 depthwise-separable blocks
  (3x3 depthwise Conv + BatchNormalization + Clip(0, 6), 1x1 Conv + BN +
  Clip), 1x3x160x160
* ``resnetish``: tests/data/resnetish.onnx (PyTorch dynamo export), 4x3x64x64
* ``encoder``: BERT-style encoder as PyTorch exports it (MatMul + Add,
  Reshape/Transpose heads, MatMul-Div-Add(mask)-Softmax-MatMul, Erf GELU,
  LayerNormalization), 4 layers, hidden 256, 4 heads, seq 128
* ``decode`` / ``prefill``: GPT-2-style decoder (4 layers, hidden 256, 4
  heads, vocab 2048) with a KV cache (Concat past + new): one token with 64
  cached positions / 64 tokens with none
* the light zoo models shipped in the ``onnx`` wheel's backend test data
  (Caffe2 conversions, batch 1, 224x224): ``resnet50``, ``densenet121``,
  ``inception_v1``, ``inception_v2``, ``squeezenet``, ``shufflenet``,
  ``vgg19``, ``bvlc_alexnet``, ``zfnet512``

The machine this runs on may be shared: only ratios of the same round mean
anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ("resnet50", "densenet121", "inception_v1", "inception_v2", "squeezenet", "shufflenet",
       "vgg19", "bvlc_alexnet", "zfnet512")
BUILT = ("mlp", "mobilenetish", "resnetish", "encoder", "decode", "prefill")
ALL = BUILT + ZOO


# ------------------------------------------------------------------ models
def _np():
    import numpy as np
    return np


def _model(nodes, inputs, outputs, inits, name, opset=17):
    from onnx import helper
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


class _B:
    """Tiny graph builder: fresh names, random initializers."""

    def __init__(self, seed: int = 0):
        self.rng = _np().random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def name(self, p: str) -> str:
        self.n += 1
        return f"{p}_{self.n}"

    def const(self, arr, p="c") -> str:
        from onnx import numpy_helper
        n = self.name(p)
        self.inits.append(numpy_helper.from_array(arr, n))
        return n

    def rand(self, shape, scale=None, p="w") -> str:
        np = _np()
        a = self.rng.standard_normal(shape).astype(np.float32)
        if scale is not None:
            a *= scale
        return self.const(a, p)

    def op(self, op, ins, n_out=1, **attrs) -> str | list[str]:
        from onnx import helper
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(ins), outs, name=self.name(op), **attrs))
        return outs[0] if n_out == 1 else outs

    def i64(self, vals) -> str:
        return self.const(_np().array(vals, dtype=_np().int64), "shape")


def mlp(batch=64, width=1024, layers=4):
    from onnx import TensorProto as TP, helper
    np = _np()
    b = _B(0)
    x = "x"
    for i in range(layers):
        x = b.op("Gemm", [x, b.rand((width, width), 1 / np.sqrt(width)), b.rand((width,))])
    b.nodes[-1].output[0] = "y"
    m = _model(b.nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [batch, width])],
               [helper.make_tensor_value_info("y", TP.FLOAT, [batch, width])], b.inits, "mlp")
    return m, {"x": b.rng.standard_normal((batch, width)).astype(np.float32)}


def _bn(b: _B, x: str, c: int) -> str:
    np = _np()
    return b.op("BatchNormalization", [x, b.const((1 + 0.1 * b.rng.standard_normal(c)).astype(np.float32)),
                                       b.rand((c,), 0.1), b.rand((c,), 0.1),
                                       b.const((0.5 + b.rng.random(c)).astype(np.float32))])


def mobilenetish(size=160):
    from onnx import TensorProto as TP, helper
    np = _np()
    b = _B(1)
    lo, hi = b.const(np.float32(0)), b.const(np.float32(6))

    def cbr(x, cin, cout, k, stride, group=1):
        w = b.rand((cout, cin // group, k, k), np.sqrt(2 / (cin // group * k * k)))
        y = b.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride],
                 pads=[k // 2] * 4, group=group)
        return b.op("Clip", [_bn(b, y, cout), lo, hi])

    x = cbr("x", 3, 32, 3, 2)
    c = 32
    for cout, stride in ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)):
        x = cbr(x, c, c, 3, stride, group=c)
        x = cbr(x, c, cout, 1, 1)
        c = cout
    x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x])
    b.op("Gemm", [x, b.rand((c, 1000), 1 / np.sqrt(c)), b.rand((1000,))])
    b.nodes[-1].output[0] = "y"
    m = _model(b.nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, size, size])],
               [helper.make_tensor_value_info("y", TP.FLOAT, None)], b.inits, "mobilenetish")
    return m, {"x": b.rng.standard_normal((1, 3, size, size)).astype(np.float32)}


def resnetish(batch=4):
    import onnx
    np = _np()
    m = onnx.load(str(ROOT / "tests/data/resnetish.onnx"))
    return m, {"pixels": np.random.default_rng(2).standard_normal((batch, 3, 64, 64)).astype(np.float32)}


def _linear(b: _B, x: str, din: int, dout: int) -> str:
    np = _np()
    return b.op("Add", [b.op("MatMul", [x, b.rand((din, dout), 1 / np.sqrt(din))]), b.rand((dout,), 0.02)])


def _layer_norm(b: _B, x: str, d: int) -> str:
    np = _np()
    return b.op("LayerNormalization", [x, b.const((1 + 0.1 * b.rng.standard_normal(d)).astype(np.float32)),
                                       b.rand((d,), 0.1)], axis=-1, epsilon=1e-5)


def _gelu_erf(b: _B, x: str) -> str:
    np = _np()
    e = b.op("Erf", [b.op("Div", [x, b.const(np.float32(np.sqrt(2)))])])
    return b.op("Mul", [b.op("Mul", [x, b.op("Add", [e, b.const(np.float32(1))])]), b.const(np.float32(0.5))])


def _heads(b: _B, x: str, h: int, dh: int, perm) -> str:
    return b.op("Transpose", [b.op("Reshape", [x, b.i64([0, 0, h, dh])])], perm=perm)


def _attention(b: _B, q: str, k: str, v: str, mask: str | None, d: int, h: int) -> str:
    np = _np()
    dh = d // h
    s = b.op("Div", [b.op("MatMul", [q, k]), b.const(np.float32(np.sqrt(dh)))])
    if mask is not None:
        s = b.op("Add", [s, mask])
    y = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
    return b.op("Reshape", [b.op("Transpose", [y], perm=[0, 2, 1, 3]), b.i64([0, 0, d])])


def encoder(layers=4, d=256, h=4, seq=128):
    from onnx import TensorProto as TP, helper
    np = _np()
    b = _B(3)
    x = "x"
    dh = d // h
    for _ in range(layers):
        q = _heads(b, _linear(b, x, d, d), h, dh, [0, 2, 1, 3])
        k = _heads(b, _linear(b, x, d, d), h, dh, [0, 2, 3, 1])
        v = _heads(b, _linear(b, x, d, d), h, dh, [0, 2, 1, 3])
        a = _linear(b, _attention(b, q, k, v, "mask", d, h), d, d)
        x = _layer_norm(b, b.op("Add", [x, a]), d)
        f = _linear(b, _gelu_erf(b, _linear(b, x, d, 4 * d)), 4 * d, d)
        x = _layer_norm(b, b.op("Add", [x, f]), d)
    b.nodes[-1].output[0] = "y"
    m = _model(b.nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, seq, d]),
                         helper.make_tensor_value_info("mask", TP.FLOAT, [1, 1, 1, seq])],
               [helper.make_tensor_value_info("y", TP.FLOAT, [1, seq, d])], b.inits, "encoder")
    mask = np.zeros((1, 1, 1, seq), np.float32)
    mask[..., seq - 9:] = -1e4  # padded tail
    return m, {"x": b.rng.standard_normal((1, seq, d)).astype(np.float32), "mask": mask}


def gpt2_decoder(layers=4, d=256, h=4, vocab=2048):
    """GPT-2-style decoder; inputs ids (1, S), mask (1, 1, S, P+S) additive,
    past_k.i / past_v.i (1, h, P, d/h); outputs logits and present_*."""
    from onnx import TensorProto as TP, helper
    np = _np()
    b = _B(4)
    dh = d // h
    emb = b.rand((vocab, d), 0.1, "wte")
    x = b.op("Gather", [emb, "ids"])
    ins = [helper.make_tensor_value_info("ids", TP.INT64, [1, "S"]),
           helper.make_tensor_value_info("mask", TP.FLOAT, [1, 1, "S", "T"])]
    outs = []
    for i in range(layers):
        y = _layer_norm(b, x, d)
        qkv = _linear(b, y, d, 3 * d)
        q, k, v = b.op("Split", [qkv, b.i64([d, d, d])], n_out=3, axis=-1)
        q = _heads(b, q, h, dh, [0, 2, 1, 3])
        k = _heads(b, k, h, dh, [0, 2, 1, 3])
        v = _heads(b, v, h, dh, [0, 2, 1, 3])
        pk, pv = f"past_k.{i}", f"past_v.{i}"
        k = b.op("Concat", [pk, k], axis=2)
        v = b.op("Concat", [pv, v], axis=2)
        b.nodes[-2].output[0] = f"present_k.{i}"
        b.nodes[-1].output[0] = f"present_v.{i}"
        k, v = f"present_k.{i}", f"present_v.{i}"
        for n in (pk, pv):
            ins.append(helper.make_tensor_value_info(n, TP.FLOAT, [1, h, "P", dh]))
        for n in (k, v):
            outs.append(helper.make_tensor_value_info(n, TP.FLOAT, [1, h, "T", dh]))
        kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
        a = _linear(b, _attention(b, q, kt, v, "mask", d, h), d, d)
        x = b.op("Add", [x, a])
        f = _linear(b, _gelu_erf(b, _linear(b, _layer_norm(b, x, d), d, 4 * d)), 4 * d, d)
        x = b.op("Add", [x, f])
    logits = b.op("MatMul", [_layer_norm(b, x, d), b.rand((d, vocab), 1 / np.sqrt(d))])
    b.nodes[-1].output[0] = "logits"
    outs.insert(0, helper.make_tensor_value_info("logits", TP.FLOAT, [1, "S", vocab]))
    return _model(b.nodes, ins, outs, b.inits, "gpt2_decoder"), (layers, h, dh, vocab)


def _gpt2_feeds(meta, s: int, p: int, seed: int):
    np = _np()
    layers, h, dh, vocab = meta
    rng = np.random.default_rng(seed)
    feeds = {"ids": rng.integers(0, vocab, (1, s)).astype(np.int64)}
    mask = np.zeros((1, 1, s, p + s), np.float32)
    mask[0, 0, :, p:][np.triu(np.ones((s, s), bool), 1)] = -1e4  # causal over the new tokens
    feeds["mask"] = mask
    for i in range(layers):
        feeds[f"past_k.{i}"] = rng.standard_normal((1, h, p, dh)).astype(np.float32)
        feeds[f"past_v.{i}"] = rng.standard_normal((1, h, p, dh)).astype(np.float32)
    return feeds


def decode():
    m, meta = gpt2_decoder()
    return m, _gpt2_feeds(meta, 1, 64, 5)


def prefill():
    m, meta = gpt2_decoder()
    return m, _gpt2_feeds(meta, 64, 0, 6)


def zoo(name: str):
    import onnx
    np = _np()
    path = Path(onnx.__file__).parent / f"backend/test/data/light/light_{name}.onnx"
    m = onnx.load(str(path))
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    rng = np.random.default_rng(7)
    for i in m.graph.input:
        if i.name in inits:
            continue
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return m, feeds


def build(name: str):
    if name in ZOO:
        return zoo(name)
    return globals()[name]()


# ------------------------------------------------------------------ timing
def _time_for(fn, budget: float) -> tuple[float, float]:
    """``(wall, cpu)`` mean seconds per call of ``fn`` over about ``budget``
    wall seconds (at least 1 call); cpu is the process's CPU time (every
    thread), which a busy machine's preemption does not inflate."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    while True:
        fn()
        n += 1
        t = time.perf_counter() - t0
        if t >= budget:
            return t / n, (time.process_time() - c0) / n


def child(threads: int, models: list[str], rounds: int, budget: float) -> None:
    import numpy as np
    import onnxruntime as ort
    sys.path.insert(0, str(ROOT))
    import actorrt

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    fields = getattr(actorrt.SessionOptions, "__attrs_attrs__", ())
    kw = {"intra_op_num_threads": threads} if any(f.name == "intra_op_num_threads" for f in fields) else {}
    for name in models:
        try:
            m, feeds = build(name)
        except FileNotFoundError as e:
            print(json.dumps({"model": name, "threads": threads, "skipped": str(e)}), flush=True)
            continue
        raw = m.SerializeToString()
        o = ort.InferenceSession(raw, so, providers=["CPUExecutionProvider"])
        try:
            a = actorrt.InferenceSession(raw, actorrt.SessionOptions(**kw))
        except Exception as e:  # report and go on with the next model
            print(json.dumps({"model": name, "threads": threads, "skipped": f"{type(e).__name__}: {e}"}),
                  flush=True)
            continue
        try:
            ra, ro = a.run(None, feeds), o.run(None, feeds)
            err = max(float(np.max(np.abs(np.asarray(x, np.float64) - y)) / max(float(np.max(np.abs(y))), 1e-30))
                      if np.asarray(y).size else 0.0 for x, y in zip(ra, ro))
            ta, to, rr, ca, co, rc = [], [], [], [], [], []
            for _ in range(rounds):
                x, xc = _time_for(lambda: a.run(None, feeds), budget)
                y, yc = _time_for(lambda: o.run(None, feeds), budget)
                ta.append(x)
                to.append(y)
                rr.append(x / y)
                ca.append(xc)
                co.append(yc)
                rc.append(xc / yc)
            fusions = len(getattr(a.session.plan, "fusions", []))
            print(json.dumps({"model": name, "threads": threads, "actorrt_ms": float(np.median(ta)) * 1e3,
                              "ort_ms": float(np.median(to)) * 1e3, "ratio": float(np.median(rr)),
                              "ratios": [round(r, 3) for r in rr], "cpu_actorrt_ms": float(np.median(ca)) * 1e3,
                              "cpu_ort_ms": float(np.median(co)) * 1e3, "cpu_ratio": float(np.median(rc)),
                              "err": err, "fusions": fusions,
                              "steps": len(a.session.plan.steps)}), flush=True)
        finally:
            a.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default=",".join(ALL))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per engine per round")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(ALL)
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}; known: {', '.join(ALL)}")
    if args.child:
        child(args.child, models, args.rounds, args.budget)
        return
    rows = []
    for t in [int(x) for x in args.threads.split(",")]:
        env = dict(os.environ)
        for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            env[v] = str(t)
        proc = subprocess.run([sys.executable, __file__, "--child", str(t), "--models", ",".join(models),
                               "--rounds", str(args.rounds), "--budget", str(args.budget)],
                              env=env, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
        if proc.returncode:
            print(f"child for {t} thread(s) exited {proc.returncode}", file=sys.stderr)
    by = {(r["model"], r["threads"]): r for r in rows}
    ts = sorted({r["threads"] for r in rows})
    print("ratio = actorrt / onnxruntime, median of per-round ratios (same run, interleaved);")
    print("wall: elapsed time; cpu: process CPU time per run (all threads), robust to a busy machine")
    head = f"{'model':<14}" + "".join(f" | {t}t ours ms  ort ms  wall  cpu    err" for t in ts)
    print(head)
    for m in models:
        line = f"{m:<14}"
        for t in ts:
            r = by.get((m, t))
            if r is None or "skipped" in r:
                line += f" | {'-':>37}"
            else:
                line += (f" | {r['actorrt_ms']:9.3f} {r['ort_ms']:7.3f} {r['ratio']:5.2f} "
                         f"{r.get('cpu_ratio', float('nan')):5.2f} {r['err']:6.0e}")
        print(line)
    for r in rows:
        if "skipped" in r:
            print(f"skipped {r['model']} at {r['threads']} thread(s): {r['skipped']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
