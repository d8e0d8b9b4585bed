#!/usr/bin/env bash
# Call 1 (round 4): busy seconds with the server's draw at each kernel's mean times the client's
# pace (ClientPace), against torch.profiler beside the trainer: eager ResNet50 at 120/s (three
# windows, logs kept for the offline replay of the old estimator on the same windows) and 40/s,
# the graph service at 300/s and 100/s, and the BERT-base-sized eager service at 100/s.
set -x
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
host=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -o "H[12]00")
rm -rf /tmp/c1; mkdir -p /tmp/c1
for spec in resnet50:120:300:1 resnet50:120:300:2 resnet50:40:200:1 resnet50-graph:300:750:1 resnet50-graph:100:250:1 bert8:100:300:1 resnet50:120:300:3; do
  IFS=: read svc rate win w <<< "$spec"
  d=/tmp/c1/$svc-$rate-w$w; rm -rf $d; mkdir -p $d
  timeout 110 python3 bench/orion_bench.py timeline --bundle .bundle --service $svc --rate $rate --service-window $win --train-window 50 --together --timing-log --label "$host, client pace, window $w" --out $d > $d/stdout.txt 2>&1
  pkill -9 -x orion-server; pkill -9 -f "torch_[m]odels"; sleep 1
  [ -f $d/results.md ] || tail -20 $d/stdout.txt
  awk -F'|' 'NR>2 {print $3, $10}' $d/results.md
  grep -h "^Busy time over" $d/timing.md | head -2 | cut -c1-330
  cat $d/results.jsonl >> $OUT/busy-results.jsonl
  if [ $svc = resnet50 ] && [ $rate = 120 ]; then
    log=$(grep -o "timing\.[0-9]*\.log, profile-service" $d/timing.md | head -1 | cut -d, -f1)
    gzip -c $d/timing/$log > $d/service.$log.gz
    gzip -c $d/timing/profile-service.kernels.json > $d/profile-service.kernels.json.gz
  fi
  find $d -type f ! -name timing.md ! -name "*.gz" -delete
done
tar -C /tmp/c1 -czf $OUT/windows.tar.gz .
ls -la $OUT/*
