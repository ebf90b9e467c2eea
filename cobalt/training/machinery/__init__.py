"""What runs the method at scale: the plan, memory, numerics applied to models, sharding, passes,
generation overlap, the vLLM server, checkpoints and TRL's private surface (`trl_trainer`)."""
