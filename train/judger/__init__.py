"""Training and evaluating the memory judger (BCE); scoring with one lives in memrl.rollout.judger."""
