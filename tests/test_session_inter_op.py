"""Inter-op parallelism against the intra-op thread count
(``actorrt._session.inter_op_parallel``): a CPU-only plan whose
``intra_op_num_threads`` takes more than half the cores runs its branches
one after another; other settings keep ``parallel_execution`` as given.
Results against onnxruntime either way."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort

import actorrt
from actorrt._session import inter_op_parallel
from tests.models import two_branch


class _P:
    def __init__(self, name):
        self.name = name


def test_rule():
    opts = actorrt.SessionOptions
    cpu, gpu = [_P("cpu")], [_P("cpu"), _P("cuda")]
    assert inter_op_parallel(opts(), cpu, cores=2)
    assert inter_op_parallel(opts(intra_op_num_threads=0), cpu, cores=2)
    assert inter_op_parallel(opts(intra_op_num_threads=1), cpu, cores=2)
    assert not inter_op_parallel(opts(intra_op_num_threads=2), cpu, cores=2)
    assert not inter_op_parallel(opts(intra_op_num_threads=3), cpu, cores=4)
    assert inter_op_parallel(opts(intra_op_num_threads=2), cpu, cores=4)
    assert inter_op_parallel(opts(intra_op_num_threads=2), gpu, cores=2)
    assert not inter_op_parallel(opts(parallel_execution=False), cpu, cores=64)


def test_branches_one_after_another_when_the_kernels_take_the_cores():
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    m = two_branch()
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    cores = os.cpu_count() or 1
    for threads, many in ((None, True), (cores, False)):
        opts = actorrt.SessionOptions(segment_threshold_us=0.0, intra_op_num_threads=threads)
        with actorrt.InferenceSession(m, opts) as s:
            assert (len(s.session.plan.segments) >= 2) == many
            assert s.session.runs_blocking == (not many)
            got = s.run(None, {"x": x})
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
