#!/usr/bin/env bash
# The measurements of docs/performance.md: `splitformer bench` (through benchmarks/bench.py, so
# that timm imports) suite by suite, each into results/performance/<name>.json. Resumable: a
# suite whose JSON exists is not run again (delete the file to rerun it). Run it on a quiet
# machine; about an hour on 2 cores. Then `python benchmarks/performance_tables.py` prints
# the tables of docs/performance.md from the JSON files.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=results/performance
THREADS=${THREADS:-$(nproc)}
mkdir -p "$OUT"
run() {  # run NAME ARGS...: one suite's JSON
  local name=$1; shift
  if [[ -f "$OUT/$name.json" ]]; then echo "have $OUT/$name.json"; return; fi
  echo "== $name: splitformer bench $* --threads $THREADS"
  "$PY" benchmarks/bench.py "$@" --threads "$THREADS" --out "$OUT/$name.json.part" \
    > "$OUT/$name.txt"
  mv "$OUT/$name.json.part" "$OUT/$name.json"
}
run encoder-d256  encoder --size d256 --repeats 7
run memory        memory --size d256,d768
run schemes-d256  schemes --size d256 --repeats 7 --paths train,no_grad
run costs-d256    costs --size d256 --repeats 5 --paths train,no_grad
run compile-d256  compile --size d256 --repeats 7 --paths train,no_grad
run encoder-tiny  encoder --size tiny --repeats 9
run refine-d256   refine --size d256 --repeats 5 --paths train,no_grad
run seq-d256      seq --size d256 --repeats 5 --paths train,no_grad
for i in 1 2 3; do  # the pair torch.nn / splitformer in three processes: the spread between runs
  run flops-d256-$i flops --size d256 --repeats 7 --paths train,no_grad
  run flops-d768-$i flops --size d768 --repeats 5 --paths train,no_grad
done
run encoder-d768  encoder --size d768 --repeats 5
run compile-d768  compile --size d768 --repeats 5 --paths no_grad
run generate-gpt2 generate --repeats 5 --paths no_grad
