"""The study on many machines: a plan of pair-blocks, each run on one node, collected into one capture."""
