"""In-process A/B of the compiled partner job kinds at 2 threads: LayerNorm /
softmax rows and ScaledDotAttention's passes over the partners (on) against
the chunk loop / heads path (off), one session, interleaved rounds in
alternating order; the GEMMs split over the partners either way.

    python benchmarks/ab_partner_kinds.py MODEL [THREADS]

``MODEL``: a :mod:`bench_models` name (encoder, prefill). Prints wall and
process CPU ms per run of each mode and the per-round on/off medians. Set
``OPENBLAS_NUM_THREADS`` / ``NUMBA_NUM_THREADS`` to THREADS as bench_models does.
"""

from __future__ import annotations

import statistics as st
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    import actorrt
    import bench_models
    from actorrt.providers.cpu import _layernorm_numba as ln, _softmax_numba as sm, attention as at
    name = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    m, feeds = bench_models.build(name)
    s = actorrt.InferenceSession(m.SerializeToString(),
                                 actorrt.SessionOptions(intra_op_num_threads=threads))
    real = at._partner_split

    def setmode(on: bool) -> None:
        ln.USE_PARTNERS = sm.USE_PARTNERS = on
        at._partner_split = real if on else (lambda *a: False)

    res: dict[bool, list] = {True: [], False: []}
    for mode in (True, False):
        setmode(mode)
        for _ in range(10):
            s.run(None, feeds)
    for r in range(8):
        for mode in ((True, False) if r % 2 == 0 else (False, True)):
            setmode(mode)
            t0, c0, n = time.perf_counter(), time.process_time(), 0
            while time.perf_counter() - t0 < 0.4:
                s.run(None, feeds)
                n += 1
            res[mode].append(((time.perf_counter() - t0) / n * 1e3,
                              (time.process_time() - c0) / n * 1e3))
    for mode in res:
        print(f"{name} {'partners' if mode else 'chunk loop'} wall "
              f"{st.median(x[0] for x in res[mode]):.3f} cpu {st.median(x[1] for x in res[mode]):.3f}")
    pairs = list(zip(res[True], res[False]))
    print(f"{name} on/off per-round median: wall {st.median(a[0] / b[0] for a, b in pairs):.3f} "
          f"cpu {st.median(a[1] / b[1] for a, b in pairs):.3f}")
    s.close()


if __name__ == "__main__":
    main()
