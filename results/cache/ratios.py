"""Each row of a policy log (lines "Policy(budget=B, ...) perplexity P ...") against the
HeavyHitters row of its budget, in percent of perplexity:

    python results/cache/ratios.py results/cache/heavy-variants-kjv0.log
"""

import re
import sys

rows = [(m[1], int(m[2]), float(m[3])) for line in open(sys.argv[1])
        if (m := re.match(r"(.*?budget=(\d+)\b.*?) perplexity ([\d.]+)", line))]
h2o = {b: p for name, b, p in rows if name.startswith("HeavyHitters(")}
for name, b, p in rows:
    if b in h2o:
        print(f"{100 * (p / h2o[b] - 1):+.2f}%  {name}")
