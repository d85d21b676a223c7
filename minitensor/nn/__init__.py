"""Neural-network building blocks: Module, Parameter and the layers of a GPT."""
from minitensor.nn import functional, utils
from minitensor.nn.layers import GELU, Dropout, Embedding, LayerNorm, Linear
from minitensor.nn.module import Module, ModuleList, Parameter

__all__ = ["functional", "utils", "Module", "ModuleList", "Parameter", "Linear", "Embedding",
           "LayerNorm", "Dropout", "GELU"]
