"""verl on GPU clusters: a stage becomes Hydra overrides (`overrides`, `collab_overrides`), checked against verl's
own config on CPU (`validate`), then a command (`command`); the stage runner is `backend`. The modules verl's own
processes import by name live here too: its entry (`main`), reward function (`rewards`), advantage estimator
(`advantage`) and agent loop (`agent_loop`)."""
