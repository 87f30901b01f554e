"""GAT on Cora, after the recipe of PyG's examples/gat.py (our own script), with gnncompile as
one optional line.

    python benchmarks/examples/gat_cora.py                 # plain PyG
    python benchmarks/examples/gat_cora.py --compile       # + model = gnncompile.compile(model)
    python benchmarks/examples/gat_cora.py --epochs 20 --json out.json

Planetoid Cora with NormalizeFeatures; dropout 0.6 on the input, GATConv(F, 8, heads=8,
dropout=0.6) -> elu -> dropout 0.6 -> GATConv(64, C, heads=1, concat=False, dropout=0.6);
Adam lr 0.005, weight decay 5e-4. Each epoch is one training step on the whole graph then a
full evaluation (train / val / test accuracy). The raw files under ``--root`` (default
../shared/data/planetoid from the repository, holding Cora/raw) are copied into a temporary
folder that Planetoid processes: the given root is never written. ``--json PATH`` writes the
per-epoch times, the final test accuracy and the script's own wall time (from its first line
to its end, imports and dataset processing included).
"""
import time

_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

# ../shared/data/planetoid from the repository root (this file is <repo>/benchmarks/examples/)
DEFAULT_ROOT = Path(__file__).resolve().parent / ".." / ".." / ".." / "shared" / "data" / "planetoid"

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--compile", action="store_true", help="model = gnncompile.compile(model)")
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--root", default=str(DEFAULT_ROOT), help="a folder holding Cora/raw (read only)")
parser.add_argument("--json", default=None, help="write timings and accuracy here")
parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
args = parser.parse_args()

raw = Path(args.root) / "Cora" / "raw"
if not raw.is_dir() or not any(raw.iterdir()):
    sys.exit(f"gat_cora.py: the raw Cora files are not in {raw} (expected ind.cora.* there; "
             f"pass --root DIR with DIR/Cora/raw)")

warnings.simplefilter("ignore")  # torch.jit deprecation warnings from PyG's imports
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_geometric.transforms as T  # noqa: E402
from torch_geometric.datasets import Planetoid  # noqa: E402
from torch_geometric.nn import GATConv  # noqa: E402

if args.threads:
    torch.set_num_threads(args.threads)
torch.manual_seed(0)

tmp_root = tempfile.mkdtemp(prefix="cora_")
try:
    shutil.copytree(raw, os.path.join(tmp_root, "Cora", "raw"))
    dataset = Planetoid(tmp_root, "Cora", transform=T.NormalizeFeatures())
    data = dataset[0]
finally:
    shutil.rmtree(tmp_root, ignore_errors=True)


class GAT(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, heads):
        super().__init__()
        self.conv1 = GATConv(in_channels, hidden_channels, heads, dropout=0.6)
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=1, concat=False, dropout=0.6)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        return self.conv2(x, edge_index)


model = GAT(dataset.num_features, 8, dataset.num_classes, heads=8)
if args.compile:
    import gnncompile

    model = gnncompile.compile(model)
optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)


def train():
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    return float(loss)


@torch.no_grad()
def test():
    model.eval()
    pred = model(data.x, data.edge_index).argmax(dim=-1)
    return [float((pred[m] == data.y[m]).sum()) / int(m.sum())
            for m in (data.train_mask, data.val_mask, data.test_mask)]


times = []
for epoch in range(1, args.epochs + 1):
    t0 = time.perf_counter()
    loss = train()
    train_acc, val_acc, test_acc = test()
    times.append(time.perf_counter() - t0)
    print(f"Epoch {epoch:03d}, loss {loss:.4f}, train {train_acc:.4f}, val {val_acc:.4f}, "
          f"test {test_acc:.4f}, {times[-1] * 1e3:.1f} ms")

result = {"example": "gat", "compile": args.compile, "epochs": args.epochs,
          "threads": torch.get_num_threads(), "epoch_times_s": times, "first_epoch_s": times[0],
          "median_epoch_s": statistics.median(times), "final_loss": loss, "final_train_acc": train_acc,
          "final_val_acc": val_acc, "final_test_acc": test_acc}
result["wall_s"] = time.perf_counter() - _START
if args.json:
    Path(args.json).write_text(json.dumps(result, indent=2))
print(f"median epoch {result['median_epoch_s'] * 1e3:.1f} ms, first epoch {times[0]:.2f} s, "
      f"test accuracy {test_acc:.4f}, wall {result['wall_s']:.1f} s")
