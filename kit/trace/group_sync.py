"""Collectives matched across ranks by the process group their trace names and their order in it.

Where every collective of the job names its group (torch 2.13's record_param_comms or NCCL kernel
fields, kit.trace.comm_meta), the i-th collective a rank runs in group G is the one G's other
ranks run i-th: NCCL runs a communicator's operations in the order each rank issues them, and
torch numbers them per group ("Seq"). A send and its recv are matched by direction: rank a's i-th
send to b with b's i-th recv from a. Matched instead by their position on each rank's NCCL stream
across the whole job (kit.trace.build), a job whose groups run different numbers of collectives
(a TP and a DP group, the stages of a pipeline) had not been synchronised at all.
"""
from __future__ import annotations

import statistics

from kit.trace.comm_meta import op_comm_metas, trace_group
from kit.trace.build import job_world_size, rank_list


def _key(meta, rank, world, named):
    """(the key of the group a comm op runs in, its ranks), or (None, None) where unnamed."""
    ranks, _ = trace_group(meta, rank, world)
    if ranks is None:
        return None, None
    name = meta.group_name if named else None
    if meta.members:  # a coalesced batch: with the ranks it sends to and receives from
        return ("coalesced", tuple(ranks), name), tuple(ranks)
    peer = meta.peer
    if peer is not None:  # trace_group gave the pair (rank, peer)
        return ("p2p", (rank, peer) if meta.collective == "send" else (peer, rank), name), tuple(ranks)
    return ("group", tuple(ranks), name), tuple(ranks)


def match_by_group(tg, family):
    """([(key, {rank: (op, GpuEvent)})] one per collective, None), or (None, why not): why is
    None where no collective names a group (the caller matches by stream position, as before),
    else what does not agree: some collectives name a group and others none (the match by stream
    position then ties every rank, groups or not), or the named groups across their ranks.
    family: kernel name -> kind."""
    g = tg.graph
    metas = op_comm_metas(tg)
    world = job_world_size(tg.traces)
    comm = {r: [(op, ge) for op, ge, _, _ in ops if g.kind[op] == "comm"] for r, ops in tg.gpu_ops.items()}
    comm = {r: ops for r, ops in comm.items() if ops}
    if not comm:
        return None, None
    named = all(op in metas and metas[op].group_name for ops in comm.values() for op, _ in ops)
    keys = {op: _key(metas[op], r, world, named) if op in metas else (None, None)
            for r, ops in comm.items() for op, _ in ops}
    unnamed = {r: sum(keys[op][0] is None for op, _ in ops) for r, ops in comm.items()}
    if any(unnamed.values()):  # some name none: as before; some do, some not: said
        n, total = sum(unnamed.values()), sum(map(len, comm.values()))
        return None, (None if n == total else f"{n:,} of the job's {total:,} collectives, on rank(s) "
                      f"{rank_list([r for r, k in unnamed.items() if k])}, name no process group "
                      "while the others do")
    out, why = _match_coalesced(comm, keys, metas)
    if why:
        return None, why
    runs: dict = {}  # key -> rank -> [(op, GpuEvent, seq)] in launch order
    ranks_of: dict = {}
    for r, ops in comm.items():
        for op, ge in ops:
            key, ranks = keys[op]
            if key[0] == "coalesced":
                continue
            ranks_of[key] = ranks
            runs.setdefault(key, {}).setdefault(r, []).append((op, ge, metas[op].seq))
    for key, by_rank in runs.items():
        members = ranks_of[key]
        seqs = {r: [s for _, _, s in by_rank.get(r, [])] for r in members}
        by_seq = key[0] != "p2p" and all(None not in s and len(set(s)) == len(s) for s in seqs.values())
        order = {r: sorted(s) if by_seq else list(range(len(s))) for r, s in seqs.items()}
        first = members[0]
        for r in members:
            if order[r] != order[first]:
                what = (f"Seq {_span(order[r])} on rank {r}, {_span(order[first])} on rank {first}"
                        if by_seq else f"{len(order[r])} on rank {r}, {len(order[first])} on rank {first}")
                return None, f"group {_name(key)} runs {what}"
        at = {r: ({s: i for i, s in enumerate(seqs[r])} if by_seq else None) for r in members}
        for i, s in enumerate(order[first]):
            m = {r: by_rank[r][at[r][s] if by_seq else i][:2] for r in members}
            fams = {family(ge.name) for _, ge in m.values()} - {None}
            if len(fams) > 1:
                return None, (f"collective {s} of group {_name(key)} is not the same collective on its "
                              f"ranks ({'; '.join(f'rank {r}: {ge.name}' for r, (_, ge) in sorted(m.items())[:4])})")
            out.append((key + (s,), m))
    return out, None


def _match_coalesced(comm, keys, metas):
    """([(key, {rank: (op, GpuEvent)})] for the coalesced batches, None), or (None, why not).
    A batch is matched pairwise, by its sends and recvs: rank a's i-th coalesced send to b with
    b's i-th coalesced recv from a (in launch order, within the group the trace names). Batches
    so paired run together, and so do the batches paired with those: a pipeline's ring shift
    (each rank sends to r + 1 and receives from r - 1 in one batch) ties its stages into one
    set, where each rank's peers differ and a key by the peer set had matched none of them."""
    sends: dict = {}  # (group name, a, b) -> a's ops that send to b, in launch order
    recvs: dict = {}  # (group name, a, b) -> b's ops that receive from a
    ops_of: dict = {}  # op -> (rank, GpuEvent)
    for r, ops in comm.items():
        for op, ge in ops:
            if keys[op][0] is None or keys[op][0][0] != "coalesced":
                continue
            ops_of[op] = (r, ge)
            name = keys[op][0][2]
            for m in metas[op].members:
                pair = (name, r, m.peer) if m.collective == "send" else (name, m.peer, r)
                (sends if m.collective == "send" else recvs).setdefault(pair, []).append(op)
    parent = {op: op for op in ops_of}

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for pair in sorted(set(sends) | set(recvs), key=str):
        a, b = sends.get(pair, []), recvs.get(pair, [])
        if len(a) != len(b):
            return None, (f"coalesced batches send {len(a)} time(s) from rank {pair[1]} to rank "
                          f"{pair[2]} and receive {len(b)} time(s) there from it")
        for x, y in zip(a, b):
            parent[root(x)] = root(y)
    sets: dict = {}
    for op in ops_of:  # launch order within each rank
        sets.setdefault(root(op), []).append(op)
    out, count = [], {}
    for members in sets.values():
        m = {}
        for op in members:
            r, ge = ops_of[op]
            if r in m:
                return None, (f"rank {r}'s coalesced batches {m[r][1].name.split('(')[0]} and "
                              f"{ge.name.split('(')[0]} pair with the same batches of other ranks")
            m[r] = (op, ge)
        ranks = tuple(sorted(m))
        key = ("coalesced", ranks, keys[members[0]][0][2])
        count[key] = count.get(key, -1) + 1
        out.append((key + (count[key],), m))
    return out, None


def wait_pairwise(tg, matched) -> int:
    """Give the coalesced batches of more than two ranks (a ring shift or a pipeline's chain:
    _match_coalesced ties them into one set) each a wait on its own peers only, and return how many
    batches. A send or recv blocks the GPU until its peer's matching recv or send runs, and those
    fused in one group (one kernel) progress concurrently (nccl.h of NCCL 2.32.3, nvidia-nccl-cu12,
    on ncclSend and ncclRecv: "Rank peer needs to call ncclRecv ... This operation is blocking for
    the GPU. If multiple ncclSend and ncclRecv operations need to progress concurrently to
    complete, they must be fused within a ncclGroupStart/ncclGroupEnd section"). So rank r's
    batch, sending to r + 1 and receiving from r - 1, starts its transfers when both of them have
    reached theirs, not when the whole chain has: as one collective the chain had started every
    batch at its last rank's arrival (a 4-stage pipeline launching 50 us apart: stage 0 waited
    150 us for stage 3, with which it exchanges nothing).
    Each pair of peers gets a 0 ms collective of its two ranks (on a queue of its own per rank:
    queued on the stream, a rank's second pair had waited for its first, and the chain's arrivals
    had passed from pair to pair again), ready when the batch is (its deps and the op before it on
    its stream); the batch depends on its pairs' and keeps the set's shortest measured time (the
    rank that waited least). The waits are added once the batches are matched across ranks, and
    moved to just before their batches (kit.trace.reorder), so that the graph's ids stay its
    dependency order; matched's ops are renumbered with them."""
    from kit.trace.reorder import insert_before

    chains = [(key, members) for key, members in matched if key[0] == "coalesced" and len(members) >= 3]
    if not chains:  # no pass over the trace's comm ops for a job with no chain
        return 0
    g = tg.graph
    metas = op_comm_metas(tg)
    pairs = []  # (a, b, a's batch, b's batch, the set's key), a < b
    chained = 0
    for key, members in chains:
        chained += len(members)
        d = min(ge.dur_us for _, ge in members.values()) / 1e3
        for r, (op, _) in members.items():
            g.dur_ms[op] = d
        seen = set()
        for r, (op, _) in members.items():
            for m in metas[op].members:
                if m.peer in members and m.peer != r and (ab := tuple(sorted((r, m.peer)))) not in seen:
                    seen.add(ab)
                    pairs.append((*ab, members[ab[0]][0], members[ab[1]][0], key))
    if not pairs:
        return chained
    waits: dict = {}  # batch -> its pair waits
    for a, b, op_a, op_b, key in sorted(pairs, key=lambda x: x[:4]):  # each pair's batches in launch order
        for r, op in ((a, op_a), (b, op_b)):
            ready = tuple(g.deps[op]) + ((g.prev[op],) if g.prev[op] >= 0 else ())
            w = g.gpu(r, f"{g.resource[op]} p2p {a}-{b}", 0.0, f"p2p wait: ranks {a} and {b}",
                      kind="comm", deps=ready, group=("nccl p2p", a, b) + key)
            waits.setdefault(op, []).append(w)
    for op, ws in waits.items():
        g.deps[op] = tuple(g.deps[op]) + tuple(ws)
    new_of = insert_before(tg, waits)
    matched[:] = [(key, {r: (new_of[op], ge) for r, (op, ge) in members.items()}) for key, members in matched]
    return chained


def _span(xs):
    return f"{xs[0]}-{xs[-1]} ({len(xs)})" if xs else "none"


def _name(key):
    kind, ranks, name = key
    who = (f"send {ranks[0]} -> {ranks[1]}" if kind == "p2p" else
           "(" + ", ".join(map(str, ranks)) + ")")
    return who + (f" {name!r}" if name else "")


def clock_offsets(matched, ranks, weak=()):
    """(rank -> clock offset (us), rank -> the root of its chain). A collective's members end
    together (its last arrival plus its own time), so b's offset to a is the median of end(b) -
    end(a) over the collectives they share, as the match by stream position takes it against the
    first rank. Offsets chain breadth-first from ranks[0] (the lowest rank): each rank takes its
    offset from the first rank that reaches it on a shortest chain (ranks are visited by depth,
    then in the order their parents were, then by rank), so where groups form a loop (pairs 0-1, 1-2, 2-0) the loop's other links are
    not used: measured ends that disagree around it (2 - 1 = 156 us, where 2 - 0 = 250 and 1 - 0 =
    100) are not averaged, rank 2 takes 250. The result does not depend on the collectives' order.
    A rank that no chain reaches starts a chain of its own at 0 (its root). With one group of all
    the ranks this is the median of end(r) - end(ranks[0]), as by stream position.
    weak: indices into matched of collectives whose members do not end together (a chain of
    coalesced batches waits pairwise: wait_pairwise), used only to reach a rank that no other
    collective reaches from the ranks already placed (from the first placed rank that shares one
    with it), and never beside the others: with the chain among them, rank 1 of a pipeline whose
    all-reduce with rank 0 ends together on both had taken the median of that 0 us and the
    chain's 50."""
    weak = set(weak)
    with_rank: dict = {}
    for i, (_, m) in enumerate(matched):
        for r in m:
            with_rank.setdefault(r, []).append(i)
    offsets: dict = {}
    root_of: dict = {}

    def reach(a, strong):  # rank b not yet placed -> end(b) - end(a) over a's collectives of a kind
        diffs: dict = {}
        for i in with_rank.get(a, ()):
            if (i in weak) == strong:
                continue
            m = matched[i][1]
            end_a = m[a][1].ts_us + m[a][1].dur_us
            for b, (_, ge) in m.items():
                if b not in offsets:
                    diffs.setdefault(b, []).append(ge.ts_us + ge.dur_us - end_a)
        return diffs

    def place(a, diffs, todo):
        for b in sorted(diffs):
            offsets[b] = offsets[a] + statistics.median(diffs[b])
            root_of[b] = root_of[a]
            todo.append(b)

    for root in ranks:
        if root in offsets:
            continue
        offsets[root] = 0.0
        root_of[root] = root
        placed, todo, k = [], [root], 0
        while todo:
            while todo:
                a = todo.pop(0)
                placed.append(a)
                place(a, reach(a, True), todo)
            while k < len(placed):  # none left to reach by the others: a weak link from the first
                diffs = reach(placed[k], False)  # placed rank with one (a rank left with none
                if diffs:  # keeps none: the placed only grow)
                    place(placed[k], diffs, todo)
                    break
                k += 1
    return offsets, root_of


__all__ = ["clock_offsets", "match_by_group", "wait_pairwise"]
