"""The CPU provider's LLM fast path: the quantized contrib kernels an LLM
decode graph runs and the plan fusions that turn its decoder blocks into
compiled kernels.

Map (every module is private to this package and the CPU provider):

* :mod:`._contrib_quant` -- com.microsoft MatMulNBits and GatherBlockQuantized
  (registered on the CPU kernel registry when :mod:`..contrib` imports them).
* :mod:`._contrib_int8` -- MatMulNBits with int8 activations
  (``accuracy_level=4``): the weight layouts and the dispatch; its stages
  :mod:`._int8_quant` (per-32-value activation quantization) and
  :mod:`._int8_tiles` (the AVX2 integer block dot-product tile kernels),
  :mod:`._int8_wide` (decode batches of 2-31 rows: 16-column zmm tiles,
  4-bit and, with AVX-512 VNNI, 8-bit weights) and
  :mod:`._int8_panel` (prompts: tiles against an unpacked panel).
* :mod:`._contrib_numba` -- numba kernels of MatMulNBits (float activations),
  GroupQueryAttention, RMS norm, rotary embedding; thread-count control.
* :mod:`._contrib_gqa` -- com.microsoft GroupQueryAttention (registered via
  :mod:`..contrib`).
* :mod:`._fused` -- what the fusions share: the step graph, slot names,
  running the original kernels on a fallback.
* :mod:`._fusion` -- decoder-block fusion and the fused decoder stack:
  pattern matching, the DecoderBlock/DecoderStack kernels.
* :mod:`._block_kernels` -- their compiled code: the float32 block, the int8
  parallel region's stage program and the stack's region over many layers.
* :mod:`._prologue` -- input-prologue fusions (mask lengths, quantized
  embedding gather).
* :mod:`.paged` -- the public hook of a block-paged KV cache: the pool array
  type and the block table the attention kernels read
  (:mod:`actorrt.genai.kv_cache` owns the cache).
* :mod:`._paged_kernels` -- attention through a block table (the stack's
  attention stage, GroupQueryAttention's paged path); :mod:`._paged_block`
  -- the float32 decoder block on a paged cache.
* :mod:`._flash` -- the tiled causal attention of prompt rows (a prefill or a
  chunk; online softmax per query tile x key tile), contiguous or paged,
  float32 or float16 pools: called by the stack's attention stage and both
  GroupQueryAttention paths.

Nothing is imported here: the kernels register when :mod:`..contrib` imports
them (the CPU provider's package imports every public op module).
"""
