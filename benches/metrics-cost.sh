#!/usr/bin/env bash
# One shmem device pair (bsampler -> sink, 64 B, 10 000 001 messages), with or without a
# Prometheus endpoint on both devices scraped every 100 ms: what exporting metrics costs the
# data path. Modes: `with` (endpoints, scraped), `scraper-only` (the same scraping loop knocking
# on closed ports: its own CPU, which on 2 cores competes with the pair), `unscraped` (endpoints,
# nobody scrapes), `without`. `cargo xtask bench` runs the four modes interleaved, round by
# round, and reports `with` against `scraper-only` and `unscraped` against `without`, pair by
# pair. By hand: `cargo build --release -p ferromq-cli`, then time the modes in turn, e.g.
#   for round in 1 2 3; do for mode in with scraper-only; do /usr/bin/time -f "$mode %e s" benches/metrics-cost.sh $mode; done; done
set -euo pipefail
mode=${1:?usage: metrics-cost.sh with|scraper-only|unscraped|without}
bin=${FERROMQ:-$(dirname "$0")/../target/release/ferromq}
dir=$(mktemp -d)
session=mcost$$
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"; "$bin" shm clean --session "$session" --force >/dev/null 2>&1 || true' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sampler_metrics=() sink_metrics=()
p1=$(free_port); p2=$(free_port)
if [ "$mode" = with ] || [ "$mode" = unscraped ]; then
  sampler_metrics=(--metrics "127.0.0.1:$p1"); sink_metrics=(--metrics "127.0.0.1:$p2")
fi
if [ "$mode" = with ] || [ "$mode" = scraper-only ]; then
  (
    while :; do
      for p in "$p1" "$p2"; do
        { exec 3<>"/dev/tcp/127.0.0.1/$p" && printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3 && cat <&3 >/dev/null; exec 3>&-; } 2>/dev/null || true
      done
      sleep 0.1
    done
  ) &
elif [ "$mode" != without ] && [ "$mode" != unscraped ]; then
  echo "metrics-cost.sh: mode $mode: expected with, scraper-only, unscraped or without" >&2; exit 2
fi
address="ipc://$dir/data"
common=(--control static --transport shmem --session "$session" --max-iterations 10000000 --severity warn)
"$bin" device sink --id sink "${common[@]}" "${sink_metrics[@]}" \
  --channel-config "name=data,type=pull,method=bind,address=$address,rateLogging=0" > "$dir/sink.log" &
sink=$!
"$bin" device bsampler --id sampler "${common[@]}" "${sampler_metrics[@]}" --msg-size 64 \
  --channel-config "name=data,type=push,method=connect,address=$address,rateLogging=0" > "$dir/sampler.log"
wait "$sink"
grep -q "received 10000001 messages" "$dir/sink.log" || { cat "$dir/sink.log" >&2; exit 1; }
