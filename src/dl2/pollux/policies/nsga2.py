"""Pollux's search for an allocation (the artifact's `pollux.py` on pymoo 0.4's NSGA-II), compiled.

A candidate is a (jobs x nodes) matrix of GPU counts. Two objectives are minimised: minus the power mean
(p = -1) of the jobs' speedups, scaled so that a node's worth of GPUs is 1 and discounted for a restart,
and minus the cluster's utility (each job's speedup per GPU weighted by its share of the nodes in use).
NSGA-II evolves a population of 100 for 100 generations: binary tournaments by dominance then crowding,
single-point crossover over jobs (probability 0.9), the artifact's mutation (reset a job to its current
allocation, zero some of its nodes, grow some nodes) and repair (at most one distributed job per node, at
most its limit of GPUs per job, at most the node's GPUs per node), duplicates removed, survival by rank and
crowding distance. Random draws come from one seeded generator; a draw pymoo makes and then discards is
only made here where its value is used (the same distributions, another stream).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl2.pollux import kernels

POP_SIZE = 100
GENERATIONS = 100  # pymoo counts the initial population as the first
CROSSOVER_PROB = 0.9
RESET_PROB = 0.1  # mutation: a job goes back to its current allocation
ZERO_JOB_PROB = 0.1  # mutation: a job has some of its nodes zeroed ...
ZERO_NODE_PROB = 0.1  # ... each with this probability
MATING_ROUNDS = 101  # pymoo gives up filling the offspring after this many rounds of duplicates
MAX_JOB_NODES = 16  # the artifact's repair keeps a job on at most this many nodes (its throughput was measured so far)


@njit(cache=True)
def _fill_speedup(sp: np.ndarray, j: int, nodes: int, replicas: int, perf: np.ndarray, grad: np.ndarray,
                  has_perf: np.ndarray, app: np.ndarray, apps: tuple, base: np.ndarray) -> None:
    """`sp[j, nodes, replicas]`: job `j`'s goodput on `replicas` GPUs over `nodes` nodes relative to its fair
    share (`base[j]`); a job with no model yet scales linearly (`base[j]` is then its fair share of GPUs)."""
    if has_perf[j]:
        goodput, _, _ = kernels.best_batch(perf[j], grad[j], apps[app[j]], nodes, replicas)
        sp[j, nodes, replicas] = goodput / base[j]
    else:
        sp[j, nodes, replicas] = replicas / base[j]


@njit(cache=True)
def evaluate(states: np.ndarray, out: np.ndarray, base_state: np.ndarray, factor: np.ndarray, gpus_per_node: int,
             sp: np.ndarray, perf: np.ndarray, grad: np.ndarray, has_perf: np.ndarray, app: np.ndarray, apps: tuple,
             base: np.ndarray) -> None:
    """Both objectives of every candidate into `out` (candidates x 2); `sp` memoises the jobs' speedups by
    (job, nodes, replicas), -1 where not computed yet."""
    num_jobs, num_nodes = base_state.shape
    share_scale = num_nodes / (num_nodes * gpus_per_node)  # a node's worth of GPUs is a speedup of 1
    for k in range(states.shape[0]):
        inverse_sum, utility, active_nodes = 0.0, 0.0, 0
        for n in range(num_nodes):
            if states[k, :, n].sum() > 0:
                active_nodes += 1
        total = active_nodes * gpus_per_node
        for j in range(num_jobs):
            nodes = replicas = np.int64(0)  # not the literal 0, for which numba would compile the callees a second time
            moved = False
            for n in range(num_nodes):
                c = states[k, j, n]
                if c > 0:
                    nodes += 1
                    replicas += c
                if c != base_state[j, n]:
                    moved = True
            if replicas > 0 and sp[j, nodes, replicas] < 0:
                _fill_speedup(sp, j, nodes, replicas, perf, grad, has_perf, app, apps, base)
            s = sp[j, nodes, replicas] if replicas > 0 else 0.0
            scaled = s * share_scale
            if moved:
                scaled *= factor[j]
            inverse_sum += (scaled + 1e-3) ** -1
            if replicas > 0:
                utility += s / replicas * (replicas / total)
        out[k, 0] = -((inverse_sum / num_jobs) ** -1.0)
        out[k, 1] = -utility


@njit(cache=True)
def _span(row: np.ndarray) -> int:
    """The nodes a job uses."""
    count = 0
    for c in row:
        count += c > 0
    return count


@njit(cache=True)
def repair(states: np.ndarray, max_replicas: np.ndarray, gpus_per_node: int, rng: np.random.Generator) -> None:
    """Make every candidate feasible in place, as the artifact does: on each node, a job loses its GPUs
    there once two distributed jobs before it, or one before it and itself, used the node (so one
    distributed job per node); a job over its GPU limit, or over `MAX_JOB_NODES` nodes, keeps GPUs on its
    nodes taken in a random order up to the limits; on each node the jobs in order keep GPUs up to the
    node's."""
    count, num_jobs, num_nodes = states.shape
    distributed = np.empty(num_jobs, dtype=np.bool_)
    for k in range(count):
        for j in range(num_jobs):
            distributed[j] = _span(states[k, j]) > 1
        for n in range(num_nodes):
            seen = 0
            for j in range(num_jobs):
                if distributed[j] and states[k, j, n] > 0:
                    seen += 1
                if seen > 1:
                    states[k, j, n] = 0
        for j in range(num_jobs):
            if states[k, j].sum() > max_replicas[j] or _span(states[k, j]) > MAX_JOB_NODES:
                kept, spans = 0, 0
                for n in np.argsort(rng.random(num_nodes)):
                    c = min(states[k, j, n], max_replicas[j] - kept)
                    if c > 0 and spans == MAX_JOB_NODES:
                        c = 0
                    states[k, j, n] = c
                    kept += c
                    spans += c > 0
        for n in range(num_nodes):
            used = 0
            for j in range(num_jobs):
                c = min(states[k, j, n], gpus_per_node - used)
                states[k, j, n] = c
                used += c


@njit(cache=True)
def mutate(states: np.ndarray, base_state: np.ndarray, gpus_per_node: int, rng: np.random.Generator) -> None:
    """The artifact's mutation, in place: per job, back to its current allocation (probability 0.1); per
    job, with probability 0.1, each node zeroed with probability 0.1; then each (job, node with a free GPU)
    grown to a random count up to the node's GPUs with probability p1 + p2 - p1 p2, where p1 is one over the
    number of jobs and p2, for a job already on the node, one over the jobs on it (so about one growth per
    free node, and one among the node's own jobs)."""
    count, num_jobs, num_nodes = states.shape
    free = np.empty(num_nodes, dtype=np.bool_)
    users = np.empty(num_nodes, dtype=np.int64)
    for k in range(count):
        for j in range(num_jobs):
            if rng.random() < RESET_PROB:
                states[k, j] = base_state[j]
        for j in range(num_jobs):
            if rng.random() < ZERO_JOB_PROB:
                for n in range(num_nodes):
                    if rng.random() < ZERO_NODE_PROB:
                        states[k, j, n] = 0
        for n in range(num_nodes):
            used, users[n] = 0, 0
            for j in range(num_jobs):
                used += states[k, j, n]
                users[n] += states[k, j, n] > 0
            free[n] = used + 1 <= gpus_per_node
        p1 = 1.0 / num_jobs
        for n in range(num_nodes):
            if not free[n]:
                continue
            for j in range(num_jobs):
                p = p1 + 1.0 / users[n] - p1 / users[n] if states[k, j, n] > 0 else p1
                if rng.random() < p:
                    states[k, j, n] = rng.integers(states[k, j, n], gpus_per_node + 1)


@njit(cache=True)
def _dominates(a: np.ndarray, b: np.ndarray) -> int:
    """1: `a` dominates `b`; -1: `b` dominates `a`; 0: neither (pymoo's Dominator.get_relation)."""
    relation = 0
    for i in range(len(a)):
        if a[i] < b[i]:
            if relation == -1:
                return 0
            relation = 1
        elif b[i] < a[i]:
            if relation == 1:
                return 0
            relation = -1
    return relation


@njit(cache=True)
def _fronts(f: np.ndarray, stop: int) -> np.ndarray:
    """The non-dominated rank of every point (ranks are given until `stop` points have one; -1 after)."""
    n = len(f)
    dominated_by = np.zeros(n, dtype=np.int64)
    dominates = np.zeros((n, n), dtype=np.bool_)
    for i in range(n):
        for j in range(i + 1, n):
            rel = _dominates(f[i], f[j])
            if rel == 1:
                dominates[i, j] = True
                dominated_by[j] += 1
            elif rel == -1:
                dominates[j, i] = True
                dominated_by[i] += 1
    rank = np.full(n, -1, dtype=np.int64)
    current = np.flatnonzero(dominated_by == 0)
    level, ranked = 0, 0
    while len(current) and ranked < stop:
        rank[current] = level
        ranked += len(current)
        following = np.zeros(n, dtype=np.bool_)
        for i in current:
            for j in range(n):
                if dominates[i, j]:
                    dominated_by[j] -= 1
                    if dominated_by[j] == 0:
                        following[j] = True
        current = np.flatnonzero(following)
        level += 1
    return rank


@njit(cache=True)
def _crowding(f: np.ndarray) -> np.ndarray:
    """pymoo's crowding distance of a front: boundary points and fronts of two or fewer are infinite,
    repeated points 0."""
    n, m = f.shape
    if n <= 2:
        return np.full(n, np.inf)
    unique = np.ones(n, dtype=np.bool_)
    for i in range(n):
        for j in range(i):
            if np.sqrt(((f[i] - f[j]) ** 2).sum()) < 1e-24:
                unique[i] = False
                break
    idx = np.flatnonzero(unique)
    g = f[idx]
    u = len(idx)
    out = np.zeros(u)
    for o in range(m):
        order = np.argsort(g[:, o], kind="mergesort")
        col = g[order, o]
        norm = col[-1] - col[0]
        for r in range(u):
            last = col[r] - col[r - 1] if r > 0 else np.inf
            nxt = col[r + 1] - col[r] if r < u - 1 else np.inf
            if norm == 0:
                last, nxt = 0.0, 0.0
            else:
                last, nxt = last / norm, nxt / norm
            out[order[r]] += (last + nxt) / m
    crowding = np.zeros(n)
    crowding[idx] = out
    return crowding


@njit(cache=True)
def survive(f: np.ndarray, keep: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices kept, their rank, their crowding): fronts in order, the last one cut by crowding distance
    (ties in random order)."""
    rank = _fronts(f, keep)
    chosen, ranks, crowds = [], [], []
    for level in range(rank.max() + 1):
        front = np.flatnonzero(rank == level)
        crowd = _crowding(f[front])
        order = np.arange(len(front))
        if len(chosen) + len(front) > keep:
            shuffle = np.argsort(rng.random(len(front)))
            order = np.ascontiguousarray(shuffle[np.argsort(crowd[shuffle])][::-1][: keep - len(chosen)])
        for i in order:
            chosen.append(front[i])
            ranks.append(level)
            crowds.append(crowd[i])
        if len(chosen) >= keep:
            break
    return np.array(chosen, dtype=np.int64), np.array(ranks, dtype=np.int64), np.array(crowds)


@njit(cache=True)
def _tournament(f: np.ndarray, crowding: np.ndarray, a: int, b: int, rng: np.random.Generator) -> int:
    rel = _dominates(f[a], f[b])
    if rel == 1:
        return a
    if rel == -1:
        return b
    if crowding[a] > crowding[b]:
        return a
    if crowding[a] < crowding[b]:
        return b
    return a if rng.integers(0, 2) == 0 else b


@njit(cache=True)
def _fingerprint(x: np.ndarray, weights: np.ndarray) -> int:
    """A hash of a candidate (equal candidates have equal fingerprints)."""
    h = 0
    flat = x.ravel()
    for i in range(len(flat)):
        h += flat[i] * weights[i]
    return h


@njit(cache=True)
def _is_new(x: np.ndarray, h: int, pool: np.ndarray, hashes: np.ndarray, count: int) -> bool:
    for i in range(count):
        if hashes[i] == h and np.array_equal(pool[i], x):
            return False
    return True


@njit(cache=True)
def _offspring(pop: np.ndarray, pop_hashes: np.ndarray, f: np.ndarray, crowding: np.ndarray, wanted: int,
               base_state: np.ndarray, max_replicas: np.ndarray, gpus_per_node: int, weights: np.ndarray,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Up to `wanted` new candidates, none equal to another or to one of `pop`, and their fingerprints."""
    size, num_jobs, num_nodes = pop.shape
    off = np.empty((wanted, num_jobs, num_nodes), dtype=np.int64)
    hashes = np.empty(wanted, dtype=np.int64)
    count = np.int64(0)  # as in `evaluate`
    for _ in range(MATING_ROUNDS):
        if count >= wanted:
            break
        matings = (wanted - count + 1) // 2
        draws = 4 * matings
        perm = np.empty(((draws + size - 1) // size) * size, dtype=np.int64)
        for p in range(len(perm) // size):
            perm[p * size:(p + 1) * size] = np.argsort(rng.random(size))
        children = np.empty((2 * matings, num_jobs, num_nodes), dtype=np.int64)
        for m in range(matings):
            p0 = _tournament(f, crowding, perm[4 * m], perm[4 * m + 1], rng)
            p1 = _tournament(f, crowding, perm[4 * m + 2], perm[4 * m + 3], rng)
            children[m] = pop[p0]
            children[matings + m] = pop[p1]
            if rng.random() < CROSSOVER_PROB:
                point = rng.integers(0, num_jobs)
                children[m, :point] = pop[p1, :point]
                children[matings + m, :point] = pop[p0, :point]
        mutate(children, base_state, gpus_per_node, rng)
        repair(children, max_replicas, gpus_per_node, rng)
        for child in children:
            h = _fingerprint(child, weights)
            if count < wanted and _is_new(child, h, off, hashes, count) and _is_new(child, h, pop, pop_hashes, size):
                off[count] = child
                hashes[count] = h
                count += 1
    return off[:count], hashes[:count]


@njit(cache=True)
def search(initial: np.ndarray, base_state: np.ndarray, max_replicas: np.ndarray, factor: np.ndarray, gpus_per_node: int,
           perf: np.ndarray, grad: np.ndarray, has_perf: np.ndarray, app: np.ndarray, apps: tuple, base: np.ndarray,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """NSGA-II from the candidates `initial` (repaired and made unique first): the non-dominated candidates
    of the last generation and their objectives."""
    num_jobs, num_nodes = base_state.shape
    sp = np.full((num_jobs, num_nodes + 1, max(max_replicas.max(), 1) + 1), -1.0)
    weights = rng.integers(1, 2**62, num_jobs * num_nodes)
    start = initial.copy()
    repair(start, max_replicas, gpus_per_node, rng)
    pop = np.empty_like(start)
    pop_hashes = np.empty(len(start), dtype=np.int64)
    size = np.int64(0)  # as in `evaluate`
    for x in start:
        h = _fingerprint(x, weights)
        if _is_new(x, h, pop, pop_hashes, size):
            pop[size] = x
            pop_hashes[size] = h
            size += 1
    pop, pop_hashes = pop[:size], pop_hashes[:size]
    f = np.empty((size, 2))
    evaluate(pop, f, base_state, factor, gpus_per_node, sp, perf, grad, has_perf, app, apps, base)
    keep, rank, crowding = survive(f, size, rng)
    pop, pop_hashes, f = pop[keep], pop_hashes[keep], f[keep]
    for _ in range(GENERATIONS - 1):
        off, off_hashes = _offspring(pop, pop_hashes, f, crowding, POP_SIZE, base_state, max_replicas, gpus_per_node, weights, rng)
        if len(off) == 0:
            break
        f_off = np.empty((len(off), 2))
        evaluate(off, f_off, base_state, factor, gpus_per_node, sp, perf, grad, has_perf, app, apps, base)
        merged = np.concatenate((pop, off))
        merged_hashes = np.concatenate((pop_hashes, off_hashes))
        f_merged = np.concatenate((f, f_off))
        keep, rank, crowding = survive(f_merged, np.int64(POP_SIZE), rng)
        pop, pop_hashes, f = merged[keep], merged_hashes[keep], f_merged[keep]
    best = rank == 0
    return pop[best], f[best]
