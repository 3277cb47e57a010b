"""The CPU engine's NUMA binding and thread count: chosen on described topologies (a two-socket host with
hyperthreads, an NPS4 EPYC, a small VM), read from a sysfs tree, and applied on this machine."""

import os

import pytest

from toolkit.errors import ToolkitError

from toolkit.engine.runtime.cpu_binding import (
    CpuTopology,
    apply_binding,
    bound,
    choose_binding,
    cpu_list,
    engine_binding,
    numa_setting,
    parse_cpu_list,
    read_topology,
)


def two_sockets(cores_per_socket=16):
    """Linux's usual numbering: socket 0's cores, socket 1's, then their hyperthread siblings in the same order."""
    n = 2 * cores_per_socket
    nodes = {s: frozenset(range(s * cores_per_socket, (s + 1) * cores_per_socket))
             | frozenset(range(n + s * cores_per_socket, n + (s + 1) * cores_per_socket)) for s in (0, 1)}
    siblings = {c: frozenset({c % n, c % n + n}) for c in range(2 * n)}
    return CpuTopology(nodes, siblings)


def test_cpu_lists_round_trip():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert cpu_list([5]) == "5" and parse_cpu_list("") == frozenset()


def test_a_process_spanning_two_sockets_binds_to_one_with_a_thread_per_core():
    topo = two_sockets()
    binding = choose_binding(range(64), topo)
    assert binding.node == 0 and binding.nodes_allowed == 2
    assert binding.cpus == topo.nodes[0] and binding.threads == 16  # 32 logical CPUs, 16 cores
    assert binding.pinned == tuple(range(16))  # each thread on its own core's first CPU, no two on one core
    assert binding.describe() == "16 threads, one per core, on NUMA node 0 of 2, CPUs 0-15,32-47"
    assert choose_binding(range(64), topo, threads=8).pinned is None  # threads set by hand: left to the scheduler


def test_the_node_with_most_allowed_cores_wins_and_off_keeps_every_cpu():
    topo = two_sockets()
    allowed = set(range(12, 32)) | set(range(44, 64))  # 4 cores of socket 0, all 16 of socket 1
    assert choose_binding(allowed, topo).node == 1
    off = choose_binding(allowed, topo, numa="off")
    assert off.node is None and off.cpus == frozenset(allowed) and off.threads == 20  # 40 CPUs, 20 cores
    assert off.pinned is None
    assert choose_binding(allowed, topo, numa=0).cpus == {12, 13, 14, 15, 44, 45, 46, 47}


def test_a_cpuset_within_one_node_is_left_as_it_is():
    topo = two_sockets()
    binding = choose_binding({32, 33, 34, 35}, topo)  # taskset / a container's cpuset on socket 0's siblings
    assert binding.node is None and binding.nodes_allowed == 1
    assert binding.cpus == {32, 33, 34, 35} and binding.threads == 4  # under 8 CPUs: every one of them
    assert binding.pinned is None  # a small host's threads are left to the scheduler


def test_nps4_epyc_takes_one_quarter():
    nodes = {n: frozenset(range(n * 8, n * 8 + 8)) for n in range(4)}
    binding = choose_binding(range(32), CpuTopology(nodes, {}))
    assert binding.node == 0 and binding.threads == 8 and binding.cpus == nodes[0]
    assert binding.pinned == tuple(range(8))  # no hyperthreads: a thread on every CPU of the node


def test_small_vm_without_numa_takes_every_cpu():
    topo = CpuTopology({}, {0: frozenset({0, 1}), 1: frozenset({0, 1})})  # 2 vCPUs reported as one core's threads
    binding = choose_binding({0, 1}, topo)
    assert binding.node is None and binding.threads == 2 and binding.nodes_allowed == 1
    assert choose_binding({0, 1}, topo, threads=1).describe() == "1 thread on CPUs 0-1"


def test_a_node_without_allowed_cpus_is_refused_with_the_nodes_that_have_them():
    with pytest.raises(ToolkitError, match=r"node 3 has none of the CPUs.*0 \(CPUs 0-15,32-47\), 1 \(CPUs 16-31"):
        choose_binding(range(64), two_sockets(), numa=3)
    with pytest.raises(ToolkitError, match="'interleave' is not a setting"):
        choose_binding(range(4), two_sockets(), numa="interleave")


def test_topology_read_from_sysfs(tmp_path):
    for node, cpus in (("node0", "0-1,4-5"), ("node1", "2-3,6-7"), ("node2", "")):  # node2: memory only
        (tmp_path / "node" / node).mkdir(parents=True)
        (tmp_path / "node" / node / "cpulist").write_text(cpus + "\n")
    for cpu in range(8):
        (tmp_path / "cpu" / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(f"{cpu % 4},{cpu % 4 + 4}\n")
    topo = read_topology(tmp_path)
    assert topo.nodes == {0: {0, 1, 4, 5}, 1: {2, 3, 6, 7}}
    assert topo.siblings[6] == {2, 6} and topo.core_count(range(8)) == 4
    assert choose_binding(range(8), topo).cpus == {0, 1, 4, 5}


def test_this_machine_binding_applies_and_restores():
    import torch

    mask, threads = os.sched_getaffinity(0), torch.get_num_threads()
    binding = engine_binding()
    assert binding.cpus <= mask and 1 <= binding.threads <= len(mask)
    nodes = read_topology().nodes
    with bound(choose_binding(mask, read_topology(), numa=min(nodes) if nodes else "off", threads=1)) as b:
        assert torch.get_num_threads() == 1 and os.sched_getaffinity(0) == set(b.cpus)
    assert torch.get_num_threads() == threads and os.sched_getaffinity(0) == mask
    apply_binding(binding)
    assert torch.get_num_threads() == binding.threads
    torch.set_num_threads(threads)


def test_numa_setting_from_a_repository_parameter():
    assert numa_setting(None) == "auto" and numa_setting("") == "auto"
    assert numa_setting("1") == 1 and numa_setting("off") == "off"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pins two threads to two CPUs")
def test_pinning_binds_each_thread_of_the_callers_team_to_one_cpu():
    """What a large host's binding does to the engine thread's OpenMP team, done here with two threads on two CPUs,
    on a thread of its own (as the served engine's), then the process's mask restored."""
    import threading

    import torch

    from toolkit.engine.runtime import native_kernels
    from toolkit.engine.runtime.cpu_binding import CpuBinding, _set_affinity

    if native_kernels.load() is None:
        pytest.skip("no C compiler: the team is pinned by the C kernels")
    mask, threads = os.sched_getaffinity(0), torch.get_num_threads()
    cpus = tuple(sorted(mask)[:2])
    seen = {}

    def engine_thread():
        apply_binding(CpuBinding(frozenset(mask), 2, None, 1, pinned=cpus))
        seen["self"] = os.sched_getaffinity(0)
        seen["tasks"] = [os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")]

    try:
        worker = threading.Thread(target=engine_thread)
        worker.start()
        worker.join()
        assert seen["self"] == {cpus[0]}  # the master: the team's thread 0
        assert {cpus[1]} in seen["tasks"]  # its OpenMP worker
    finally:
        _set_affinity(mask)
        torch.set_num_threads(threads)
    assert all(os.sched_getaffinity(int(t)) == mask for t in os.listdir("/proc/self/task"))
