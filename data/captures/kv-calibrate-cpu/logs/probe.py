"""Screen each control grade's FP8 server against one 16-bit server of the unmodified model."""
import json
import os
import sys
import time
from pathlib import Path

from kvstudy.precision import prompts as pr
from kvstudy.precision import screen
from kvstudy.vllm.command import ServerConfig
from kvstudy.vllm.server import VllmServer

MODEL = "data/trained-model/qwen3-mini"
OUT, LOGS = Path(sys.argv[1]), Path(sys.argv[2])
GRADES = sys.argv[3:]  # e.g. k128-noscales
LOGS.mkdir(parents=True, exist_ok=True)


def config(model: str, kv_cache_dtype: str) -> ServerConfig:
    return ServerConfig(model=model, kv_cache_dtype=kv_cache_dtype, cpu_kvcache_space_gib=1, max_model_len=4096,
                        seed=0, enforce_eager=True)


def note(msg: str) -> None:
    line = f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.2f} {msg}"
    print(line, flush=True)
    with open(LOGS / "timeline.txt", "a") as fh:
        fh.write(line + "\n")


items = pr.gsm8k_prompts(30) + pr.retrieval_prompts([512, 1024, 2048], 4)
note("start baseline")
with VllmServer(config(MODEL, "auto"), LOGS / "bf16.log", ready_timeout_s=1500) as base:
    for grade in GRADES:
        note(f"start {grade}")
        with VllmServer(config(f"captures/ladder/models/{grade}", "fp8"), LOGS / f"{grade}.log",
                        ready_timeout_s=1500) as fp8:
            note(f"screen {grade}")
            screen.screen(base.base_url, fp8.base_url, OUT / grade, items, allow_other_checkpoint=True,
                          candidate_label="fp8-kv", top_k=10)
        note(f"done {grade}")
note("end")
