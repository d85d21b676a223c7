"""The cheapest sharding of a graph, exactly: dynamic programming over its topological order.

Walk the ops in order. The cost of everything decided so far depends on the future only
through the values still *live* (computed, with readers still to come): each one's layout
and the sum-so-far of its gradient's contributions (plan.evaluate's terms). So the state
after op k is the tuple of (layout, gradient so far) of the live values, and

    best[state'] = min over states and rules r of op k+1:
                   best[state] + compute(k+1, r) + Σ forward reshards of its inputs into r
                   + Σ backward reshards of the inputs op k+1 was the last reader of

with parameters entering the state just before their first reader (any layout, free). A
chain keeps one live value, a residual block two or three, so the states stay few and the
minimum is exact — not a heuristic: `plan.evaluate` of the brute-force minimum equals it.
"""
from .plan import boundary_layout, evaluate, forward_seconds, is_leaf, node_rules, value_bytes
from .sharding import PARTIAL, REPLICATED, gradient_layout, join, layouts_of


def walk_order(graph, nodes):
    """The ops in graph order, each parameter (or input) just before its first reader."""
    order, seen = [], set()
    for node in graph.nodes:
        if is_leaf(node):
            continue
        for name in node.inputs:
            if name not in seen and is_leaf(nodes[name]):
                order.append(nodes[name])
                seen.add(name)
        order.append(node)
    return order


def last_readers(graph, order):
    """value name -> the position in `order` of its last reader (len(order) for an output)."""
    last = {}
    for position, node in enumerate(order):
        for name in node.inputs:
            last[name] = position
    for name in graph.outputs:
        last[name] = len(order)
    return last


def leaf_layouts(node, tp, boundary, fixed=None):
    """A parameter may lie any way but partial (or as `fixed` says); inputs and constants come in
    `boundary` layout."""
    if fixed and node.name in fixed:
        return [fixed[node.name]]
    if node.op == "param":
        return [layout for layout in layouts_of(node.shape, tp) if layout != PARTIAL]
    return [boundary_layout(node, boundary)]


def auto_shard(graph, machine, boundary=REPLICATED, fixed=None):
    """The ShardingPlan of least seconds (compute + communication) over machine.tp ranks;
    `fixed` {parameter: layout} pins some parameters (price a hand-made split: the search
    fills in the rest)."""
    nodes = {n.name: n for n in graph.nodes}
    sizes = {name: value_bytes(node) for name, node in nodes.items()}
    order = walk_order(graph, nodes)
    last = last_readers(graph, order)
    # state: ((value, layout, gradient so far), ...) sorted by value -> (seconds, choices)
    best = {(): (0.0, ())}
    for position, node in enumerate(order):
        options = ([(layout, None) for layout in leaf_layouts(node, machine.tp, boundary, fixed)] if is_leaf(node)
                   else [(rule.output, rule) for rule in node_rules(graph, node, machine.tp)])
        following = {}
        for state, (seconds, choices) in best.items():
            live = {value: (layout, gradient) for value, layout, gradient in state}
            for layout, rule in options:
                cost, after = seconds, dict(live)
                if rule is not None:
                    cost += step(nodes, sizes, node, rule, machine, after, position, last)
                if last.get(node.name, -1) > position:
                    after[node.name] = (layout, None)
                key = tuple(sorted((value, *lg) for value, lg in after.items()))
                if key not in following or cost < following[key][0]:
                    following[key] = (cost, (choices, (node.name, layout, rule)))
        best = following
    state = min(best, key=lambda state: best[state][0] + finish(nodes, sizes, state, machine, boundary))
    leaves, op_rules = {}, {}
    choices = best[state][1]
    while choices:
        choices, (name, layout, rule) = choices
        if rule is not None:
            op_rules[name] = rule
        elif nodes[name].op == "param":
            leaves[name] = layout
    return evaluate(graph, leaves, op_rules, machine, boundary)


def step(nodes, sizes, node, rule, machine, live, position, last):
    """Seconds op `node` adds by `rule`: compute, its inputs' forward reshards, and the
    backward reshard of each input it reads last (whose gradient is then complete)."""
    # exercise 19.2: one step of the dynamic program
    # hint: the op's compute; for each input, the forward reshard into rule.inputs[index] and its gradient
    # hint: joined into live[name]; an input read for the last time here leaves `live` and pays its gradient's reshard.
    cost = machine.compute_seconds(node, rule)
    for index, name in enumerate(node.inputs):
        layout, gradient = live[name]
        cost += forward_seconds(nodes[name], layout, rule.inputs[index], machine, sizes[name])
        live[name] = (layout, join(gradient, rule.input_gradient(index)))
    for name in set(node.inputs):
        if last[name] == position:
            layout, gradient = live.pop(name)
            cost += gradient_seconds(layout, gradient, machine, sizes[name])
    return cost
    # end exercise


def gradient_seconds(layout, gradient, machine, nbytes):
    if gradient is None:
        return 0.0
    return machine.reshard_seconds(gradient, gradient_layout(layout), nbytes)


def finish(nodes, sizes, state, machine, boundary):
    """Seconds the outputs still owe: into the boundary layout forward, their gradients back."""
    cost = 0.0
    for name, layout, gradient in state:
        out = boundary_layout(nodes[name], boundary)
        cost += machine.reshard_seconds(layout, out, sizes[name])
        cost += gradient_seconds(layout, join(gradient, gradient_layout(out)), machine, sizes[name])
    return cost
