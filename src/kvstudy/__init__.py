"""kvstudy: should the KV cache be stored in FP8 on vLLM? Helpers for the study notebooks."""

__version__ = "0.1.0"
