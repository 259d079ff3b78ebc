"""The public surface is pinned: nothing leaks or vanishes by accident."""

import actorrt
import actorrt.genai
import actorrt.providers


def test_top_level_names():
    assert sorted(actorrt.__all__) == sorted([
        "ActorRTError", "DeviceIoBinding", "GenerationError", "IOBinding", "InferenceSession",
        "InvalidArgumentError", "KernelError", "ModelLoadError", "NodeArg", "OutOfMemoryError",
        "ProviderBrokenError", "Session", "SessionClosedError", "SessionOptions", "Tensor",
        "TransferStatistics", "UnsupportedOperatorError", "__version__", "open_session",
        "RunCancelledError", "RunOptions", "SessionForkedError",
        "ProviderUnavailableWarning"])
    for name in actorrt.__all__:
        assert getattr(actorrt, name) is not None


def test_errors_share_one_base():
    for name in ("GenerationError", "InvalidArgumentError", "KernelError", "ModelLoadError",
                 "OutOfMemoryError", "ProviderBrokenError", "SessionClosedError",
                 "UnsupportedOperatorError", "RunCancelledError", "SessionForkedError"):
        assert issubclass(getattr(actorrt, name), actorrt.ActorRTError)


def test_genai_and_provider_names():
    assert sorted(actorrt.genai.__all__) == sorted([
        "Engine", "EngineStatistics", "GenerationResult", "open_engine", "SamplingParams",
        "prepare_model", "Tokenizer"])
    assert callable(actorrt.genai.prepare_model)
    for name in ("Cost", "Supported", "Unsupported", "require", "deny", "Kernel",
                 "ExecutionProvider", "KernelSizedOutput", "WorkspaceRequest",
                 "CaptureSupport"):
        assert name in actorrt.providers.__all__
