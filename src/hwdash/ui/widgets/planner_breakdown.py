"""The planner's memory breakdown: one bar per component, the per-GPU total (the whole GPU), torch's
allocated and reserved peaks, and host RAM for offload."""

from __future__ import annotations

from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from hwdash.core.results import MEMORY_COMPONENTS, MemoryEstimate
from hwdash.core.units import format_bytes

#: Row labels, in the order of ``MEMORY_COMPONENTS``.
COMPONENT_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer",
    "activations": "activations",
    "kv_cache": "KV cache",
    "overhead": "overhead",
}

#: One colour per component, shared with the compare view.
COMPONENT_STYLES = {
    "weights": "bold #5fafff",
    "gradients": "bold #d787ff",
    "optimizer": "bold #ffaf5f",
    "activations": "bold #5fd787",
    "kv_cache": "bold #ff87af",
    "overhead": "#8a8a8a",
}

_EIGHTHS = " ▏▎▍▌▋▊▉"
_LABEL_WIDTH = 12
_VALUE_WIDTH = 10


def bar(fraction: float, width: int) -> str:
    """A left-aligned bar ``width`` cells wide filled to ``fraction`` (0-1), in eighths of a cell."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[part] if part else "")
    return text.ljust(width)


def render_breakdown(estimate: MemoryEstimate, width: int, *, stale: bool = False) -> Text:
    """The breakdown as text lines for a widget ``width`` cells wide.

    Each bar is the component's share of the per-GPU total, so the bars add up to one full bar. The
    components are those alive at the estimate's peak, whose phase (``start of backward``,
    ``optimizer step``, ...) is named under the total.
    """
    per_gpu = estimate.per_gpu
    total = per_gpu.total
    bar_width = max(width - _LABEL_WIDTH - _VALUE_WIDTH - 2, 4)
    out = Text(no_wrap=True, overflow="ellipsis")
    dim = "dim" if stale else ""
    for name in MEMORY_COMPONENTS:
        value = int(getattr(per_gpu, name))
        fraction = value / total if total else 0.0
        out.append(f"{COMPONENT_LABELS[name]:<{_LABEL_WIDTH}}", style=dim)
        out.append(bar(fraction, bar_width), style=dim or COMPONENT_STYLES[name])
        out.append(f" {format_bytes(value):>{_VALUE_WIDTH}}\n", style=dim)
    gpus = f" x {estimate.gpus} GPUs" if estimate.gpus > 1 else ""
    out.append(f"{'per GPU':<{_LABEL_WIDTH}}", style="bold")
    out.append(f"{format_bytes(total)}{gpus}", style="bold")
    # the per-GPU total is the whole GPU (what nvidia-smi shows); under it the allocator's two
    # peaks (torch.cuda's max_memory_allocated and max_memory_reserved)
    out.append(f"\n{'allocated':<{_LABEL_WIDTH}}", style=dim)
    out.append(
        f"{format_bytes(estimate.allocated_bytes)} "
        f"(reserved {format_bytes(estimate.reserved_bytes)})",
        style=dim,
    )
    out.append(f"\n{'peak at':<{_LABEL_WIDTH}}", style=dim)
    out.append(estimate.peak_phase, style=dim)
    if estimate.host_bytes:
        out.append(f"\n{'host RAM':<{_LABEL_WIDTH}}", style="bold")
        out.append(f"{format_bytes(estimate.host_bytes)} (CPU offload)", style="bold")
    return out


class MemoryBreakdownView(Widget):
    """Bars for weights, gradients, optimizer, activations, KV cache and overhead on one GPU."""

    DEFAULT_CSS = """
    MemoryBreakdownView {
        height: auto;
        min-height: 7;
    }
    """

    estimate: reactive[MemoryEstimate | None] = reactive(None, layout=True)
    """The estimate drawn; None before the first valid plan."""
    stale: reactive[bool] = reactive(False)
    """True while the form is invalid and this is the last good estimate (drawn dimmed)."""

    def render(self) -> Text:
        if self.estimate is None:
            return Text("no estimate yet: choose a model", style="dim")
        return render_breakdown(self.estimate, self.size.width, stale=self.stale)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if self.estimate is None:
            return 1
        # one row per component, the per-GPU total (the whole GPU), torch's allocated and
        # reserved, the peak phase and host RAM for offload
        return len(MEMORY_COMPONENTS) + 3 + (1 if self.estimate.host_bytes else 0)
