"""FP8 training: the formats (`formats.py`), the scaling recipes that choose each tensor's
scale (`scaling.py`: per-tensor current and delayed, DeepSeek-V3's tiles and blocks), the
scaled GEMMs and a model of limited-precision accumulation (`gemm.py`), and the Linear whose
three products run on FP8 operands (`linear.py`). The precision policy (minitensor.amp)
carries the recipe; the layers it leaves in higher precision are named in `linear.py`."""
