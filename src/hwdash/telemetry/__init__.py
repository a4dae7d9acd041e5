"""Telemetry: NVML and psutil samplers, the fake pynvml, history. Never imports Textual."""
