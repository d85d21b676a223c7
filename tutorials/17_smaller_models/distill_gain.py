"""Chapter 17, part 3: a student under 1/4 of the teacher's size, trained alone and distilled
(`python -m parallel.smaller_models distill`).

    python tutorials/17_smaller_models/distill_gain.py [--seeds 0 1 2] [--steps 800] [--alpha 0.5] [--temperature 2]

For each seed the same student (same initial weights, same batches, same steps) is trained
once on the labels alone and once on α·CE + (1−α)·T²·KL(teacher ‖ student); prints each
held-out exact match and the medians over the seeds.
"""
import sys

from parallel.smaller_models.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["distill", *sys.argv[1:]]))
