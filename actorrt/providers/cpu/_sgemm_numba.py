"""A compiled float32 GEMM for constant right operands: AVX-512 register tiles
written as LLVM IR through numba intrinsics, bias and activation applied in
the tile's store.

Why: numpy's OpenBLAS runs its Haswell (AVX2) sgemm on this machine's
setting (``OPENBLAS_CORETYPE=Haswell``), about half of the AVX-512 peak,
and pays a separate numpy pass for every bias / activation. The constant
``B`` ``(K, N)`` of a MatMul / Gemm / MatMulEpilogue is packed once into
``ceil(N / 32)`` column panels ``(K, 32)`` (zero padded); a tile is ``r``
rows of ``A`` (``r`` <= 8) times one panel: 2 x ``r`` ``<16 x float>``
accumulators over the whole ``K`` (``A`` scalars broadcast, one FMA per
accumulator per ``k``), then ``+ bias``, the activation (none / Relu /
erf-GELU with :data:`.math.ERF32_RATIONAL`), and a masked store of the
panel's real columns (outputs get :func:`._conv_tiles.empty_with_slack`'s
slack: the store's masked-off lanes address past the last row). Rows are taken in blocks whose ``A`` stays in L2,
every panel of a block at a time (the panel, 32 ``K``-floats wide, stays in
L1 across the block's tiles).

Measured (one thread, this machine, interleaved with numpy's OpenBLAS):
64 x 1024 x 1024 0.64 vs 1.8 ms (210 vs ~75 GFLOP/s); one row (a decode
step's GEMV) 256 x 768 7.9 vs 8.3 us, 1024 x 256 10 vs 25 us; every shape
of the bench models at least as fast (docs/speed.md, round 7).

Threads: from :data:`PARTNER_MIN_FLOPS` :func:`gemm` splits the column
panels into ``2 x threads`` ranges claimed by the caller and its compiled
partner threads (:mod:`._partner`, no Python hand-off; :data:`USE_PARTNERS`
False: one range per thread on the Python chunk loop,
:func:`._parallel.run_chunks`, from :data:`PARALLEL_MIN_FLOPS`); below, one
call on the caller.

:func:`bmm`: batched products with a non-constant ``B`` (attention's two
products), ``B`` packed per batch entry inside the compiled call.

Available (:data:`HAVE_SGEMM`) with numba on an x86-64 host whose LLVM
reports AVX-512F (no ``NUMBA_CPU_NAME`` override); otherwise the callers
keep BLAS (:mod:`._matmul_split`).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import platform

import numpy as np

from . import _conv_tiles as _ct  # the outputs' slack for the masked stores

from .math import ERF32_RATIONAL

__all__ = ["HAVE_SGEMM", "NR", "ACT_CODES", "PackedB", "GemmCall", "prepare_call", "row_block",
           "gemm", "run", "bmm", "gemm_panels_range", "PARALLEL_MIN_FLOPS", "PARTNER_MIN_FLOPS",
           "BMM_MIN_ROWS", "USE_PARTNERS", "ENABLED", "PREPARED_CALLS"]

#: output columns per panel (two 16-float vectors)
NR = 32
#: activation name -> code of the tile epilogue
ACT_CODES = {"": 0, "Relu": 1, "Gelu": 2}
#: products of at least this many flops (2 M N K) are split over the intra-op
#: threads (below, the hand-off through the chunk loop costs more than it saves)
PARALLEL_MIN_FLOPS = 1 << 21
#: with compiled partner threads (:mod:`._partner`, no Python hand-off) the
#: split starts at this many flops. Measured under load 4-5 on the 2 cores
#: (benchmarks/ab_partners.py, partners on / off): from 1 << 17 (every decode
#: GEMV split) the decode step was 1.15-1.17x slower (the partner got no
#: core: autogroup shares one group's CPU among our threads, and its spinning
#: took the caller's share); the encoder's GEMMs 0.79-0.89x. So the split
#: started where the Python chunk loop's did, until an idle machine was
#: measured (round 11, load < 1.3, 8 rounds): from 1 << 18 (every decode GEMV
#: but the 256 x 256 one) the GPT-2-style decode step ran 0.83-0.86x the time
#: of the unsplit one at 2 threads (0.336 vs 0.404 ms; 1 << 17 the same), at
#: about twice the CPU time (the partner spins between the products, as
#: onnxruntime's pool does by default)
PARTNER_MIN_FLOPS = 1 << 18
#: split through the compiled partners (False: the Python chunk loop)
USE_PARTNERS = True
#: the float32 A budget of a row block (bytes): the block's rows stay in L2
_ROW_BLOCK_BYTES = 1 << 18
#: :func:`bmm` declines products of fewer rows (M): packing B per batch entry
#: costs more than it saves there (decode attention, M = 1: 10 vs 3 us a
#: (4 x 1 x 64) @ (4 x 64 x 65); break-even near M = 16, 64 x 64 operands)
BMM_MIN_ROWS = 24
#: switch for comparisons (False: every caller takes its BLAS path)
ENABLED = True
#: column-panel ranges a thread of the partner split (help-first: a partner
#: that starts late finds ranges left)
PANEL_CHUNKS_PER_THREAD = 2
#: constant operands keep a prepared call per shape (:class:`GemmCall`; False:
#: every call through :func:`run`, for A/B runs)
PREPARED_CALLS = True


def _host_has_avx512() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        import numba
        import llvmlite.binding as ll
        if numba.config.CPU_NAME or numba.config.CPU_FEATURES:
            return False  # compiling for another CPU: AVX-512 may not exist there
        return bool(ll.get_host_cpu_features().get("avx512f", False))
    except Exception:  # pragma: no cover - numba / llvmlite missing
        return False


HAVE_SGEMM = _host_has_avx512()

if HAVE_SGEMM:
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _i1, _i32, _i64, _f32 = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.FloatType()
    _V = ir.VectorType
    _V16 = _V(_f32, 16)
    _P = [float(c) for c in ERF32_RATIONAL[0]]
    _Q = [float(c) for c in ERF32_RATIONAL[1]]

    def _i64v(builder, v):
        return v if v.type == _i64 else builder.sext(v, _i64)

    def _vptr(builder, base, index):
        return builder.bitcast(builder.gep(base, [index]), _V16.as_pointer())

    def _splat(builder, value, vty):
        return builder.shuffle_vector(
            builder.insert_element(ir.Constant(vty, None), value, _i32(0)),
            ir.Constant(vty, None), ir.Constant(_V(_i32, vty.count), [0] * vty.count))

    def _cst(x):
        return ir.Constant(_V16, [x] * 16)

    def _gelu_ir(builder, fma, vmin, vmax, v):
        # 0.5 v (1 + erf(v / sqrt 2)), erf as _gelu_numba._gelu (clamped rational)
        u = builder.fmul(v, _cst(0.7071067811865476))
        u = builder.call(vmax, [builder.call(vmin, [u, _cst(4.0)]), _cst(-4.0)])
        u2 = builder.fmul(u, u)
        pp = _cst(_P[0])
        for c in _P[1:]:
            pp = builder.call(fma, [pp, u2, _cst(c)])
        qq = _cst(_Q[0])
        for c in _Q[1:]:
            qq = builder.call(fma, [qq, u2, _cst(c)])
        e = builder.fdiv(builder.fmul(u, pp), qq)
        return builder.fmul(builder.fmul(_cst(0.5), v), builder.fadd(_cst(1.0), e))

    def _tile_codegen(rows):
        def codegen(context, builder, sig, args):
            def data(i):
                return context.make_array(sig.args[i])(context, builder, args[i]).data
            a, p, c, bias = data(0), data(3), data(6), data(9)
            a_off, lda, p_off, k, c_off, ldc, b_off, ncols, act = (
                _i64v(builder, args[i]) for i in (1, 2, 4, 5, 7, 8, 10, 11, 12))
            mod = builder.module
            fma = cgutils.get_or_insert_function(
                mod, ir.FunctionType(_V16, [_V16, _V16, _V16]), "llvm.fma.v16f32")
            vmax = cgutils.get_or_insert_function(
                mod, ir.FunctionType(_V16, [_V16, _V16]), "llvm.maxnum.v16f32")
            vmin = cgutils.get_or_insert_function(
                mod, ir.FunctionType(_V16, [_V16, _V16]), "llvm.minnum.v16f32")
            mstore = cgutils.get_or_insert_function(
                mod, ir.FunctionType(ir.VoidType(), [_V16, _V16.as_pointer(), _i32,
                                                     _V(_i1, 16)]),
                "llvm.masked.store.v16f32.p0")
            zero = _cst(0.0)
            entry = builder.block
            loop = builder.append_basic_block("sgemm.loop")
            done = builder.append_basic_block("sgemm.done")
            builder.cbranch(builder.icmp_signed(">", k, _i64(0)), loop, done)
            builder.position_at_end(loop)
            kk = builder.phi(_i64)
            kk.add_incoming(_i64(0), entry)
            accs = [[builder.phi(_V16) for _ in range(2)] for _ in range(rows)]
            for row in accs:
                for phi in row:
                    phi.add_incoming(zero, entry)
            pb = builder.add(p_off, builder.mul(kk, _i64(NR)))
            b0 = builder.load(_vptr(builder, p, pb), align=4)
            b1 = builder.load(_vptr(builder, p, builder.add(pb, _i64(16))), align=4)
            new = []
            for r in range(rows):
                at = builder.add(builder.add(a_off, builder.mul(lda, _i64(r))), kk)
                sv = _splat(builder, builder.load(builder.gep(a, [at])), _V16)
                new.append([builder.call(fma, [sv, b0, accs[r][0]]),
                            builder.call(fma, [sv, b1, accs[r][1]])])
            k1 = builder.add(kk, _i64(1))
            kk.add_incoming(k1, loop)
            for r in range(rows):
                for h in range(2):
                    accs[r][h].add_incoming(new[r][h], loop)
            builder.cbranch(builder.icmp_signed("<", k1, k), loop, done)
            builder.position_at_end(done)
            fin = []
            for r in range(rows):
                pair = []
                for h in range(2):
                    phi = builder.phi(_V16)
                    phi.add_incoming(zero, entry)
                    phi.add_incoming(new[r][h], loop)
                    pair.append(phi)
                fin.append(pair)
            iota = ir.Constant(_V(_i64, 16), list(range(16)))
            masks = [builder.icmp_signed("<", iota, _splat(
                builder, builder.sub(ncols, _i64(16 * h)), _V(_i64, 16))) for h in range(2)]
            bvs = [builder.load(_vptr(builder, bias, builder.add(b_off, _i64(16 * h))), align=4)
                   for h in range(2)]
            vals = [[builder.fadd(fin[r][h], bvs[h]) for h in range(2)] for r in range(rows)]
            # activation: 1 Relu, 2 GELU (branches: the GELU only where asked)
            pre = builder.block
            relu_bb = builder.append_basic_block("sgemm.relu")
            gelu_bb = builder.append_basic_block("sgemm.gelu")
            store_bb = builder.append_basic_block("sgemm.store")
            sw = builder.switch(act, store_bb)
            sw.add_case(_i64(1), relu_bb)
            sw.add_case(_i64(2), gelu_bb)
            builder.position_at_end(relu_bb)
            relu = [[builder.call(vmax, [v, zero]) for v in row] for row in vals]
            builder.branch(store_bb)
            builder.position_at_end(gelu_bb)
            gelu = [[_gelu_ir(builder, fma, vmin, vmax, v) for v in row] for row in vals]
            builder.branch(store_bb)
            builder.position_at_end(store_bb)
            outs = []
            for r in range(rows):  # every phi first
                for h in range(2):
                    phi = builder.phi(_V16)
                    phi.add_incoming(vals[r][h], pre)
                    phi.add_incoming(relu[r][h], relu_bb)
                    phi.add_incoming(gelu[r][h], gelu_bb)
                    outs.append(phi)
            for r in range(rows):
                crow = builder.add(c_off, builder.mul(ldc, _i64(r)))
                for h in range(2):
                    builder.call(mstore, [outs[2 * r + h],
                                          _vptr(builder, c, builder.add(crow, _i64(16 * h))),
                                          _i32(4), masks[h]])
            return context.get_dummy_value()
        return codegen

    def _tile_intrinsic(rows):
        def typer(typingctx, a, a_off, lda, p, p_off, k, c, c_off, ldc, bias, b_off, ncols, act):
            return (types.void(a, a_off, lda, p, p_off, k, c, c_off, ldc, bias, b_off, ncols,
                               act), _tile_codegen(rows))
        typer.__name__ = f"_sgemm_tile{rows}"
        return intrinsic(typer)

    _t8, _t7, _t6, _t5, _t4, _t3, _t2, _t1 = (_tile_intrinsic(r) for r in range(8, 0, -1))

    @njit(nogil=True, cache=True)
    def gemm_panels_range(a, p, bias, out, j0, j1, act, row_block):  # pragma: no cover - compiled
        # out[:, panels j0..j1) = act(a @ B + bias); a (M, K), out (M, N)
        # C-contiguous float32, p (NP, K, NR) the packed B, bias (NP * NR,)
        m, k = a.shape
        n = out.shape[1]
        af = a.reshape(-1)
        pf = p.reshape(-1)
        cf = out.reshape(-1)
        i0 = 0
        while i0 < m:
            i1 = min(m, i0 + row_block)
            for j in range(j0, j1):
                nc = min(NR, n - j * NR)
                po = j * k * NR
                bo = j * NR
                i = i0
                while i + 8 <= i1:
                    _t8(af, i * k, k, pf, po, k, cf, i * n + bo, n, bias, bo, nc, act)
                    i += 8
                r = i1 - i
                ao = i * k
                co = i * n + bo
                if r == 7:
                    _t7(af, ao, k, pf, po, k, cf, co, n, bias, bo, nc, act)
                elif r == 6:
                    _t6(af, ao, k, pf, po, k, cf, co, n, bias, bo, nc, act)
                elif r == 5:
                    _t5(af, ao, k, pf, po, k, cf, co, n, bias, bo, nc, act)
                elif r == 4:
                    _t4(af, ao, k, pf, po, k, cf, co, n, bias, bo, nc, act)
                elif r == 3:
                    _t3(af, ao, k, pf, po, k, cf, co, n, bias, bo, nc, act)
                elif r == 2:
                    _t2(af, ao, k, pf, po, k, cf, co, n, bias, bo, nc, act)
                elif r == 1:
                    _t1(af, ao, k, pf, po, k, cf, co, n, bias, bo, nc, act)
            i0 = i1


    @njit(nogil=True, cache=True)
    def bmm_entries(a, b, out, row_block, i0, i1):  # pragma: no cover - compiled
        """out[i] = a[i] @ b[i] for batch entries i0 .. i1 - 1: a (Bt, M, K)
        C-contiguous float32, b (Bt, K, N) float32 any strides (packed here
        per entry), out (Bt, M, N) C-contiguous float32."""
        k = a.shape[2]
        n = b.shape[2]
        npan = (n + NR - 1) // NR
        p = np.zeros((npan, k, NR), np.float32)  # pad columns stay zero
        bias = np.zeros(npan * NR, np.float32)
        for i in range(i0, i1):
            bi = b[i]
            for j in range(npan):
                c0 = j * NR
                nc = min(NR, n - c0)
                for kk in range(k):
                    for c in range(nc):
                        p[j, kk, c] = bi[kk, c0 + c]
            gemm_panels_range(a[i], p, bias, out[i], 0, npan, 0, row_block)

    @njit(nogil=True, cache=True)
    def _bmm(a, b, out, row_block):  # pragma: no cover - compiled
        # every batch entry (bmm_entries)
        bmm_entries(a, b, out, row_block, 0, a.shape[0])

    @njit(nogil=True, cache=True)
    def _gemm_nd(a, p, bias, out, act, row_block):  # pragma: no cover - compiled
        # gemm_panels_range over every panel, a (..., K) / out (..., N) C-contiguous
        k = p.shape[1]
        n = out.shape[-1]
        m = a.size // k
        gemm_panels_range(a.reshape(m, k), p, bias, out.reshape(m, n), 0, p.shape[0], act,
                          row_block)


def row_block(k: int) -> int:
    """Rows of A a block of the compiled GEMM takes for a reduction of ``k``
    (its float32 rows within ``_ROW_BLOCK_BYTES``, L2; a multiple of 8, at
    least 8)."""
    return max(8, (_ROW_BLOCK_BYTES // (4 * max(k, 1))) // 8 * 8)


def bmm(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
        threads: int = 1) -> np.ndarray | None:
    """``np.matmul(a, b)`` for float32 ``a`` ``(..., M, K)`` and ``b``
    ``(..., K, N)`` of the same batch shape (any strides: ``b`` is packed per
    batch entry inside the compiled call, ``a`` made contiguous): a fresh
    float32 array ``(..., M, N)``, every batch entry on the calling thread;
    with ``threads`` > 1, several entries and at least
    :data:`PARTNER_MIN_FLOPS`, the entries split over the caller and its
    compiled partner threads (:func:`._partner.bmm_entries`).
    None when it does not apply (no kernel, fewer than :data:`BMM_MIN_ROWS`
    rows, other dtypes or ranks, batch
    shapes that differ or broadcast, an empty dim, an ``out`` that is not a
    C-contiguous writeable float32 array of the result's shape)."""
    if not (HAVE_SGEMM and ENABLED) or a.dtype != np.float32 or b.dtype != np.float32 or \
            a.ndim < 3 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or \
            a.shape[-1] != b.shape[-2] or a.size == 0 or b.size == 0 or \
            a.shape[-2] < BMM_MIN_ROWS:
        return None
    lead = a.shape[:-2]
    m, k = a.shape[-2:]
    n = b.shape[-1]
    bt = a.size // (m * k)
    a3 = np.ascontiguousarray(a).reshape(bt, m, k)
    b3 = b.reshape(bt, k, n)  # a view for the usual (transposed-view) operands, else a copy
    if out is None:
        out = _ct.empty_with_slack(lead + (m, n), np.float32)
    elif out.shape != lead + (m, n) or out.dtype != np.float32 or \
            not out.flags.c_contiguous or not out.flags.writeable or \
            _ct.overrun_leaves_page(out):
        return None  # (the tiles' masked store may address past out's end)
    rb = row_block(k)
    out3 = out.reshape(bt, m, n)
    if threads > 1 and bt > 1 and USE_PARTNERS and 2 * bt * m * n * k >= PARTNER_MIN_FLOPS:
        from . import _partner
        team = _partner.team(threads)
        if team is not None and _partner.bmm_entries(team, a3, b3, out3, rb, min(bt, 2 * threads)):
            return out
    _bmm(a3, b3, out3, rb)
    return out


class PackedB:
    """A constant float32 ``b`` ``(K, N)`` packed for :func:`gemm`: ``panels``
    ``(ceil(N / 32), K, 32)`` zero padded, and the padded bias rows made
    from it (:meth:`bias_row`).

    Raises:
        ValueError: ``b`` not 2-D float32.
    """

    __slots__ = ("k", "n", "panels", "row_block", "_zero_bias", "_biases")

    def __init__(self, b: np.ndarray):
        if b.ndim != 2 or b.dtype != np.float32:
            raise ValueError(f"PackedB needs a 2-D float32 matrix, got {b.dtype} {b.shape}")
        k, n = b.shape
        npan = -(-n // NR)
        padded = np.zeros((k, npan * NR), np.float32)
        padded[:, :n] = b
        self.k, self.n = k, n
        #: rows of A per block (its float32 rows within _ROW_BLOCK_BYTES, L2)
        self.row_block = row_block(k)
        self.panels = np.ascontiguousarray(padded.reshape(k, npan, NR).transpose(1, 0, 2))
        self._zero_bias = np.zeros(npan * NR, np.float32)
        self._biases: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def bias_row(self, bias: np.ndarray | None) -> np.ndarray:
        """``bias`` (``(N,)`` float32, or None: zeros) padded to the panels'
        width; the copy of a given bias array is kept (constants repeat)."""
        if bias is None:
            return self._zero_bias
        hit = self._biases.get(id(bias))
        if hit is not None and hit[0] is bias:
            return hit[1]
        row = np.zeros(self.panels.shape[0] * NR, np.float32)
        row[:self.n] = bias.reshape(-1)
        if len(self._biases) < 8:
            self._biases[id(bias)] = (bias, row)
        return row


def gemm(a: np.ndarray, packed: PackedB, bias: np.ndarray | None = None, act: str = "",
         threads: int = 1) -> np.ndarray:
    """``act(a @ B + bias)`` for float32 ``a`` ``(..., M, K)`` and the packed
    ``B`` ``(K, N)``: a fresh C-contiguous float32 array ``(..., M, N)``.
    ``bias``: float32 ``(N,)`` or None; ``act``: a key of :data:`ACT_CODES`;
    ``threads``: intra-op threads (column panels split from
    :data:`PARTNER_MIN_FLOPS`, module docstring).

    Raises:
        ValueError: ``a``'s last dim is not ``K``, a dtype is not float32, or
        an unknown activation.
        KernelError: the kernel is not available here (:data:`HAVE_SGEMM`).
    """
    if not HAVE_SGEMM:  # pragma: no cover - callers check HAVE_SGEMM
        from ..._errors import KernelError
        raise KernelError("the compiled sgemm needs numba on an AVX-512 host")
    k, n = packed.k, packed.n
    if a.dtype != np.float32 or a.ndim < 1 or a.shape[-1] != k:
        raise ValueError(f"gemm: a {a.dtype} {a.shape} does not match B ({k}, {n}) float32")
    if act not in ACT_CODES:
        raise ValueError(f"gemm: unknown activation {act!r}")
    if bias is not None and (bias.dtype != np.float32 or bias.size != n):
        raise ValueError(f"gemm: bias {bias.dtype} {bias.shape} is not float32 ({n},)")
    return run(a, packed, bias, ACT_CODES[act], threads)


def run(a: np.ndarray, packed: PackedB, bias: np.ndarray | None, code: int,
        threads: int) -> np.ndarray:
    """:func:`gemm` without its checks (the caller made them; ``code`` an
    :data:`ACT_CODES` value): the per-call path of the kernels."""
    k, n = packed.k, packed.n
    if a.ndim == 2 and a.flags.c_contiguous:
        m = a.shape[0]
        a2 = a
        out = out2 = _ct.empty_with_slack((m, n), np.float32)
    elif k and a.flags.c_contiguous:  # (..., M, K) rows as one matrix, views only
        m = a.size // k
        a2 = a.reshape(m, k)
        out = _ct.empty_with_slack(a.shape[:-1] + (n,), np.float32)
        out2 = out.reshape(m, n)
    else:
        lead = a.shape[:-1]
        m = a.size // k if k else int(np.prod(lead))
        out = _ct.empty_with_slack(lead + (n,), np.float32)
        a2 = np.ascontiguousarray(a.reshape(m, k)) if m and k else a
        out2 = out.reshape(m, n)
    if m == 0 or n == 0:
        return out
    if k == 0:
        out[...] = 0 if bias is None else bias.reshape(-1)
        return _epilogue_only(out, code)
    brow = packed.bias_row(bias)
    npan = packed.panels.shape[0]
    if threads > 1 and npan > 1:
        flops = 2 * m * n * k
        if USE_PARTNERS and flops >= PARTNER_MIN_FLOPS:
            from . import _partner
            team = _partner.team(threads)
            if team is not None:
                _partner.gemm_panels(team, a2, packed.panels, brow, out2, code, packed.row_block,
                                     min(npan, PANEL_CHUNKS_PER_THREAD * threads))
                return out
        if flops >= PARALLEL_MIN_FLOPS:
            from . import _parallel
            parts = min(threads, npan)
            size = -(-npan // parts)
            rb = packed.row_block

            def chunk(i: int) -> None:
                gemm_panels_range(a2, packed.panels, brow, out2, i * size,
                                  min(npan, (i + 1) * size), code, rb)
            _parallel.run_chunks(chunk, -(-npan // size), parts)
            return out
    gemm_panels_range(a2, packed.panels, brow, out2, 0, npan, code, packed.row_block)
    return out


_F32 = np.dtype(np.float32)


class GemmCall:
    """:func:`run` prepared for one shape of ``a`` (C-contiguous float32),
    one packed ``B``, bias array and activation at one thread count
    (:func:`prepare_call`): a decode step's one-row projection spent ~2 µs of
    Python around a ~2 µs kernel in :func:`run`'s shape work, the bias
    lookup and the split decision. :meth:`fits` is a few identity and shape
    tests; :meth:`run` allocates the output and makes the same kernel calls
    as :func:`run` (the same bits)."""

    __slots__ = ("shape", "packed", "bias", "act", "code", "threads", "out_shape", "m", "brow",
                 "team_chunks", "slack", "switches")

    def __init__(self, shape, packed, bias, act, threads):
        self.shape, self.packed, self.bias, self.act = shape, packed, bias, act
        self.code = ACT_CODES[act]
        self.threads = threads
        k, n = packed.k, packed.n
        self.out_shape = shape[:-1] + (n,)
        self.m = m = int(np.prod(shape[:-1], dtype=np.int64))
        self.brow = packed.bias_row(bias)
        npan = packed.panels.shape[0]
        # run's rule: the partners from PARTNER_MIN_FLOPS (0: one thread here)
        split = threads > 1 and npan > 1 and USE_PARTNERS and 2 * m * n * k >= PARTNER_MIN_FLOPS
        self.team_chunks = min(npan, PANEL_CHUNKS_PER_THREAD * threads) if split else 0
        self.slack = m * n * 4 >= _ct.SLACK_MIN_BYTES
        # the split switches this call was made under (tests and A/B runs flip them)
        self.switches = (USE_PARTNERS, PARTNER_MIN_FLOPS, PANEL_CHUNKS_PER_THREAD)

    def fits(self, a, bias, act, threads) -> bool:
        """Whether this call takes these operands (else :func:`run`)."""
        return (a.shape == self.shape and bias is self.bias and act == self.act
                and threads == self.threads and a.dtype is _F32 and a.flags.c_contiguous
                and ENABLED and PREPARED_CALLS and self.switches[0] is USE_PARTNERS
                and self.switches[1] == PARTNER_MIN_FLOPS
                and self.switches[2] == PANEL_CHUNKS_PER_THREAD)

    def run(self, a: np.ndarray) -> np.ndarray:
        """``act(a @ B + bias)``, a fresh array ``a.shape[:-1] + (N,)``."""
        out = (_ct.empty_with_slack(self.out_shape, _F32) if self.slack
               else np.empty(self.out_shape, _F32))
        packed = self.packed
        if self.team_chunks:
            from . import _partner
            team = _partner.team(self.threads)
            if team is not None:
                k = packed.k
                _partner.gemm_panels(team, a.reshape(self.m, k), packed.panels, self.brow,
                                     out.reshape(self.m, packed.n), self.code, packed.row_block,
                                     self.team_chunks)
                return out
        _gemm_nd(a, packed.panels, self.brow, out, self.code, packed.row_block)
        return out


def prepare_call(a: np.ndarray, packed: PackedB, bias: np.ndarray | None, act: str,
                 threads: int) -> GemmCall | None:
    """A :class:`GemmCall` for ``a``'s shape (``act`` a key of
    :data:`ACT_CODES`), or None where :func:`run` takes
    another route: ``a`` not C-contiguous float32 (numpy's own dtype object)
    or empty, ``K`` 0, one panel split over the chunk loop (from
    :data:`PARALLEL_MIN_FLOPS` without partners), or the kernel off."""
    if not (HAVE_SGEMM and ENABLED and PREPARED_CALLS) or a.dtype is not _F32 or \
            not a.flags.c_contiguous or a.ndim < 1 or a.size == 0 or packed.k == 0 or \
            packed.n == 0 or a.shape[-1] != packed.k:
        return None
    call = GemmCall(a.shape, packed, bias, act, threads)
    if call.team_chunks:
        from . import _partner
        if not _partner.AVAILABLE:
            return None  # run's chunk-loop split
    npan = packed.panels.shape[0]
    flops = 2 * call.m * packed.n * packed.k
    if not call.team_chunks and threads > 1 and npan > 1 and flops >= PARALLEL_MIN_FLOPS:
        return None  # run's chunk-loop split (no partners here)
    return call


def _epilogue_only(out: np.ndarray, code: int) -> np.ndarray:
    if code == 1:
        np.maximum(out, 0, out=out)
    elif code == 2:
        from ._epilogue import gelu_inplace
        gelu_inplace(out)
    return out
