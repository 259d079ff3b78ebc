"""Checks :func:`actorrt._model.load_model` runs before anything reads a model.

* :mod:`.tensors` — every tensor a model carries, wherever it sits
  (initializers, sparse initializers, ``Constant`` values and every TENSOR /
  TENSORS / SPARSE_TENSOR / SPARSE_TENSORS attribute of the main graph, its
  subgraphs, model-local functions and training graphs): inline data of the
  size the type and shape claim; external data whose location is a relative
  path that stays inside the model's folder (symlinks resolved), with offsets
  and lengths that are numbers inside the file. Models given without a
  folder (bytes, ``ModelProto``) refuse every external reference. After
  deserialization every ``onnx_ir.ExternalTensor`` is pointed at the model's
  folder and checked again, so no later pass (inlining, constant folding)
  can read a file that escaped the first check.
* :mod:`.graph` — structural validity: onnx's checker plus the checks it
  skips (graph outputs nothing produces, undefined node inputs, control-flow
  bodies with the wrong number of inputs or outputs, attributes of the wrong
  type, values assigned twice, domains without an opset import).

* :mod:`.nchwc` — not a check: files onnxruntime saved at ``ORT_ENABLE_ALL``
  carry ``com.microsoft.nchwc`` ops and filters reordered for its blocked
  layout; they become standard ops on unblocked tensors before any pass.
* :mod:`.contrib_types` — not a check: after onnx's shape inference, the
  value types behind com.microsoft nodes, which onnx has no schemas for.

Every refusal is a :class:`~actorrt.ModelLoadError` naming the model and the
tensor, node or value involved.
"""
