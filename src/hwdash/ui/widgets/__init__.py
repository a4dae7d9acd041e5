"""Widgets of the dashboard panes (one module per pane family)."""
