"""Memory snapshots in PyTorch's documented format, written from a scripted run of known sizes.

The format is the one ``torch.cuda.memory._snapshot()`` returns (its docstring's TypedDicts in
torch/cuda/memory.py, and the keys the allocator's C++ side writes: ``device``, ``is_expandable``,
``segment_pool_id``, ``time_us``, the state ``active_pending_free``): segments of blocks with their
stacks (``frames[0]`` the innermost call, one list shared by every block of the same stack, as
PyTorch shares them), and a device trace of ``segment_alloc``, ``alloc``, ``free_requested``,
``free_completed`` and ``oom`` entries. :class:`ScriptedRun` is a small first-fit allocator: the
test says which segments the run reserved and what it allocated and freed, and the snapshot follows.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIB = 1 << 20
KIB = 1 << 10
SITE = "/venv/lib/python3.11/site-packages"
USER = "/home/ada/proj"


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


MAIN = frame(f"{USER}/train.py", 80, "main")
STEP = frame(f"{USER}/train.py", 55, "train_step")
#: Stacks of the scripted run, innermost first (as PyTorch records them).
STACKS: dict[str, list[dict[str, Any]]] = {
    "load": [
        frame(f"{SITE}/torch/nn/modules/module.py", 1340, "_apply"),
        frame(f"{SITE}/transformers/modeling_utils.py", 5012, "from_pretrained"),
        frame(f"{USER}/train.py", 12, "load_model"),
        MAIN,
    ],
    "forward": [
        frame(f"{SITE}/torch/nn/functional.py", 2890, "linear"),
        frame(f"{SITE}/torch/nn/modules/linear.py", 125, "forward"),
        frame(f"{SITE}/torch/nn/modules/module.py", 1784, "_call_impl"),
        frame(f"{USER}/model.py", 41, "forward"),
        frame(f"{SITE}/torch/nn/modules/module.py", 1784, "_call_impl"),
        STEP,
        MAIN,
    ],
    "optimizer": [
        frame(f"{SITE}/torch/optim/adamw.py", 402, "_init_group"),
        frame(f"{SITE}/torch/optim/adamw.py", 221, "step"),
        frame(f"{SITE}/torch/optim/optimizer.py", 516, "wrapper"),
        frame(f"{USER}/train.py", 61, "train_step"),
        MAIN,
    ],
    "backward": [
        frame(f"{SITE}/torch/autograd/graph.py", 829, "_engine_run_backward"),
        frame(f"{SITE}/torch/_tensor.py", 648, "backward"),
        frame(f"{USER}/train.py", 58, "train_step"),
        MAIN,
    ],
    "kv": [
        frame(f"{SITE}/transformers/cache_utils.py", 712, "update"),
        frame(f"{SITE}/transformers/models/llama/modeling_llama.py", 252, "forward"),
        frame(f"{USER}/train.py", 90, "sample"),
        MAIN,
    ],
    "batch": [frame(f"{USER}/data.py", 30, "to_device"), STEP, MAIN],
    "none": [],
}


@dataclass
class _Block:
    address: int
    size: int
    requested: int
    state: str
    stack: str


@dataclass
class _Segment:
    address: int
    size: int
    kind: str
    stream: int
    device: int
    blocks: list[_Block] = field(default_factory=list)


class ScriptedRun:
    """A first-fit allocator that records PyTorch's snapshot format as it goes."""

    def __init__(self) -> None:
        self.segments: list[_Segment] = []
        self.traces: dict[int, list[dict[str, Any]]] = {}
        self._next = 0x7F0000000000
        self._time = 1_000_000
        self._frames = {name: list(stack) for name, stack in STACKS.items()}

    def _trace(self, device: int, entry: dict[str, Any]) -> None:
        self._time += 10
        entry.setdefault("stream", 0)
        entry["time_us"] = self._time
        self.traces.setdefault(device, []).append(entry)

    def segment(self, size: int, *, kind: str = "large", stream: int = 0, device: int = 0) -> None:
        """cudaMalloc: a segment of ``size`` bytes, one free block."""
        seg = _Segment(self._next, size, kind, stream, device)
        seg.blocks.append(_Block(seg.address, size, 0, "inactive", "none"))
        self._next += size + (64 * MIB)
        self.segments.append(seg)
        self._trace(
            device,
            {
                "action": "segment_alloc",
                "addr": seg.address,
                "size": size,
                "stream": stream,
                "frames": [],
            },
        )

    def alloc(
        self,
        size: int,
        stack: str,
        *,
        requested: int | None = None,
        device: int = 0,
        stream: int = 0,
    ) -> int:
        """Allocate ``size`` bytes first-fit in a segment of the right pool; returns the address."""
        kind = "small" if size <= MIB else "large"
        for seg in self.segments:
            if (seg.kind, seg.stream, seg.device) != (kind, stream, device):
                continue
            for i, block in enumerate(seg.blocks):
                if block.state == "inactive" and block.size >= size:
                    rest = block.size - size
                    seg.blocks[i] = _Block(
                        block.address, size, requested or size, "active_allocated", stack
                    )
                    if rest:
                        seg.blocks.insert(
                            i + 1, _Block(block.address + size, rest, 0, "inactive", "none")
                        )
                    self._trace(
                        device,
                        {
                            "action": "alloc",
                            "addr": block.address,
                            "size": size,
                            "stream": stream,
                            "frames": self._frames[stack],
                        },
                    )
                    return block.address
        raise AssertionError(f"the script does not fit: {size} bytes for {stack}")

    def free(self, address: int, *, completed: bool = True) -> None:
        """Free a block; without ``completed`` it stays awaiting another stream."""
        for seg in self.segments:
            for block in seg.blocks:
                if block.address != address:
                    continue
                entry = {
                    "action": "free_requested",
                    "addr": address,
                    "size": block.size,
                    "frames": self._frames[block.stack],
                }
                self._trace(seg.device, entry)
                if not completed:
                    block.state = "active_pending_free"
                    return
                self._trace(
                    seg.device,
                    {"action": "free_completed", "addr": address, "size": block.size, "frames": []},
                )
                block.state, block.stack, block.requested = "inactive", "none", 0
                self._merge(seg)
                return
        raise AssertionError(f"no block at {address:#x}")

    @staticmethod
    def _merge(seg: _Segment) -> None:
        merged: list[_Block] = []
        for block in seg.blocks:
            if merged and block.state == "inactive" == merged[-1].state:
                merged[-1].size += block.size
            else:
                merged.append(block)
        seg.blocks = merged

    def oom(self, size: int, device_free: int, *, device: int = 0, stack: str = "forward") -> None:
        """The allocator's out-of-memory: ``size`` asked, ``device_free`` what CUDA had."""
        self._trace(
            device,
            {
                "action": "oom",
                "device_free": device_free,
                "size": size,
                "frames": self._frames[stack],
            },
        )

    def snapshot(self) -> dict[str, Any]:
        """The run as ``torch.cuda.memory._snapshot()`` returns it."""
        segments = []
        for seg in self.segments:
            live = [b for b in seg.blocks if b.state == "active_allocated"]
            active = [b for b in seg.blocks if b.state != "inactive"]
            segments.append(
                {
                    "device": seg.device,
                    "address": seg.address,
                    "total_size": seg.size,
                    "allocated_size": sum(b.size for b in live),
                    "active_size": sum(b.size for b in active),
                    "requested_size": sum(b.requested for b in live),
                    "stream": seg.stream,
                    "segment_type": seg.kind,
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "frames": [],
                    "blocks": [
                        {
                            "address": b.address,
                            "size": b.size,
                            "requested_size": b.requested,
                            "state": b.state,
                            "frames": self._frames[b.stack],
                        }
                        for b in seg.blocks
                    ],
                }
            )
        devices = max([*self.traces, *(s.device for s in self.segments)], default=0) + 1
        return {
            "segments": segments,
            "device_traces": [self.traces.get(d, []) for d in range(devices)],
            "allocator_settings": {"PYTORCH_ALLOC_CONF": "", "expandable_segments": False},
        }


#: What the scripted run of :func:`training_oom` holds, to the byte (device 0).
EXPECTED = {
    "reserved": 1024 * MIB + 512 * MIB + 1024 * MIB + 2 * MIB,
    "categories": {
        "parameters": 4 * 256 * MIB,
        "gradients": 2 * 64 * MIB,
        "optimizer": 2 * 192 * MIB,
        "activations": 4 * 128 * MIB,
        "kv_cache": 64 * MIB,
        "unknown": 3 * 512 * KIB + 256 * KIB,
    },
    "awaiting_free": 128 * MIB,
    "request": 300 * MIB,
    "device_free": 200 * MIB,
    # segment C's 96 MiB hole and 224 MiB tail (its largest run, 224 MiB, < 300 MiB), and the small
    # segment's 256 KiB (a 300 MiB request is never served from the small pool)
    "fragmentation": 96 * MIB + 224 * MIB + 256 * KIB,
}


def training_oom() -> ScriptedRun:
    """Load, optimizer states, a forward with a freed temporary, a backward, a KV cache, small
    batches, then a 300 MiB request that fails; device 1 holds one small segment."""
    run = ScriptedRun()
    run.segment(1024 * MIB)  # A: the weights
    for _ in range(4):
        run.alloc(256 * MIB, "load")
    run.segment(512 * MIB)  # B: optimizer states, and an activation freed on a side stream
    for _ in range(2):
        run.alloc(192 * MIB, "optimizer")
    pending = run.alloc(128 * MIB, "forward")
    run.segment(1024 * MIB)  # C: activations, gradients, the KV cache, a freed temporary
    for _ in range(4):
        run.alloc(128 * MIB, "forward")
    temporary = run.alloc(96 * MIB, "forward")
    for _ in range(2):
        run.alloc(64 * MIB, "backward")
    run.alloc(64 * MIB, "kv")
    run.free(temporary)
    run.free(pending, completed=False)
    run.segment(2 * MIB, kind="small")  # D: small batches and a block without a stack
    for _ in range(3):
        run.alloc(512 * KIB, "batch", requested=500_000)
    run.alloc(256 * KIB, "none")
    run.segment(2 * MIB, kind="small", device=1)
    run.alloc(MIB, "batch", device=1)
    run.oom(EXPECTED["request"], EXPECTED["device_free"])
    return run


def write(path: Path, document: Any, *, protocol: int = pickle.HIGHEST_PROTOCOL) -> Path:
    """Pickle ``document`` to ``path`` as ``torch.cuda.memory._dump_snapshot`` does."""
    with open(path, "wb") as handle:
        pickle.dump(document, handle, protocol=protocol)
    return path
