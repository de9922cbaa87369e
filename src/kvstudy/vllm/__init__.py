"""Everything about vLLM itself: its facts and defaults, starting and stopping a server, reading its startup log."""
