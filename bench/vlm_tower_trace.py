"""Check the vision tower's saved activations (``VisionSpec.saved_elements_per_image_token``)
against what PyTorch keeps for backward when Qwen2.5-VL's vision tower runs one image.

The tower is built from ``tests/data/model_configs/vlm/qwen2.5-vl-3b/config.json``'s
``vision_config`` (transformers' ``Qwen2_5_VisionTransformerPretrainedModel``,
modeling_qwen2_5_vl.py) at 1 and 2 blocks, in bf16 with trainable weights, SDPA attention, and run
on one image of ``--side`` pixels (real tensors on the CPU: a 224 px image is 256 patches). Every
tensor autograd saves is seen through ``torch.autograd.graph.saved_tensors_hooks`` and counted
once per storage, parameters left out. The per-block bytes are the slope between the two depths;
the rest (the patch embedding's input, the merger) is the intercept. Prints both next to
hwdash's count. ``--tower siglip`` / ``clip`` does the same for Gemma 3's SigLIP and LLaVA-1.5's
CLIP encoders (per layer and outside the layers, per token).

    PYTHONPATH=src /work/main/.venv/bin/python bench/vlm_tower_trace.py [--side 224] [--tower qwen]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "model_configs"
CONFIG = DATA / "vlm" / "qwen2.5-vl-3b" / "config.json"
SIGLIP = DATA / "heldout" / "gemma-3-4b-pt" / "config.json"
CLIP = DATA / "vlm" / "llava-1.5-7b" / "config.json"


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


def encoder_saved_bytes(kind: str, depth: int) -> tuple[int, int, dict[str, Any]]:
    """(bytes saved for backward by a SigLIP (Gemma 3's) or CLIP (LLaVA-1.5's) encoder of
    ``depth`` layers on one image, patches, its vision_config)."""
    import torch
    import transformers

    path = SIGLIP if kind == "siglip" else CLIP
    raw = dict(json.loads(path.read_text())["vision_config"], num_hidden_layers=depth)
    config_class = (
        transformers.SiglipVisionConfig if kind == "siglip" else transformers.CLIPVisionConfig
    )
    config = config_class(**raw)
    config._attn_implementation = "sdpa"
    model = transformers.AutoModel.from_config(config).to(torch.bfloat16)
    pixels = torch.randn(1, 3, config.image_size, config.image_size, dtype=torch.bfloat16)
    with _SavedBytes(model) as seen:
        model(pixel_values=pixels)
    return seen.total, (config.image_size // config.patch_size) ** 2, raw


class _SavedBytes:
    """Sums the storages autograd saves inside the ``with`` (each once, parameters left out)."""

    def __init__(self, model: Any) -> None:
        import torch

        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.seen: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.params:
            self.seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    def __enter__(self) -> _SavedBytes:
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hooks.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def check_encoder(kind: str) -> None:
    """Per-layer and outside-the-layers saved elements per patch: traced against hwdash's."""
    from hwdash.core.models.family_vision import _VISION_DEFAULTS, _encoder

    one, patches, raw = encoder_saved_bytes(kind, 1)
    two, _, _ = encoder_saved_bytes(kind, 2)
    clip = kind == "clip"
    tokens = patches + (1 if clip else 0)  # CLIP's class token runs through the layers too
    *_, at_one = _encoder(dict(raw, num_hidden_layers=1), _VISION_DEFAULTS[kind], kind, clip=clip)
    *_, at_two = _encoder(dict(raw, num_hidden_layers=2), _VISION_DEFAULTS[kind], kind, clip=clip)
    traced_layer = (two - one) / 2 / tokens
    traced_outside = (one - (two - one)) / 2 / tokens
    counted_layer = at_two - at_one
    counted_outside = at_one - counted_layer
    print(
        f"{kind}: {patches} patches; per layer per token traced {traced_layer:,.0f}, hwdash "
        f"{counted_layer:,} ({counted_layer / traced_layer - 1:+.1%}); outside the layers traced "
        f"{traced_outside:,.0f}, hwdash {counted_outside:,}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=224, help="image side in pixels (default 224)")
    parser.add_argument(
        "--tower",
        choices=("qwen", "siglip", "clip"),
        default="qwen",
        help="qwen: Qwen2.5-VL-3B's whole tower; siglip (Gemma 3's), clip (LLaVA-1.5's): the "
        "encoder per layer (default qwen)",
    )
    args = parser.parse_args()
    if args.tower != "qwen":
        check_encoder(args.tower)
        return
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
