"""Decode steps replayed from CUDA graphs.

On a GPU the torch-ops decode step is ~800-1,400 kernels launched one by one from Python: 9-17 ms a step for
1.3-4.5 ms of GPU work on `small` (docs/gpu-validation.md, H200). A captured graph replays them in one call.

A graph has fixed shapes and addresses, so each is captured for a padded batch (the next power of two, as
TensorRT-LLM's cuda_graph_config with enable_padding) and a padded context (the next power of two of KV blocks),
into buffers that each step's inputs are copied into. Pad rows write their K/V to a spare cache block no
sequence owns and attend to its first slot; a sequence's context slots past its own length point there too and
are masked out. Graphs share one memory pool and are captured on first use of their shape.

`capture=False` runs the same padded step without capturing: the CPU tests check it against the unpadded step,
which is what a graph replays.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def bucket(n: int) -> int:
    """The padded size for n: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


class DecodeGraphs:
    def __init__(self, runner, capture: bool = True, max_batch: int = 256):
        import torch

        self.runner = runner
        self.capture = capture
        self.max_batch = max_batch
        self.spare_slot = runner.cache.spare_slot
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.entries: dict[tuple[int, int], dict] = {}
        self.disabled = False

    def accepts(self, step) -> bool:
        """Decode-only steps (one new token per sequence) up to max_batch sequences."""
        return not self.disabled and step.num_tokens == step.num_sequences <= self.max_batch

    def reset(self) -> None:
        """Forget the captured graphs (after the runner's layers change: they replay the kernels captured)."""
        import torch

        self.entries.clear()
        # ... and their memory pool: capturing into a pool whose graphs are all freed trips an allocator assert
        # (torch 2.11, "use_count > 0" in CUDACachingAllocator.cpp), seen on an H200.
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None

    def run(self, step):
        """The step's logits at its logits_indices, or None where a graph could not be captured (the caller runs
        the step eagerly; stated once)."""
        bs = self.runner.block_size
        batch = bucket(step.num_sequences)
        blocks = bucket(max(-(-ctx // bs) for ctx in step.context_lens))
        try:
            entry = self.entries.get((batch, blocks)) or self._capture(batch, blocks)
        except Exception as exc:  # noqa: BLE001 — any capture failure leaves the eager step, which works
            self.disabled = True
            log.warning("CUDA graph capture failed (%s: %s): decode steps run eagerly, a kernel launch at a time",
                        type(exc).__name__, str(exc).splitlines()[0][:200])
            return None
        for name, value in self._inputs(step, batch, blocks).items():
            entry["inputs"][name].copy_(value)
        if entry["graph"] is not None:
            entry["graph"].replay()
            logits = entry["logits"]
        else:
            logits = self._padded_step(**entry["inputs"])
        return logits[step.logits_indices.to(logits.device)]

    def _inputs(self, step, batch: int, blocks: int) -> dict:
        """The step padded to `batch` rows and `blocks` blocks of context, as CPU tensors (step None: all pad)."""
        import torch

        from toolkit.engine.runtime.model_runner import decode_mask

        width = blocks * self.runner.block_size
        token_ids = torch.zeros(batch, dtype=torch.int64)
        positions = torch.zeros(batch, dtype=torch.int64)
        slots = torch.full((batch,), self.spare_slot, dtype=torch.int64)
        context_slots = torch.full((batch, width), self.spare_slot, dtype=torch.int64)
        lens = torch.ones(batch, dtype=torch.int64)
        if step is not None:
            n = step.num_sequences
            token_ids[:n], positions[:n], slots[:n] = step.token_ids, step.positions, step.slot_mapping
            for row, (ctx, owned) in enumerate(zip(step.context_lens, step.block_tables)):
                context_slots[row, :ctx] = self.runner._slots(owned, ctx)
                lens[row] = ctx
        mask = decode_mask(lens, width)
        return {"token_ids": token_ids, "positions": positions, "slots": slots, "context_slots": context_slots,
                "mask": mask}

    def _padded_step(self, token_ids, positions, slots, context_slots, mask):
        """All rows decode: the runner's torch-ops layers over the padded inputs, logits for every row."""
        import torch

        runner = self.runner
        plan = ((torch.arange(token_ids.shape[0], device=token_ids.device), context_slots, mask), [])
        h = runner._layers(token_ids, positions, slots, lambda i, q: runner._attend(i, q, plan))
        return runner._logits(h)

    def _capture(self, batch: int, blocks: int) -> dict:
        import torch

        device = self.runner.device
        inputs = {name: value.to(device) for name, value in self._inputs(None, batch, blocks).items()}
        entry = {"inputs": inputs, "graph": None, "logits": None}
        if self.capture:
            # Warm up on a side stream first (cuBLAS handles, workspaces: nothing may be created inside a capture);
            # the all-pad inputs write only to the spare block.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._padded_step(**inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                entry["logits"] = self._padded_step(**inputs)
            entry["graph"] = graph
        self.entries[(batch, blocks)] = entry
        return entry
