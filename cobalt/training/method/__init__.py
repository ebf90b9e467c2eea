"""The method as the paper defines it (rewards, KL, objectives, rollout, training rows, presets):
no trainer machinery; see `cobalt/training/__init__.py` for the rooms."""
