#!/bin/bash
# Screenshots of TensorBoard's dashboards as a browser shows them (headless Chromium, which runs TensorBoard's
# JavaScript for --virtual-time-budget ms before the shot).
#   bash screenshots.sh LOGDIR OUTDIR [PORT] [NAMES...]   NAMES: which shots (default: all below)
# Starts tensorboard on LOGDIR (with the venv's tensorboard on PATH), takes the shots, stops that tensorboard (by
# its process id).
set -u
logdir=$1 out=$2 port=${3:-6006}
shift $(( $# < 3 ? $# : 3 ))
names=${*:-hparams text histograms custom_scalars timeseries}
mkdir -p "$out"
tensorboard --logdir "$logdir" --port "$port" > "$out/tensorboard_$port.log" 2>&1 &
tb=$!
sleep 8  # tensorboard reads the event files before it answers
declare -A url=([hparams]='#hparams' [text]='#text' [histograms]='#histograms' [custom_scalars]='#custom_scalars'
                [timeseries]='#timeseries')
declare -A size=([hparams]='2500,330' [text]='1600,1000' [histograms]='1600,560' [custom_scalars]='1600,1000'
                 [timeseries]='1600,1400')
for name in $names; do
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="${size[$name]}" \
    --virtual-time-budget=15000 --screenshot="$out/$name.png" "http://localhost:$port/${url[$name]}" \
    > /dev/null 2>&1
done
kill "$tb" && rm "$out/tensorboard_$port.log"  # the log stays where tensorboard had already stopped
wait "$tb" 2> /dev/null
