"""Recipe stages: each kind in its own module, all listed in `registry.KINDS`; `runner` runs a recipe."""
