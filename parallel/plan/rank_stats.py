"""Rank statistics for comparing predicted and measured orders: Spearman's rho, Kendall's
tau, and the chain of measurements further apart than their noise."""

def ranks(values):
    """1-based rank of each value (ties share the mean rank)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(a, b):
    """Pearson correlation of the ranks."""
    ra, rb = ranks(a), ranks(b)
    mean = (len(a) + 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(ra, rb))
    var = (sum((x - mean) ** 2 for x in ra) * sum((y - mean) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def kendall(a, b):
    """(concordant − discordant) / pairs, over all pairs (tau-a)."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    sign = lambda x: (x > 0) - (x < 0)
    return sum(sign(a[i] - a[j]) * sign(b[i] - b[j]) for i, j in pairs) / len(pairs)


def separated(measured, noise):
    """Indices of a chain of layouts, fastest first, each slower than the one before by more
    than the run-to-run noise: the layouts whose order a measurement can tell."""
    chain = []
    for index in sorted(range(len(measured)), key=measured.__getitem__):
        if not chain or measured[index] > measured[chain[-1]] * (1 + noise):
            chain.append(index)
    return chain
