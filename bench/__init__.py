"""Benchmarks and studies, run from the repository root as modules: ``python -m bench.<topic>.<script>``."""
