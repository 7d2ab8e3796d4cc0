"""LLaMA-Factory: SFT as the YAML `llamafactory-cli train` reads (`backend`), run in its own environment (`venv`)."""
