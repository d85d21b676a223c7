"""Finding the sharding automatically: the cheapest tensor-parallel layout of every value of
an operator graph (minitensor.graph.ir.Graph), and the cheapest pipeline stage boundaries.

    >>> from parallel.plan.auto import Machine, auto_shard
    >>> plan = auto_shard(graph, Machine.from_profile("laptop-cpu", tp=2))
    >>> print(plan.table(graph))

sharding.py  the layouts R, S(d), P and the collective (and α–β seconds) between two
rules.py     which input layouts each op accepts and the output layout it gives then
machine.py   tp, α, β and the flop rate a sharding is priced with
plan.py      the cost of one complete choice (the yardstick)
search.py    the exact minimum by dynamic programming over the graph's order
block.py     the traced graph of one GPT block of a planner config
"""
from .block import block_graph
from .machine import Machine
from .plan import Collective, ShardingPlan, evaluate
from .rules import Rule, rules
from .search import auto_shard
from .sharding import PARTIAL, REPLICATED, collective, layouts_of, split

__all__ = ["Collective", "block_graph", "Machine", "PARTIAL", "REPLICATED", "Rule", "ShardingPlan", "auto_shard", "collective",
           "evaluate", "layouts_of", "rules", "split"]
