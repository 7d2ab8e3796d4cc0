"""Recipe stages: each kind in its own module, all listed in `registry.KINDS` (`memrl.app.runner` runs a recipe)."""
