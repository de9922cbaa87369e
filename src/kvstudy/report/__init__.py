"""The reports layer: tables, HTML, the index and the notebooks' helpers."""
