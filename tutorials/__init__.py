"""The tutorials as a package, so that `python -m tutorials.exercises` runs from the checkout root.

Not installed (setup.cfg packages only minitensor and parallel): the chapters are read
and run from a checkout.
"""
