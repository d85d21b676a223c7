"""Chapter 17, part 2: the sparsity/accuracy curve of the addition GPT (`python -m parallel.smaller_models prune`).

    python tutorials/17_smaller_models/prune_curve.py [--sparsity 0.5 0.75 0.9] [--finetune-steps 300]

Trains the teacher once (cached), then for each sparsity: zero that share of the blocks'
weights by magnitude (over all blocks at once), score held-out exact match, fine-tune with
the mask re-applied after every step, score again. Two more rows: the dense teacher
fine-tuned alike (the control) and half its heads and MLP neurons removed (structured).
"""
import sys

from parallel.smaller_models.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["prune", *sys.argv[1:]]))
