"""Check the vision tower's saved activations (``VisionSpec.saved_elements_per_image_token``)
against what PyTorch keeps for backward when Qwen2.5-VL's vision tower runs one image.

The tower is built from ``tests/data/model_configs/vlm/qwen2.5-vl-3b/config.json``'s
``vision_config`` (transformers' ``Qwen2_5_VisionTransformerPretrainedModel``,
modeling_qwen2_5_vl.py) at 1 and 2 blocks, in bf16 with trainable weights, SDPA attention, and run
on one image of ``--side`` pixels (real tensors on the CPU: a 224 px image is 256 patches). Every
tensor autograd saves is seen through ``torch.autograd.graph.saved_tensors_hooks`` and counted
once per storage, parameters left out. The per-block bytes are the slope between the two depths;
the rest (the patch embedding's input, the merger) is the intercept. Prints both next to
hwdash's count.

    PYTHONPATH=src /work/main/.venv/bin/python bench/vlm_tower_trace.py [--side 224]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CONFIG = (
    Path(__file__).resolve().parent.parent
    / "tests/data/model_configs/vlm/qwen2.5-vl-3b/config.json"
)


def saved_bytes(depth: int, side: int) -> tuple[int, int]:
    """(bytes saved for backward by one forward of the tower at ``depth`` blocks, image tokens)."""
    import torch
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    raw = json.loads(CONFIG.read_text())
    vision = dict(raw["vision_config"], depth=depth, fullatt_block_indexes=[depth - 1])
    config = Qwen2_5_VLConfig(vision_config=vision).vision_config
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(config).to(torch.bfloat16)
    patch = config.patch_size
    grid = side // patch
    pixels = config.in_channels * config.temporal_patch_size * patch * patch
    values = torch.randn(grid * grid, pixels, dtype=torch.bfloat16)
    grid_thw = torch.tensor([[1, grid, grid]])
    params = {p.untyped_storage().data_ptr() for p in tower.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = tower(values, grid_thw=grid_thw)
    hidden = out.pooler_output if hasattr(out, "pooler_output") else out
    tokens = (grid // config.spatial_merge_size) ** 2
    assert hidden.shape[0] == tokens, hidden.shape
    return sum(seen.values()), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=224, help="image side in pixels (default 224)")
    args = parser.parse_args()
    from hwdash.core.models.config import model_from_config_file

    one, tokens = saved_bytes(1, args.side)
    two, _ = saved_bytes(2, args.side)
    per_block = two - one
    model = model_from_config_file(CONFIG)
    assert model.vision is not None
    depth = json.loads(CONFIG.read_text())["vision_config"]["depth"]
    traced = one - per_block + depth * per_block
    counted = tokens * model.vision.saved_elements_per_image_token * 2
    print(f"image {args.side}px: {tokens} image tokens, {tokens * 4} patches")
    print(f"traced per block {per_block:,} B, outside the blocks {one - per_block:,} B")
    print(
        f"traced at {depth} blocks {traced:,} B; hwdash {counted:,} B ({counted / traced - 1:+.1%})"
    )


if __name__ == "__main__":
    main()
