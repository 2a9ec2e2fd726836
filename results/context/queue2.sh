#!/bin/sh
while kill -0 25114 2>/dev/null; do sleep 10; done
C=".venv/bin/python -m splitformer.experiments.context run --threads 1"
$C --docs kjv --rules dynamic,bandwidth-follow-32 --factors 4
$C --docs wiki --rules bandwidth-follow,yarn --factors 2
$C --docs wiki --rules bandwidth-follow --factors 4
