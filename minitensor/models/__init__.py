from minitensor.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
