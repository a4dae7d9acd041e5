"""Apps and fixtures for the dashboard's Pilot and snapshot tests (fake GPUs, a fixed host)."""
