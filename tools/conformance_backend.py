"""Adapter for ../shared/tools/conformance/run_node_suite.py:
``--backend tools/conformance_backend.py:make``. CPU provider only, our own
kernels only."""

import actorrt


def make(model_path: str):
    return _Rep(actorrt.InferenceSession(model_path, providers=["cpu"]))


class _Rep:
    def __init__(self, sess):
        self.sess = sess

    def run(self, feeds):
        return self.sess.run(None, feeds)
