#!/bin/sh
# After the kjv bandwidth-follow 4x row: the 4x comparison on kjv, then the second document.
while ! grep -q '"length": 32768, "rule": "bandwidth-follow"' results/context/rows.jsonl; do sleep 10; done
pkill -f "rules bandwidth-follow,bandwidth,yarn,dynamic"
sleep 2
C=".venv/bin/python -m splitformer.experiments.context run --threads 1"
$C --docs kjv --rules yarn,dynamic --factors 4
$C --docs wiki --rules bandwidth-follow,yarn --factors 2,4
$C --docs wiki --rules dynamic --factors 4
$C --docs kjv --rules bandwidth,linear,default --factors 4
