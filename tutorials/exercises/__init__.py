"""The learner track (`python -m tutorials.exercises`): stubs and checks derived from the
exercise markers in the library, so the library itself is the answer key.

    markers.py    find, check and stub the `# exercise NN.k: title` ... `# end exercise` fences
    catalog.py    the quick tests that check each exercise
    workspace.py  the learner's copy of the checkout, fence by fence; an exercise judged alone
    wrong.py      the plausible wrong answers of wrong_answers/NN.toml, planted as mutants
    __main__.py   the commands: list, start, check, diff, reset, wrong
"""
