"""Placing a job's GPUs on the nodes with the most free GPUs, as the artifact's Optimus and Tiresias do."""

from __future__ import annotations

from dl2.pollux.cluster import Allocations


def free_gpus(num_nodes: int, gpus_per_node: int, kept: Allocations) -> dict[int, int]:
    """Free GPUs per node once `kept` is placed, in node order, nodes with none left out."""
    used = [0] * num_nodes
    for nodes in kept.values():
        for node in nodes:
            used[node] += 1
    return {node: gpus_per_node - used[node] for node in range(num_nodes) if used[node] < gpus_per_node}


def place_on_most_free(free: dict[int, int], count: int) -> list[int]:
    """`count` GPUs taken from the node with the most free GPUs (the first such node on a tie), then the
    next, and so on; `free` is updated."""
    nodes: list[int] = []
    while len(nodes) < count:
        node = max(free, key=free.__getitem__)  # the first of the largest, as Counter.most_common(1)
        take = min(free[node], count - len(nodes))
        nodes += [node] * take
        free[node] -= take
    return nodes


def keep_or_place(held: Allocations, counts: dict[int, int], num_nodes: int, gpus_per_node: int) -> Allocations:
    """The artifact's placement of `counts` GPUs per job (as Optimus+Oracle places them): a job given as many GPUs
    as it holds keeps its nodes; the others, fewest GPUs first (the order of `counts` on a tie), take the nodes
    with the most free GPUs. Jobs given none hold nothing."""
    kept = {j: nodes for j, nodes in held.items() if counts.get(j, 0) and len(nodes) == counts[j]}
    room = free_gpus(num_nodes, gpus_per_node, kept)
    for j in sorted(counts, key=counts.__getitem__):
        if counts[j] > 0 and j not in kept:
            kept[j] = place_on_most_free(room, counts[j])
    return kept
