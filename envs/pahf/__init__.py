"""PAHF: continual personalization from pre-action questions and post-action feedback, with per-user memory."""
