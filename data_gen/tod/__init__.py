"""SGD dialogues -> MS-TOD individuals: goals, plans, session writers, the dataset folder."""
