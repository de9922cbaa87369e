"""The study on many machines: a plan of pair-blocks, one block run anywhere, the blocks collected.

``plan`` turns a profile's live experiments into content-hashed block records (``plan.jsonl``);
``block`` runs one block with the experiment's own runner into a store; ``collect`` merges the
blocks into the one capture format the notebooks read; ``emit`` writes Slurm, Kubernetes and
SkyPilot files; ``ray_runner`` schedules blocks as Ray tasks; ``node`` says which machine ran a block.
"""
