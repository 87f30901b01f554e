"""Rules the CPU and CUDA kernels share, checked on the host (no GPU needed).

The max / min rule (``arg_fold`` in native/common/macros.h): the CPU core folds a row's
messages in CSR slot order; the CUDA kernels fold runs of a row in separate groups and then the
runs' results in group order. Both must give the CPU's value and record for every split of a
row, NaN, infinities and ties included (torch's scatter_reduce propagates NaN): the slot of the
extreme when one message reached it, -N when N messages tie, kNanRecord for NaN: what torch's
gradient needs (it splits a tie evenly).
"""
from __future__ import annotations

import math
import random
import struct
import subprocess
import textwrap

_HARNESS = textwrap.dedent("""
    #include <cstdio>
    #include <cstdint>
    #include <vector>
    #include "common/macros.h"
    using gnncompile::arg_code;
    using gnncompile::arg_fold;
    // stdin: is_min n v_0 .. v_{n-1} k c_1 .. c_k (cut points); stdout: value record (sequential)
    // value record (folded runs)
    int main() {
      int is_min, n;
      while (std::scanf("%d %d", &is_min, &n) == 2) {
        std::vector<float> v(n);
        for (int i = 0; i < n; ++i) std::scanf("%a", &v[i]);
        int k; std::scanf("%d", &k);
        std::vector<int> cuts(k);
        for (int i = 0; i < k; ++i) std::scanf("%d", &cuts[i]);
        float acc = 0; int64_t best = -1;  // sequential, as the CPU core
        for (int j = 0; j < n; ++j) arg_fold<float>(is_min, v[j], arg_code(j, v[j] != v[j]), acc, best);
        float racc = 0; int64_t rbest = -1;  // runs, then their results in order, as CUDA
        int begin = 0;
        for (int r = 0; r <= k; ++r) {
          const int end = r < k ? cuts[r] : n;
          float pa = is_min ? 1.0f / 0.0f : -1.0f / 0.0f; int64_t pb = -1;  // the kernels' init
          for (int j = begin; j < end; ++j) arg_fold<float>(is_min, v[j], arg_code(j, v[j] != v[j]), pa, pb);
          if (pb != -1) arg_fold<float>(is_min, pa, pb, racc, rbest);
          begin = end;
        }
        std::printf("%a %lld %a %lld\\n", acc, (long long)best, racc, (long long)rbest);
      }
      return 0;
    }
""")


NAN_RECORD = -(1 << 62)  # kNanRecord


def _expected(values, is_min):
    """torch.scatter_reduce's amax / amin of one row and the kernels' record: NaN if any
    message is NaN (kNanRecord), else the extreme and its slot when one message is equal to it,
    -N when N are."""
    if any(math.isnan(v) for v in values):
        return float("nan"), NAN_RECORD
    best = min(values) if is_min else max(values)
    n = values.count(best)
    return best, values.index(best) if n == 1 else -n


def test_max_min_rule_is_the_same_for_every_split(build_host_harness):
    exe = build_host_harness(_HARNESS)
    rng = random.Random(0)
    pool = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 2.5, 2.5, -3.0]
    cases = []
    for _ in range(4000):
        n = rng.randint(1, 12)
        values = [rng.choice(pool) if rng.random() < 0.7 else rng.uniform(-5, 5) for _ in range(n)]
        cuts = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) if n > 1 else []
        cases.append((rng.randint(0, 1), values, cuts))
    lines = [" ".join([str(m), str(len(v)), *(float(x).hex() for x in v), str(len(c)), *map(str, c)])
             for m, v, c in cases]
    res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", check=True, capture_output=True, text=True)
    out = res.stdout.strip().splitlines()
    assert len(out) == len(cases)
    for (is_min, values, cuts), line in zip(cases, out):
        seq_v, seq_s, run_v, run_s = line.split()
        seq_v, run_v = float.fromhex(seq_v), float.fromhex(run_v)
        want_v, want_s = _expected([struct.unpack("f", struct.pack("f", x))[0] for x in values], is_min)
        for v, s in ((seq_v, int(seq_s)), (run_v, int(run_s))):
            assert s == want_s, (is_min, values, cuts, line)
            assert (math.isnan(v) and math.isnan(want_v)) or v == want_v, (is_min, values, cuts, line)
