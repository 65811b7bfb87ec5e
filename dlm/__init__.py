"""dlm: the shared core of the diffusion-LM library (model, cache, attention, checkpoints,
LLaDA baseline sampler). ``bd3lm`` and ``fastdllm`` import it; it imports neither."""

from .cache import KVCache
from .checkpoints import load_model, save_model
from .model import ModelConfig, Transformer

__all__ = ["KVCache", "ModelConfig", "Transformer", "load_model", "save_model"]
__version__ = "0.1.0"
