"""hwdash: plan GPU memory, time and cost for a training run, and watch the GPUs while it runs."""

__version__ = "0.1.0"
