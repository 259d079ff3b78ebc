"""Vectorized row kernels (LLVM IR intrinsics with masked loads and stores)
shared by the compiled depthwise convolution (:mod:`._conv_numba`) and the
phase-split input copy of the direct convolution and pooling
(:mod:`._conv_direct`, :mod:`._pool_direct`).

* :data:`dw_sum` -- a depthwise plane's tap sum over its flat phase-split
  plane: ``acc[t] = bias + sum_k w[w_off + k] * ph[offs[k] + t]``, ``t < n``.
* :data:`dw_store` -- a depthwise output row with its epilogue:
  ``y[y_off + i] = min(max(where(v < 0, alpha*v, v), lo), hi)``, ``v = acc[a_off
  + i] (+ z[z_off + i])``.
* :data:`copy1` / :data:`copy2` -- ``dst[d_off + i] = src[s_off + i * step]`` at
  source stride 1 / 2 (two loads and an even-lane shuffle).
* :func:`_phase_copy` -- a plane range of ``x`` into a phase-split buffer
  row by row on those copies (any stride: scalar past 2).

All take 1-D float32 or float64 arrays (the same dtype throughout; other
dtypes are a typing error) and int offsets / counts; vectors are
:data:`._conv_direct.VW` float32 lanes (half as many float64), masked at the
ends, so nothing past the last element named is read or written. Built only
where :data:`._conv_direct.HAVE_KERNEL` (numba with AVX2 / FMA).
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

from . import _conv_direct as _cd
from . import _conv_tiles as _ct

__all__ = ["HAVE_KERNEL", "dw_sum", "dw_store", "copy1", "copy2", "phase_copy_rows"]

HAVE_KERNEL = _cd.HAVE_KERNEL

if HAVE_KERNEL:
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _f32, _i1, _i32, _i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
    _V = ir.VectorType
    _as_i64, _splat, VW = _ct.as_i64, _ct.splat, _ct.VW

    def _dw_sum_codegen(vw, nv, double):
        """``acc[t] = bias + sum_k w[k] * ph[offs[k] + t]`` for ``t < n``: the
        depthwise plane sum of :mod:`._conv_numba` over its flat phase-split
        plane, ``nv`` vectors of ``vw`` float32 lanes (``vw / 2`` float64
        lanes: ``double``) per step, masked at the end."""
        ft = ir.DoubleType() if double else _f32
        tag = "f64" if double else "f32"
        if double:
            vw //= 2

        def codegen(context, builder, sig, args):
            pa, oa, wa, aa = [context.make_array(sig.args[i])(context, builder, args[i]).data
                              for i in (0, 1, 3, 5)]
            kk, w_off, n = (_as_i64(builder, args[i]) for i in (2, 4, 6))
            bias = args[7]
            vty = _V(ft, vw)
            fast = ("fast",)
            zero = ir.Constant(vty, [0.0] * vw)
            mload = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vty, [vty.as_pointer(), _i32, _V(_i1, vw), vty]),
                f"llvm.masked.load.v{vw}{tag}.p0v{vw}{tag}")
            mstore = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), _i32,
                                                                _V(_i1, vw)]),
                f"llvm.masked.store.v{vw}{tag}.p0v{vw}{tag}")
            bv = _splat(builder, bias, vw)
            step = vw * nv
            entry = builder.block
            outer = builder.append_basic_block("dw.outer")
            inner = builder.append_basic_block("dw.inner")
            store = builder.append_basic_block("dw.store")
            done = builder.append_basic_block("dw.done")
            builder.cbranch(builder.icmp_signed(">", n, _i64(0)), outer, done)
            builder.position_at_end(outer)
            t0 = builder.phi(_i64)
            t0.add_incoming(_i64(0), entry)
            # i32 lanes against one iota (i64 lane constants per vector spilled)
            rem = builder.sub(n, t0)
            rem = builder.trunc(builder.select(builder.icmp_signed(">", rem, _i64(step)),
                                               _i64(step), rem), _i32)
            iota = ir.Constant(_V(_i32, vw), list(range(vw)))
            masks = [builder.icmp_signed("<", iota, _splat(builder, builder.sub(rem, _i32(vw * v)), vw))
                     for v in range(nv)]
            builder.branch(inner)
            builder.position_at_end(inner)
            k = builder.phi(_i64)
            k.add_incoming(_i64(0), outer)
            accs = [builder.phi(vty) for _ in range(nv)]
            for a in accs:
                a.add_incoming(bv, outer)
            base = builder.add(builder.load(builder.gep(oa, [k])), t0)
            wk = _splat(builder, builder.load(builder.gep(wa, [builder.add(w_off, k)])), vw)
            new = []
            for v in range(nv):
                xv = builder.call(mload, [_vptr_t(builder, pa, builder.add(base, _i64(vw * v)), vty),
                                          _i32(4), masks[v], zero])
                new.append(builder.fadd(accs[v], builder.fmul(wk, xv, flags=fast), flags=fast))
            k1 = builder.add(k, _i64(1))
            k.add_incoming(k1, inner)
            for a, val in zip(accs, new):
                a.add_incoming(val, inner)
            builder.cbranch(builder.icmp_signed("<", k1, kk), inner, store)
            builder.position_at_end(store)
            for v in range(nv):
                builder.call(mstore, [new[v], _vptr_t(builder, aa, builder.add(t0, _i64(vw * v)), vty),
                                      _i32(4), masks[v]])
            t1 = builder.add(t0, _i64(step))
            t0.add_incoming(t1, store)
            builder.cbranch(builder.icmp_signed("<", t1, n), outer, done)
            builder.position_at_end(done)
            return context.get_dummy_value()
        return codegen

    def _vptr_t(builder, base, index, vty):
        return builder.bitcast(builder.gep(base, [index]), vty.as_pointer())

    def _dw_store_codegen(vw, double):
        """``y[y_off + i] = min(max(where(v < 0, alpha*v, v), lo), hi)`` for
        ``v = acc[a_off + i] (+ z[z_off + i])``, ``i < n``: a depthwise row's
        store (vectors of ``vw`` float32 / ``vw / 2`` float64 lanes, masked at
        the end)."""
        ft = ir.DoubleType() if double else _f32
        tag = "f64" if double else "f32"
        if double:
            vw //= 2

        def codegen(context, builder, sig, args):
            aa, ya, za = [context.make_array(sig.args[i])(context, builder, args[i]).data
                          for i in (0, 2, 4)]
            a_off, y_off, z_off, has_z, n = (_as_i64(builder, args[i]) for i in (1, 3, 5, 6, 7))
            vty = _V(ft, vw)
            fast = ("fast",)
            zero = ir.Constant(vty, [0.0] * vw)
            mload = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vty, [vty.as_pointer(), _i32, _V(_i1, vw), vty]),
                f"llvm.masked.load.v{vw}{tag}.p0v{vw}{tag}")
            mstore = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), _i32,
                                                                _V(_i1, vw)]),
                f"llvm.masked.store.v{vw}{tag}.p0v{vw}{tag}")
            alv, lov, hiv = (_splat(builder, args[i], vw) for i in (8, 9, 10))
            zflag = _splat(builder, builder.icmp_signed("!=", has_z, _i64(0)), vw, ty=_i1)
            entry = builder.block
            loop = builder.append_basic_block("dws.loop")
            done = builder.append_basic_block("dws.done")
            builder.cbranch(builder.icmp_signed(">", n, _i64(0)), loop, done)
            builder.position_at_end(loop)
            i = builder.phi(_i64)
            i.add_incoming(_i64(0), entry)
            rem = builder.sub(n, i)
            rem = builder.trunc(builder.select(builder.icmp_signed(">", rem, _i64(vw)), _i64(vw), rem),
                                _i32)
            mask = builder.icmp_signed("<", ir.Constant(_V(_i32, vw), list(range(vw))),
                                       _splat(builder, rem, vw))
            v = builder.call(mload, [_vptr_t(builder, aa, builder.add(a_off, i), vty), _i32(4),
                                     mask, zero])
            zv = builder.call(mload, [_vptr_t(builder, za, builder.add(z_off, i), vty), _i32(4),
                                      builder.and_(mask, zflag), zero])
            v = builder.fadd(v, zv, flags=fast)
            v = builder.select(builder.fcmp_ordered("<", v, zero), builder.fmul(v, alv, flags=fast), v)
            v = builder.select(builder.fcmp_ordered("<", v, lov), lov, v)
            v = builder.select(builder.fcmp_ordered(">", v, hiv), hiv, v)
            builder.call(mstore, [v, _vptr_t(builder, ya, builder.add(y_off, i), vty), _i32(4), mask])
            i1 = builder.add(i, _i64(vw))
            i.add_incoming(i1, loop)
            builder.cbranch(builder.icmp_signed("<", i1, n), loop, done)
            builder.position_at_end(done)
            return context.get_dummy_value()
        return codegen

    def _dw_store_typer(typingctx, acc, a_off, y, y_off, z, z_off, has_z, n, alpha, lo, hi):
        dt = getattr(acc, "dtype", None)
        if dt not in (types.float32, types.float64) or y.dtype != dt or z.dtype != dt or \
                any(v != dt for v in (alpha, lo, hi)):
            return None
        return (types.void(acc, a_off, y, y_off, z, z_off, has_z, n, alpha, lo, hi),
                _dw_store_codegen(VW, dt == types.float64))

    _dw_store_typer.__name__ = f"_dw_store_{VW}"
    #: a depthwise row's store with its epilogue, see :func:`_dw_store_codegen`
    dw_store = intrinsic(_dw_store_typer)

    def _copy_codegen(vw, step, double):
        """``dst[d_off + i] = src[s_off + i * step]`` for ``i < n`` (``step`` 1
        or 2: two loads and an even-lane shuffle), vectors of ``vw`` float32 /
        ``vw / 2`` float64 lanes, masked at the end (nothing read past
        ``src[s_off + (n - 1) * step]``)."""
        ft = ir.DoubleType() if double else _f32
        tag = "f64" if double else "f32"
        if double:
            vw //= 2

        def codegen(context, builder, sig, args):
            sa, da = [context.make_array(sig.args[i])(context, builder, args[i]).data for i in (0, 2)]
            s_off, d_off, n = (_as_i64(builder, args[i]) for i in (1, 3, 4))
            vty = _V(ft, vw)
            zero = ir.Constant(vty, [0.0] * vw)
            mload = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vty, [vty.as_pointer(), _i32, _V(_i1, vw), vty]),
                f"llvm.masked.load.v{vw}{tag}.p0v{vw}{tag}")
            mstore = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), _i32,
                                                                _V(_i1, vw)]),
                f"llvm.masked.store.v{vw}{tag}.p0v{vw}{tag}")
            iota = ir.Constant(_V(_i32, vw), list(range(vw)))

            def lanes_below(count):  # lanes j < count (count clamped to [.., 2 vw])
                c = builder.select(builder.icmp_signed(">", count, _i64(2 * vw)), _i64(2 * vw), count)
                return builder.icmp_signed("<", iota, _splat(builder, builder.trunc(c, _i32), vw))

            entry = builder.block
            loop = builder.append_basic_block("copy.loop")
            done = builder.append_basic_block("copy.done")
            builder.cbranch(builder.icmp_signed(">", n, _i64(0)), loop, done)
            builder.position_at_end(loop)
            i = builder.phi(_i64)
            i.add_incoming(_i64(0), entry)
            left = builder.sub(n, i)
            src = builder.add(s_off, builder.mul(i, _i64(step)))
            if step == 1:
                v = builder.call(mload, [_vptr_t(builder, sa, src, vty), _i32(4), lanes_below(left), zero])
            else:
                need = builder.sub(builder.mul(left, _i64(2)), _i64(1))  # source elements left
                lo_ = builder.call(mload, [_vptr_t(builder, sa, src, vty), _i32(4), lanes_below(need), zero])
                hi_ = builder.call(mload, [_vptr_t(builder, sa, builder.add(src, _i64(vw)), vty), _i32(4),
                                           lanes_below(builder.sub(need, _i64(vw))), zero])
                v = builder.shuffle_vector(lo_, hi_, ir.Constant(_V(_i32, vw), list(range(0, 2 * vw, 2))))
            builder.call(mstore, [v, _vptr_t(builder, da, builder.add(d_off, i), vty), _i32(4),
                                  lanes_below(left)])
            i1 = builder.add(i, _i64(vw))
            i.add_incoming(i1, loop)
            builder.cbranch(builder.icmp_signed("<", i1, n), loop, done)
            builder.position_at_end(done)
            return context.get_dummy_value()
        return codegen

    def _copy_intrinsic(step):
        def typer(typingctx, src, s_off, dst, d_off, n):
            dt = getattr(src, "dtype", None)
            if dt not in (types.float32, types.float64) or dst.dtype != dt:
                return None
            return types.void(src, s_off, dst, d_off, n), _copy_codegen(VW, step, dt == types.float64)
        typer.__name__ = f"_copy{step}_{VW}"
        return intrinsic(typer)

    #: vector row copies at source stride 1 / 2, see :func:`_copy_codegen`
    copy1, copy2 = _copy_intrinsic(1), _copy_intrinsic(2)

    @njit(nogil=True, cache=True)
    def _phase_copy(xf, buf, table, c, h, w, nphase, hi, wj, sw, start, stop):  # pragma: no cover
        """Planes ``[start, stop)`` (image * C + channel) of ``x`` into the
        phase-split buffer: per row of table ``(phase, i0, i1, j0, j1, r0,
        c0)``, padded rows ``i0 <= i < i1`` / columns ``[j0, j1)`` of phase
        plane ``phase`` from input row ``r0 + (i - i0) * SH``, columns ``c0,
        c0 + SW, ...`` (``SH`` folded into the table's next row: rows step
        by table[k, 7])."""
        for pl in range(start, stop):
            src_plane = pl * h * w
            dst_plane = pl * nphase * hi * wj
            for k in range(table.shape[0]):
                q, i0, i1, j0, j1, r0, c0, sh = (table[k, 0], table[k, 1], table[k, 2], table[k, 3],
                                                 table[k, 4], table[k, 5], table[k, 6], table[k, 7])
                cnt = j1 - j0
                for i in range(i0, i1):
                    so = src_plane + (r0 + (i - i0) * sh) * w + c0
                    do = dst_plane + (q * hi + i) * wj + j0
                    if sw == 1:
                        copy1(xf, so, buf, do, cnt)
                    elif sw == 2:
                        copy2(xf, so, buf, do, cnt)
                    else:
                        for j in range(cnt):
                            buf[do + j] = xf[so + j * sw]

    def _dw_sum_typer(typingctx, ph, offs, kk, w, w_off, acc, n, bias):
        dt = getattr(ph, "dtype", None)
        if dt not in (types.float32, types.float64) or any(
                getattr(a, "dtype", None) != dt for a in (w, acc)) or bias != dt:
            return None  # float32 / float64 arrays and a bias of their dtype only
        return (types.void(ph, offs, kk, w, w_off, acc, n, bias),
                _dw_sum_codegen(VW, 8, dt == types.float64))

    _dw_sum_typer.__name__ = f"_dw_sum_{VW}x8"
    #: the depthwise plane sum (float32 / float64, ``kk >= 1`` taps), see
    #: :func:`_dw_sum_codegen`
    dw_sum = intrinsic(_dw_sum_typer)

    #: public name of :func:`_phase_copy`
    phase_copy_rows = _phase_copy
