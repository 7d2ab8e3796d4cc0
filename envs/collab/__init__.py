"""MultiSessionCollab: users with interaction preferences collaborating with memory agents over many sessions."""
