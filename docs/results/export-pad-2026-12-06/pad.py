"""What padding a short batch costs: the demo mlp exported from 1 row, and with Dim.AUTO (from 2 rows: a one-row
batch is padded to 2, its copy's answer dropped), each loaded by wok's repository and run as a CPU instance runs it.

    .venv/bin/python docs/results/export-pad-2026-12-06/pad.py 3000 > docs/results/export-pad-2026-12-06/pad.txt

The demo mlp (256 -> 1024 -> 1024 -> 256, fp32) saved twice as a torch.export program: `from_1` with a batch Dim
of 1-32, `auto` with Dim.AUTO. Both are served without torch's per-call checks (the config's dims are fixed), and
run through an Instance's own call path (`_forward_cpu`, `--cpu-linear torch`, intra-op threads sized per batch).
The two alternate within each round, one and two rows each; medians (nearest-rank) in µs. `auto` at one row
against `from_1` at two is the padding's own cost (a cat of the first row's copy, each output's rows cut);
against `from_1` at one, what a one-row batch pays for it, the second row's compute included.
"""

import os
import sys
import tempfile
import textwrap
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads

import torch

from wok.executor import Instance
from wok.models.mlp import MLP, SEED
from wok.repository import load_servable

# The instances and their timing as checks.py, beside this folder, makes them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export-checks-2026-12-05"))
from checks import instance, medians

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
ROWS = (1, 2)
CONFIG = """
platform = "torch_export"
model_file = "model.pt2"
max_batch_size = 32
inputs = [{ name = "INPUT0", datatype = "FP32", dims = [256] }]
outputs = [{ name = "OUTPUT0", datatype = "FP32", dims = [256] }]
"""


def exported(root: Path, name: str, ref: torch.nn.Module, batch) -> Instance:
    d = root / name
    d.mkdir()
    (d / "config.toml").write_text(textwrap.dedent(CONFIG))
    program = torch.export.export(ref, (torch.randn(3, 256),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(d / "model.pt2"))
    return instance(load_servable(d))


def main(root: Path) -> None:
    threads = torch.get_num_threads()  # before the instances size them per batch
    torch.manual_seed(SEED)
    ref = MLP(256, 1024, 256, 2).eval()
    ways = {
        "from_1": exported(root, "from_1", ref, torch.export.Dim("batch", min=1, max=32)),
        "auto": exported(root, "auto", ref, torch.export.Dim.AUTO),
    }
    med = medians(ways, ROWS, ref, ROUNDS)
    print(f"torch {torch.__version__}, {threads} threads at most; µs per forward, medians of {ROUNDS}")
    print(f"{'rows':>4} {'from_1':>10} {'auto':>10}")
    for rows in ROWS:
        print(f"{rows:>4} {med[('from_1', rows)]:10.1f} {med[('auto', rows)]:10.1f}")
    print(
        f"auto at 1 row (padded to 2): {med[('auto', 1)] - med[('from_1', 2)]:+.1f} µs against from_1 at 2 rows, "
        f"{med[('auto', 1)] - med[('from_1', 1)]:+.1f} µs ({med[('auto', 1)] / med[('from_1', 1)]:.2f} ×) against "
        "from_1 at 1 row"
    )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(Path(tmp))
