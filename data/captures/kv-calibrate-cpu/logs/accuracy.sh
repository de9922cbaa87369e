#!/bin/bash
# Runs the lines of captures/ladder/queue.txt in turn, re-reading the queue after each (run it under
# flock /tmp/kvstudy-live.lock: the whole queue holds the lock):
#   gsm8k|retrieval CHECKPOINT CONFIGS   one resumable kvstudy gsm8k invocation
#   screen LOGDIR GRADE...               captures/ladder/probe.py (one 16-bit baseline, each grade's FP8 server)
cd .
export PYTHONPATH=$PWD/src HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
M="--cpu-kvcache-space-gib 1 --enforce-eager"
done_file=captures/ladder/queue.done
touch $done_file
while true; do
  line=$(grep -v -x -F -f $done_file captures/ladder/queue.txt | grep -v '^#' | grep -v '^$' | head -1)
  [ -z "$line" ] && break
  set -- $line
  task=$1
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) start $line" | tee -a captures/ladder/accuracy-timeline.txt
  if [ "$task" = screen ]; then
    logs=$2; shift 2
    .venv/bin/python captures/ladder/probe.py captures/ladder/screen captures/ladder/$logs "$@"
  else
    ckpt=$2 configs=$3
    if [ "$task" = gsm8k ]; then T="--n 100 --shots 0 --max-model-len 4096"; else T="--task retrieval_offline --n 64 --max-model-len 8192"; fi
    .venv/bin/kvstudy gsm8k --model captures/ladder/models/$ckpt $M $T \
      --capture captures/ladder/$task/$ckpt --configs $configs
  fi
  rc=$?
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) end rc=$rc $line" | tee -a captures/ladder/accuracy-timeline.txt
  echo "$line" >> $done_file
done
