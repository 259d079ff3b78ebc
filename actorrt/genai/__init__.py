"""LLM generation on actorrt: GGUF -> ONNX builder, tokenizer, and an async
engine that streams tokens and batches many requests per step.

    async with actorrt.genai.open_engine(model="smollm2") as engine:
        async for piece in engine.stream("The capital of France is",
                                         actorrt.genai.SamplingParams(max_new_tokens=32)):
            print(piece, end="")
"""

from .engine import Engine, EngineStatistics, GenerationResult, open_engine
from .sampling import SamplingParams

__all__ = ["Engine", "EngineStatistics", "GenerationResult", "open_engine", "SamplingParams",
           "prepare_model", "Tokenizer"]


def __getattr__(name):
    # builder/tokenizer pull in gguf/tokenizers: import them on first use
    if name == "prepare_model":
        from .models import prepare_model
        return prepare_model
    if name == "Tokenizer":
        from .tokenizer import Tokenizer
        return Tokenizer
    raise AttributeError(name)
