"""The Textual dashboard: the only package that imports Textual."""
