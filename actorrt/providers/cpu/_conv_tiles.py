"""LLVM IR of the direct convolution's micro-kernels (:mod:`._conv_direct`),
built with llvmlite and called from numba as intrinsics; the stage between the
plans and drivers of :mod:`._conv_direct` and the machine code.

* :func:`row_tile_codegen` -- kinds 0-3: ``MR`` output channels x ``VW * NV``
  consecutive output columns of one row (or 2 / 4 short rows, merge-masked
  loads), vectors over columns, the epilogue in a masked store;
* :func:`channel_tile_codegen` -- kinds 4-6: ``P`` pixels of one row x ``16 *
  NV`` output channels, vectors over channels, the store scattered;
* :func:`tile_intrinsic` -- the numba intrinsic of either, one signature for
  all kinds (see :func:`._conv_direct._rows` for the arguments);
* :data:`HAVE_KERNEL`, :data:`VW` -- whether the host can run them, and their
  float lanes; ``as_i64``, ``vec_ptr``, ``splat``, ``open_loop``,
  ``close_loop`` -- IR helpers shared with the other direct kernels
  (:mod:`._pool_direct`, :mod:`._conv_vec`, :mod:`._dw_blocked`).
* :func:`readable`, :func:`empty_with_slack` -- the arrays these kernels read
  and write with masked vectors, made safe to over-address (below).

Masked vectors and absent pages: the row tiles, row copies and row stores
load and store whole vectors under a lane mask, so a row's last vector
addresses up to :data:`OVERRUN_BYTES` past the row (inside the array except
after its last row). A masked load or store whose masked-off lanes reach a
page that is not present (never touched, or given back to the system) takes
a microcode assist on AMD Zen, on every call, and where arrays happen to land
in a long-lived process decides which layers pay (docs/speed.md rounds 11 and
13: 1.1-8x a convolution's time; a grouped 1x1 conv 1.24x, a depthwise conv
2x). So outputs get :data:`OVERRUN_BYTES` of slack and every page touched
before the kernel runs (:func:`empty_with_slack`), and an input whose end lies within them of a page
end is read from a copy that has the slack (:func:`readable`: ~3 % of
placements, one copy).
"""

from __future__ import annotations

__all__ = ["HAVE_KERNEL", "VW", "OVERRUN_BYTES", "row_tile_codegen", "channel_tile_codegen",
           "tile_intrinsic", "as_i64", "vec_ptr", "splat", "open_loop", "close_loop", "copy_f32",
           "overrun_leaves_page", "readable", "empty_with_slack"]

import math

import numpy as np

#: bytes a row's last masked vector may address past the row's last element
#: (two 16-float vectors less one float, with room to spare)
OVERRUN_BYTES = 128
_PAGE = 4096


def _leaves_page_py(a: np.ndarray, over: int) -> bool:
    end = a.ctypes.data + a.nbytes
    return (end - 1) // _PAGE != (end - 1 + over) // _PAGE


def _alloc_py(n: int, slack: int, dtype) -> np.ndarray:
    buf = np.empty(n + slack, dtype)
    buf[:n:max(1, _PAGE // buf.itemsize)] = 0
    buf[n:] = 0
    return buf


_leaves_page, _alloc = _leaves_page_py, _alloc_py
try:  # compiled: a Python-level address or two slice fills cost ~1-3 us a call
    from numba import njit as _njit

    @_njit(nogil=True, cache=True)
    def _leaves_page(a, over):  # pragma: no cover - compiled
        end = a.ctypes.data + a.size * a.itemsize
        return (end - 1) // _PAGE != (end - 1 + over) // _PAGE

    @_njit(nogil=True, cache=True)
    def _alloc_typed(n, slack, like):  # pragma: no cover - compiled
        buf = np.empty(n + slack, like.dtype)
        step = max(1, _PAGE // like.itemsize)
        for i in range(0, n, step):
            buf[i] = 0
        for i in range(n, n + slack):
            buf[i] = 0
        return buf

    _LIKE = {np.dtype(np.float32): np.zeros(1, np.float32), np.dtype(np.float64): np.zeros(1, np.float64)}

    def _alloc(n: int, slack: int, dtype) -> np.ndarray:
        like = _LIKE.get(dtype)
        return _alloc_py(n, slack, dtype) if like is None else _alloc_typed(n, slack, like)
except Exception:  # pragma: no cover - exercised only without numba
    pass


#: make the arrays safe to over-address (off: plain arrays, the A/B baseline)
SLACK = True
#: ... outputs from this many bytes: a smaller one has few row ends and pages
#: to reach, and the allocation with slack (~1 us more than ``np.empty``) cost
#: the decode step's 17 one-row products 7 % (resnetish 4 %)
SLACK_MIN_BYTES = 64 << 10


def overrun_leaves_page(a: np.ndarray) -> bool:
    """Whether addressing :data:`OVERRUN_BYTES` past ``a``'s last byte
    crosses into another page (``a`` C-contiguous)."""
    return bool(a.size) and bool(_leaves_page(a, OVERRUN_BYTES))


def readable(a: np.ndarray) -> np.ndarray:
    """C-contiguous ``a`` itself, or where :func:`overrun_leaves_page` a copy
    (same shape and dtype) in a buffer :data:`OVERRUN_BYTES` longer, the slack
    zeroed."""
    if not SLACK or not overrun_leaves_page(a):
        return a
    buf = _alloc(a.size, -(-OVERRUN_BYTES // a.itemsize), a.dtype)
    buf[:a.size] = a.reshape(-1)
    return buf[:a.size].reshape(a.shape)


def empty_with_slack(shape, dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` (from :data:`SLACK_MIN_BYTES`) in a buffer
    :data:`OVERRUN_BYTES` longer,
    the slack zeroed and one element of every page written: a row's masked
    store also addresses the start of the next row, which may lie in a page
    not written yet, and fresh memory's pages are not present until written."""
    dtype = np.dtype(dtype)
    n = math.prod(shape)
    if not SLACK or n * dtype.itemsize < SLACK_MIN_BYTES:
        return np.empty(shape, dtype)
    return _alloc(n, -(-OVERRUN_BYTES // dtype.itemsize), dtype)[:n].reshape(shape)


try:
    import numba  # noqa: F401
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
    from numba.core import cgutils
    import llvmlite.binding as _llvm
    _features = _llvm.get_host_cpu_features()
    # compiling for another CPU (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES): the AVX2
    # intrinsics may not exist there, so the BLAS path runs
    HAVE_KERNEL = bool(_features.get("avx2") and _features.get("fma")) and not (
        numba.config.CPU_NAME or numba.config.CPU_FEATURES)
except Exception:  # pragma: no cover - exercised only without numba / AVX2
    HAVE_KERNEL = False

#: float lanes of the tile's vectors: 16 (``<16 x float>``, zmm) where the
#: host has AVX-512F, else 8 (ymm). The 16-lane tiles load the input with
#: ``llvm.masked.load`` (lanes past the row's end are not read), so a 1x1
#: stride-1 unpadded convolution reads ``x`` in place (no phase-split copy)
VW = 16 if HAVE_KERNEL and _features.get("avx512f") else 8

if HAVE_KERNEL:
    _f32, _i1, _i32, _i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
    _V = ir.VectorType

    def _as_i64(builder, v):
        return v if v.type == _i64 else builder.sext(v, _i64)

    def _vptr(builder, base, index, n=8):
        return builder.bitcast(builder.gep(base, [index]), _V(_f32, n).as_pointer())

    def _splat(builder, value, n=8, ty=None):
        ty = ty or value.type
        vec = builder.insert_element(ir.Constant(_V(ty, n), None), value, _i32(0))
        return builder.shuffle_vector(vec, ir.Constant(_V(ty, n), None),
                                      ir.Constant(_V(_i32, n), [0] * n))

    #: IR helpers shared with the other direct kernels (:mod:`._pool_direct`)
    as_i64, vec_ptr, splat = _as_i64, _vptr, _splat

    @intrinsic
    def copy_f32(typingctx, dst, d_off, src, s_off, n):
        """``dst[d_off : d_off + n] = src[s_off : s_off + n]`` for float32
        arrays as one ``memcpy`` (no overlap, in bounds: the caller's rule).
        numba's slice assignment checks for overlap and copies element by
        element: 2.5-4.5x numpy's copy of the same rows."""
        if getattr(dst, "dtype", None) != types.float32 or \
                getattr(src, "dtype", None) != types.float32:
            return None

        def codegen(context, builder, sig, args):
            da = context.make_array(sig.args[0])(context, builder, args[0]).data
            sa = context.make_array(sig.args[2])(context, builder, args[2]).data
            do, so, cnt = (context.cast(builder, args[i], sig.args[i], types.int64)
                           for i in (1, 3, 4))
            cgutils.raw_memcpy(builder, builder.gep(da, [do]), builder.gep(sa, [so]), cnt, 4)
            return context.get_dummy_value()
        return types.void(dst, d_off, src, s_off, n), codegen

    def _tile_args(context, builder, sig, args):
        """The tile intrinsic's arguments: arrays ``(xs, offs, wp, y, bias,
        z)`` (data pointers), the ints ``(x_off, nr, w_off, y_off, y_stride,
        ncols, b_off, has_z, mvalid, r0, flags, row_w, x_rstride)`` (i64) and
        the floats ``(lo, hi, alpha)``."""
        arrays = [context.make_array(sig.args[i])(context, builder, args[i]).data
                  for i in (0, 2, 4, 6, 10, 12)]
        ints = [_as_i64(builder, args[i]) for i in (1, 3, 5, 7, 8, 9, 11, 13, 17, 18, 19, 20, 21)]
        return arrays, ints, (args[14], args[15], args[16])

    def _open_loop(builder, nr, naccs, zero, name, start=0, inits=None):
        """Enter the loop ``r in [start, nr)`` (``start`` an int or an i64
        value): ``(entry, loop, done, r, accs)``, the accumulators' phis
        starting at ``zero`` (or at the values ``inits``, one per
        accumulator)."""
        inits = inits or [zero] * naccs
        st = start if isinstance(start, ir.Value) else _i64(start)
        entry = builder.block
        loop = builder.append_basic_block(f"{name}.loop")
        done = builder.append_basic_block(f"{name}.done")
        builder.cbranch(builder.icmp_signed(">", nr, st), loop, done)
        builder.position_at_end(loop)
        r = builder.phi(_i64)
        r.add_incoming(st, entry)
        accs = [builder.phi(v.type) for v in inits]
        for phi, v in zip(accs, inits):
            phi.add_incoming(v, entry)
        return entry, loop, done, r, accs

    def _close_loop(builder, nr, entry, loop, done, r, accs, new, zero, inits=None):
        """Close the loop of :func:`_open_loop` on the accumulators' ``new``
        values; returns their values after it (their starting values where
        the loop did not run). Every phi opens the ``done`` block."""
        inits = inits or [zero] * len(new)
        r1 = builder.add(r, _i64(1))
        r.add_incoming(r1, loop)
        for phi, val in zip(accs, new):
            phi.add_incoming(val, loop)
        builder.cbranch(builder.icmp_signed("<", r1, nr), loop, done)
        builder.position_at_end(done)
        finals = []
        for val, v0 in zip(new, inits):
            phi = builder.phi(val.type)
            phi.add_incoming(v0, entry)
            phi.add_incoming(val, loop)
            finals.append(phi)
        return finals

    #: the reduction loop's IR (shared with :mod:`._dw_blocked`, :mod:`._pool_direct`)
    open_loop, close_loop = _open_loop, _close_loop

    def _epilogue(builder, acc, prev, bias, zv, alv, lov, hiv, final, zero):
        """``raw = acc + prev``; on the last reduction block (``final``)
        ``min(max(where(v < 0, alpha*v, v), lo), hi)`` of ``v = raw + bias +
        zv``, else ``raw`` (sums stored for the next block)."""
        fast = ("fast",)
        raw = builder.fadd(acc, prev, flags=fast)
        val = builder.fadd(builder.fadd(raw, bias, flags=fast), zv, flags=fast)
        val = builder.select(builder.fcmp_ordered("<", val, zero),
                             builder.fmul(val, alv, flags=fast), val)
        val = builder.select(builder.fcmp_ordered("<", val, lov), lov, val)
        val = builder.select(builder.fcmp_ordered(">", val, hiv), hiv, val)
        return builder.select(final, val, raw)

    def row_tile_codegen(mr, nv, vw=8, rpt=1):
        def codegen(context, builder, sig, args):
            (xa, oa, wa, ya, ba, za), ints, (lo, hi, alpha) = _tile_args(context, builder, sig, args)
            (x_off, nr, w_off, y_off, y_stride, ncols, b_off, has_z, mvalid, r0, flags, row_w,
             x_rstride) = ints
            v8f = _V(_f32, vw)
            masked = vw == 16 or rpt > 1  # AVX-512: masked input loads cost nothing extra
            fast = ("fast",)
            zero = ir.Constant(v8f, [0.0] * vw)
            mstore = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [v8f, v8f.as_pointer(), _i32,
                                                                _V(_i1, vw)]),
                f"llvm.masked.store.v{vw}f32.p0v{vw}f32")
            mload = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v8f, [v8f.as_pointer(), _i32, _V(_i1, vw), v8f]),
                f"llvm.masked.load.v{vw}f32.p0v{vw}f32")
            lanes = [builder.icmp_signed(
                "<", ir.Constant(_V(_i64, vw), list(range(vw * v, vw * v + vw))),
                _splat(builder, ncols, vw)) for v in range(nv)]
            row_lanes, shifts = [], []
            if rpt > 1:
                lane_ix = ir.Constant(_V(_i64, vw), list(range(vw)))
                for j in range(rpt):
                    lo_j = _splat(builder, builder.mul(row_w, _i64(j)), vw)
                    hi_j = _splat(builder, builder.mul(row_w, _i64(j + 1)), vw)
                    row_lanes.append(builder.and_(lanes[0], builder.and_(
                        builder.icmp_signed(">=", lane_ix, lo_j),
                        builder.icmp_signed("<", lane_ix, hi_j))))
                    shifts.append(builder.mul(builder.sub(x_rstride, row_w), _i64(j)))
            entry, loop, done, r, accs = _open_loop(builder, nr, mr * nv, zero, "dconv")
            xb = builder.add(x_off, builder.load(builder.gep(oa, [builder.add(r0, r)])))
            if rpt > 1:  # lanes [j*row_w, (j+1)*row_w): output row j of the tile
                v = zero
                for j in range(rpt):
                    v = builder.call(mload, [_vptr(builder, xa, builder.add(xb, shifts[j]), vw),
                                             _i32(4), row_lanes[j], v])
                xv = [v]
            elif masked:
                xv = [builder.call(mload, [_vptr(builder, xa, builder.add(xb, _i64(vw * v)), vw),
                                           _i32(4), lanes[v], zero]) for v in range(nv)]
            else:
                xv = [builder.load(_vptr(builder, xa, builder.add(xb, _i64(vw * v)), vw), align=4)
                      for v in range(nv)]
            wb = builder.add(w_off, builder.mul(r, _i64(mr)))
            new = []
            for m in range(mr):
                wm = _splat(builder, builder.load(builder.gep(wa, [builder.add(wb, _i64(m))])), vw)
                for v in range(nv):
                    new.append(builder.fadd(accs[m * nv + v],
                                            builder.fmul(wm, xv[v], flags=fast), flags=fast))
            finals = _close_loop(builder, nr, entry, loop, done, r, accs, new, zero)
            lov, hiv, alv = (_splat(builder, s, vw) for s in (lo, hi, alpha))
            zflag = builder.icmp_signed("!=", has_z, _i64(0))
            # flags bit 0: add onto y's values (a later reduction block); bit 1:
            # apply the epilogue (the last block)
            accumulate = _splat(builder, builder.icmp_signed(
                "!=", builder.and_(flags, _i64(1)), _i64(0)), vw, ty=_i1)
            final = builder.icmp_signed("!=", builder.and_(flags, _i64(2)), _i64(0))
            for m in range(mr):
                row_ok = _splat(builder, builder.icmp_signed("<", _i64(m), mvalid), vw, ty=_i1)
                bm = _splat(builder, builder.load(builder.gep(ba, [builder.add(b_off, _i64(m))])), vw)
                base = builder.add(y_off, builder.mul(y_stride, _i64(m)))
                for v in range(nv):
                    mask = builder.and_(lanes[v], row_ok)
                    at = builder.add(base, _i64(vw * v))
                    prev = builder.call(mload, [_vptr(builder, ya, at, vw), _i32(4),
                                                builder.and_(mask, accumulate), zero])
                    zmask = builder.and_(mask, _splat(builder, zflag, vw, ty=_i1))
                    zv = builder.call(mload, [_vptr(builder, za, at, vw), _i32(4), zmask, zero])
                    val = _epilogue(builder, finals[m * nv + v], prev, bm, zv, alv, lov, hiv,
                                    final, zero)
                    builder.call(mstore, [val, _vptr(builder, ya, at, vw), _i32(4), mask])
            return context.get_dummy_value()
        return codegen

    def channel_tile_codegen(npix, nv, vw=16):
        """Kinds 4-6: ``npix`` pixels x ``nv * vw`` output channels, vectors
        over channels (:data:`._conv_direct.BLOCKS`); the arguments are the
        row tiles'."""
        def codegen(context, builder, sig, args):
            (xa, oa, wa, ya, ba, za), ints, (lo, hi, alpha) = _tile_args(context, builder, sig, args)
            x_off, nr, w_off, y_off, y_stride, ncols, b_off, has_z, mvalid, r0, flags = ints[:11]
            vf = _V(_f32, vw)
            vi = _V(_i64, vw)
            vp = _V(_f32.as_pointer(), vw)
            fast = ("fast",)
            zero = ir.Constant(vf, [0.0] * vw)
            mask_t = _V(_i1, vw)
            gather = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vf, [vp, _i32, mask_t, vf]),
                f"llvm.masked.gather.v{vw}f32.v{vw}p0f32")
            scatter = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [vf, vp, _i32, mask_t]),
                f"llvm.masked.scatter.v{vw}f32.v{vw}p0f32")
            mload = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vf, [vf.as_pointer(), _i32, mask_t, vf]),
                f"llvm.masked.load.v{vw}f32.p0v{vw}f32")
            # pixels past the row read its last valid pixel (an address that exists)
            last = builder.sub(ncols, _i64(1))
            pofs = [builder.select(builder.icmp_signed("<", _i64(p), ncols), _i64(p), last)
                    for p in range(npix)]
            entry, loop, done, r, accs = _open_loop(builder, nr, npix * nv, zero, "ctile")
            xb = builder.add(x_off, builder.load(builder.gep(oa, [builder.add(r0, r)])))
            wb = builder.add(w_off, builder.mul(r, _i64(vw * nv)))
            wv = [builder.load(_vptr(builder, wa, builder.add(wb, _i64(vw * v)), vw), align=4)
                  for v in range(nv)]
            new = []
            for p in range(npix):
                xv = _splat(builder, builder.load(builder.gep(xa, [builder.add(xb, pofs[p])])), vw)
                for v in range(nv):
                    new.append(builder.fadd(accs[p * nv + v],
                                            builder.fmul(wv[v], xv, flags=fast), flags=fast))
            finals = _close_loop(builder, nr, entry, loop, done, r, accs, new, zero)
            lov, hiv, alv = (_splat(builder, s, vw) for s in (lo, hi, alpha))
            zflag = _splat(builder, builder.icmp_signed("!=", has_z, _i64(0)), vw, ty=_i1)
            accumulate = _splat(builder, builder.icmp_signed(
                "!=", builder.and_(flags, _i64(1)), _i64(0)), vw, ty=_i1)
            final = builder.icmp_signed("!=", builder.and_(flags, _i64(2)), _i64(0))
            y_base = _splat(builder, builder.ptrtoint(ya, _i64), vw)
            z_base = _splat(builder, builder.ptrtoint(za, _i64), vw)
            stride4 = _splat(builder, builder.mul(y_stride, _i64(4)), vw)
            for v in range(nv):
                ch = ir.Constant(vi, list(range(vw * v, vw * v + vw)))
                ch_ok = builder.icmp_signed("<", ch, _splat(builder, mvalid, vw))
                bv = builder.call(mload, [_vptr(builder, ba, builder.add(b_off, _i64(vw * v)), vw),
                                          _i32(4), ch_ok, zero])
                rel = builder.mul(ch, stride4)  # byte offsets of the channels' rows
                for p in range(npix):
                    pix_ok = _splat(builder, builder.icmp_signed("<", _i64(p), ncols), vw, ty=_i1)
                    mask = builder.and_(ch_ok, pix_ok)
                    at = _splat(builder, builder.mul(builder.add(y_off, _i64(p)), _i64(4)), vw)
                    off = builder.add(rel, at)
                    yp = builder.inttoptr(builder.add(y_base, off), vp)
                    zp = builder.inttoptr(builder.add(z_base, off), vp)
                    prev = builder.call(gather, [yp, _i32(4), builder.and_(mask, accumulate), zero])
                    zv = builder.call(gather, [zp, _i32(4), builder.and_(mask, zflag), zero])
                    val = _epilogue(builder, finals[p * nv + v], prev, bv, zv, alv, lov, hiv,
                                    final, zero)
                    builder.call(scatter, [val, yp, _i32(4), mask])
            return context.get_dummy_value()
        return codegen

    def tile_intrinsic(mr, nv, rpt, codegen=None):
        def typer(typingctx, xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols,
                  bias, b_off, z, has_z, lo, hi, alpha, mvalid, r0, flags, row_w, x_rstride):
            return (types.void(xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols,
                               bias, b_off, z, has_z, lo, hi, alpha, mvalid, r0, flags, row_w,
                               x_rstride),
                    codegen or row_tile_codegen(mr, nv, VW, rpt))
        typer.__name__ = f"_dconv_tile_{mr}x{nv}x{VW}r{rpt}" + ("c" if codegen else "")
        return intrinsic(typer)

