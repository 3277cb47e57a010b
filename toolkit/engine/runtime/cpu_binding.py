"""Which CPUs the embedded engine runs on, and how many threads.

Decode reads every weight each step, so its speed is the bandwidth of the memory the weights live in. On a host
with several NUMA nodes (a two-socket Xeon or EPYC, an EPYC in NPS2/NPS4), Linux places a page on the node of the
thread that first touches it: weights loaded by one thread sit on one node, and the threads on the other nodes
read them over the socket link at a fraction of local bandwidth, while taking that node's cores from the step's
critical path. So, as vLLM's CPU backend (VLLM_CPU_OMP_THREADS_BIND=auto) and OpenVINO's latency hint do, the
engine binds the whole process to one node when the CPUs it may run on span several: the node holding most of
their physical cores. `engine.cpu_numa` picks another node or turns it off ("off": every CPU allowed).

Threads: every CPU of the binding on small hosts (on 2 cores decode needs both, and are left to the scheduler); one
per physical core from 8 logical CPUs up, where hyperthread siblings share the core's FMA units and add no GEMM
throughput, each OpenMP thread pinned to its own core (as vLLM does): a step's threads meet at ~80 barriers, so two
of them on one core's hyperthreads, or one moved off its core, hold up every thread.

Written against this 2-core, one-node VM: the choice is tested on described topologies (tests/test_cpu_binding.py),
the binding itself on this machine; its effect on a real multi-socket host is unmeasured here.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ToolkitError

log = logging.getLogger(__name__)
SYSFS = Path("/sys/devices/system")
CAN_BIND = hasattr(os, "sched_setaffinity")  # Linux; elsewhere the OS places the process and its threads itself
# From this many logical CPUs on, one thread per physical core (below it, every CPU: a small VM's vCPUs may be
# reported as siblings of one core while the host runs them on two).
PHYSICAL_CORES_FROM = 8


@dataclass(frozen=True)
class CpuTopology:
    """NUMA nodes and hyperthread siblings, as Linux reports them (sysfs); one node where there are no nodes."""
    nodes: dict[int, frozenset[int]]
    siblings: dict[int, frozenset[int]]  # CPU -> the CPUs sharing its core (itself included)

    def core_count(self, cpus) -> int:
        return len({self.siblings.get(cpu, frozenset([cpu])) for cpu in cpus})


@dataclass(frozen=True)
class CpuBinding:
    cpus: frozenset[int]
    threads: int
    node: int | None  # the NUMA node bound to; None: not bound (one node, or cpu_numa off)
    nodes_allowed: int  # how many nodes the CPUs the process could run on span
    pinned: tuple[int, ...] | None = None  # the CPU each OpenMP thread is bound to (thread 0 first); None: not pinned

    def describe(self) -> str:
        where = f"NUMA node {self.node} of {self.nodes_allowed}, " if self.node is not None else ""
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}{', one per core,' if self.pinned else ''}"
        return f"{threads} on {where}CPUs {cpu_list(self.cpus)}"


def parse_cpu_list(text: str) -> frozenset[int]:
    """Linux's list format: "0-3,8,10-11"."""
    cpus = set()
    for part in text.strip().split(","):
        if not part.strip():
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def cpu_list(cpus) -> str:
    """The inverse of parse_cpu_list: runs of consecutive CPUs as ranges."""
    out, ordered = [], sorted(cpus)
    start = prev = None
    for cpu in [*ordered, None]:
        if start is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(out)


def read_topology(root: Path = SYSFS) -> CpuTopology:
    nodes = {}
    for node in (root / "node").glob("node[0-9]*"):
        try:
            cpus = parse_cpu_list((node / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cpus:  # memory-only nodes (CXL, HBM in flat mode) have no CPUs to bind to
            nodes[int(node.name[4:])] = cpus
    siblings = {}
    for cpu_dir in (root / "cpu").glob("cpu[0-9]*"):
        try:
            siblings[int(cpu_dir.name[3:])] = parse_cpu_list((cpu_dir / "topology/thread_siblings_list").read_text())
        except (OSError, ValueError):
            continue
    return CpuTopology(nodes, siblings)


def allowed_cpus() -> frozenset[int]:
    if CAN_BIND:
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def numa_setting(text: str | None) -> str | int:
    """engine.cpu_numa as a repository's config.pbtxt carries it (a string; absent: auto)."""
    return "auto" if not text else int(text) if text.strip().isdigit() else text.strip()


def choose_binding(allowed, topology: CpuTopology, *, numa: str | int = "auto",
                   threads: int | None = None) -> CpuBinding:
    """numa: "auto" (one node when `allowed` spans several: the one with most of their physical cores, the lowest
    numbered of equals), "off" (every allowed CPU), or a node number. threads: None for the default (module doc)."""
    allowed = frozenset(allowed)
    by_node = {node: cpus & allowed for node, cpus in sorted(topology.nodes.items()) if cpus & allowed}
    node = None
    cpus = allowed
    if isinstance(numa, int) and not isinstance(numa, bool):
        if numa not in by_node:
            known = ", ".join(f"{n} (CPUs {cpu_list(c)})" for n, c in by_node.items()) or "none readable"
            raise ToolkitError(f"engine.cpu_numa: node {numa} has none of the CPUs this process may run on "
                               f"({cpu_list(allowed)}); its nodes with them: {known}",
                               "set engine.cpu_numa to one of those nodes, or auto / off")
        node, cpus = numa, by_node[numa]
    elif numa == "auto":
        if len(by_node) > 1:
            node = max(by_node, key=lambda n: (topology.core_count(by_node[n]), -n))
            cpus = by_node[node]
    elif numa != "off":
        raise ToolkitError(f"engine.cpu_numa {numa!r} is not a setting", "set auto, off or a NUMA node number")
    pinned = None
    if threads is None and len(cpus) >= PHYSICAL_CORES_FROM:
        # one thread per physical core, each bound to its core's first CPU (numa off: left to the scheduler too)
        firsts = sorted({min(topology.siblings.get(cpu, frozenset([cpu])) & cpus) for cpu in cpus})
        threads = len(firsts)
        pinned = tuple(firsts) if numa != "off" else None
    elif threads is None:
        threads = len(cpus)
    return CpuBinding(cpus, max(1, threads), node, max(1, len(by_node)), pinned)


def engine_binding(numa: str | int = "auto", threads: int | None = None) -> CpuBinding:
    """This process's binding under `numa` / `threads` (choose_binding on this host's topology)."""
    return choose_binding(allowed_cpus(), read_topology(), numa=numa, threads=threads)


def _set_affinity(cpus) -> None:
    """Every thread of the process (as `taskset -a`): a thread started before the binding, such as the one an engine
    runs its steps on, keeps its own mask otherwise, and the thread pool it starts inherits that."""
    tasks = Path("/proc/self/task")
    ids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in ids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def apply_binding(binding: CpuBinding) -> None:
    """Binds the process (only when bound to a node: otherwise its mask is left as it came, e.g. from taskset or a
    container's cpuset), sets torch's thread count, and pins the calling thread's OpenMP team where the binding says
    (the thread that will run the steps: each thread has a team of its own). Before the weights load, so first touch
    puts them on the node."""
    import torch

    if binding.node is not None and CAN_BIND:
        _set_affinity(binding.cpus)
    torch.set_num_threads(binding.threads)
    if binding.pinned and CAN_BIND:
        from toolkit.engine.runtime import native_kernels

        kernels = native_kernels.load()
        failed = kernels.pin_team(binding.pinned) if kernels is not None else -1
        if failed:
            log.warning("CPU engine: %s of its %d threads could not be pinned to one core each (%s): they run "
                        "where the scheduler puts them", "all" if failed < 0 else failed, binding.threads,
                        "no C kernels" if kernels is None else "sched_setaffinity refused")


@contextlib.contextmanager
def bound(binding: CpuBinding):
    """apply_binding for a block, the mask and thread count restored after (the planner's probe in a CLI process)."""
    import torch

    mask, threads = allowed_cpus(), torch.get_num_threads()
    apply_binding(binding)
    try:
        yield binding
    finally:
        if (binding.node is not None or binding.pinned) and CAN_BIND:
            _set_affinity(mask)
        torch.set_num_threads(threads)
