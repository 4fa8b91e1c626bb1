#!/usr/bin/env python3
"""The contested FedCor, HiCS-FL and F3AST claims, run with the authors' own training code.

Issue 41, part 2: the rule, fixed before these runs, is `results/authors-code/README.md`.
This driver runs the authors' own scripts (their partitions, selection and training loops)
from checkouts the user fetched, never copied into this repository:

- FedCor: github.com/Yoruko-Tang/FedCor at d941083ce2840e877476182d898c1ffa878d599b,
  `src/federated_main.py` with the README's FMNIST commands (Rand, Pow-d, FedCor);
- HiCS-FL: github.com/CityChan/HiCS-FL at 25f309d118d72c8ca176b6551704f648b304e100,
  `trainer._train` (what `main.py` calls) with their FMNIST HiCS config
  (`configs/FMNIST/ablation/FMNIST_hics_{2,3}_lambda10_gamma4_M5.json`), and the same
  config with `"method"` set to `random` or `poc` for the baselines;
- F3AST: github.com/mriberodiaz/f3ast at 27b4e33adffea94a3fe53a5600fe5498f4cd3d5d,
  `optimization/main/federated_trainer.py --task=synthetic` (TensorFlow Federated 0.18), F3AST
  (`--schedule importance`) and FedAvg (`--schedule none`) on Synthetic(α, α) under
  SmartPhones, Table 9's claim; the children run in a Python 3.8 environment with their
  requirements (`--f3ast-python`),

and writes one row per (setting, method, seed): rounds to the target test accuracy (F3AST: the final
test accuracy), in the
format of `results/README.md`, to `results/authors-code/`.

What differs from running their scripts as they stand, each applied at run time in this
process (their files are not edited):

FedCor (the fedsel grid `configs/fedcor/table1_fmnist.toml` is at the paper's own size, so
no size changes):
1. `--target_accuracy` (their own option) stops a run at the target: 0.69 in 2SPC, 0.64 in
   Dir; a run that never reaches it runs its 500 rounds and is censored at 500.
2. One seed per invocation (`--seed S`, S = 1..5), `--verbose=0`, CPU (no `--gpu`).
3. Their Dir partition solves a QP with `cvxopt` (`sampling.Dirichlet_noniid`): cvxopt 1.3.3
   from PyPI, on the children's PYTHONPATH (`pip install --target DIR cvxopt`,
   `PYTHONPATH=DIR`). FMNIST is read from the IDX files of `$FEDSEL_DATA/fashion-mnist` by a stand-in for
   `torchvision.datasets.FashionMNIST` (torchvision is not installed): the same arrays,
   `ToTensor` and `Normalize` computed on the whole set at once in float32, the same values
   as torchvision's per-image transforms; `__getitem__` returns (image, int label) as
   torchvision does. `tqdm` is a pass-through stand-in.
4. torch runs one thread (`torch.set_num_threads(1)`), two runs side by side.

HiCS-FL (sizes from fedsel's CPU grid `configs/hics/claims_fmnist_cpu.toml`):
1. The model: their `FMNIST_CNN` is replaced by the MLP 784-64-30-10 (ReLU, no dropout) that
   fedsel's grid runs for every method (their CNN takes about 95 minutes a run on these
   cores); their Xavier initialisation of every Linear layer is kept (it runs on the MLP).
2. Seed: their configs fix `"seed": 42`, which seeds only the partition
   (`np.random.seed(rand_seed)` in `partition_data_various_alpha`); runs here use seed
   S = 1..5 for it, and `torch.manual_seed(S)` before the server is built (their code never
   seeds torch before building the model: `trainer.train` seeds it after training).
3. Baseline configs: the repository has no FMNIST Random or pow-d config; they are the HiCS
   config with `"method"` set to `"random"` / `"poc"` (SGD with momentum 0.9, weight decay
   5e-4, μ = 0.5 prox, 1 local epoch, K = 10 of 50, as fedsel's `code` regime runs all
   three). Setting (3) keeps the authors' `"M": 10` (fedsel's grid gives every setting M = 5).
4. A run stops once the global test accuracy reaches the highest target it is read at
   (75 % in setting 2, 70 % in setting 3; their loop runs 200 rounds, so later rounds
   cannot change the rounds to an earlier target); a run that never reaches it runs its 200
   rounds and is censored at 200.
5. NumPy 2.4 refuses `int()` of a one-element array, which their `sample_clients_entropy`
   (`int(choice(n, 1, p))`) and `clustering.sample_clients` /
   `get_clusters_with_alg2` take: their modules' `choice` and `np.array` give arrays whose
   one-element `int()` works as under NumPy 1.x (NumPy's global generator: the same draws).
6. Their test loader's `num_workers=2` is run with 0 workers (the same batches, in order).
7. Stand-ins for imports their FMNIST path never uses (torchvision's CIFAR, ImageFolder and
   resnet18, PIL, imageio, progress, ipdb, the LMDB ImageNet loader) and the same
   FMNIST and tqdm stand-ins as for FedCor; CPU, one torch thread.

F3AST (sizes of fedsel's grid `configs/f3ast/table9_synthetic.toml`, the paper's: 100
clients, K = 10, 500 rounds, their logistic regression, client SGD lr 0.01, batch 20, one
epoch, server SGD lr 1; flags in `F3AST_FLAGS`, `--beta=0.001` as App. D, their flag default
being 0.01):
1. SmartPhones' q_k: their `federated_synthetic.run_federated` loads q from
   `/home/monica/AVAIL_VECTORS/q_client_0.25_synthetic.npy`, which is not in the repository
   (without it their code falls back silently to q_k ∝ 1/p_k). That load returns
   q_k = t_k / max t, t_k ~ LogNormal(0, 0.25) (App. D.4, their commented-out recipe in
   `utils/training_utils.py`), from `np.random.RandomState([S, 4])`, a stream apart from the
   data's (`smartphones_q`). Until 2026-11-27 it came from `np.random.RandomState(S)`, the
   data generator's own stream (`np.random.seed(S)`), so q rose with the clients' sizes:
   those rows are kept under the methods `fedavg-sizeq` and `f3ast-sizeq`, unplanned.
2. Seeds: `np.random.seed(S)` (their data generator draws from NumPy's global generator,
   never seeded), `random.seed(S)`, `tf.random.set_seed(S)`, `--client_datasets_random_seed=S`.
   The model's initialisation and the clients' `tf.data` shuffles are built in TFF's own
   graphs, which no global seed reaches: unseeded, as in their code.
3. Speed only: `generate_synthetic`'s per-client lists are handed on as float32 arrays
   (`from_tensor_slices` makes the same tensors: checked bit for bit on seed 1, α = 0 and 1).
4. Their `_write_metrics` is wrapped to record `eval/sparse_categorical_accuracy` (the
   pooled test set); the value after round 500 is the row's.
5. A stand-in `jax` module (TFF 0.18 imports its experimental XLA backend, which needs
   jaxlib ~= 0.1.55, no longer on PyPI); any call to it raises, and none is made.

    ~/.pyenv/versions/3.8.18/bin/python -m venv /work/tff-venv
    /work/tff-venv/bin/pip install --no-deps tensorflow_federated==0.18.0
    /work/tff-venv/bin/pip install tensorflow==2.4.1 absl_py==0.12.0 pandas==1.1.4 \
        tensorflow-model-optimization==0.5.0 tensorflow-datasets==4.2.0 'attrs~=19.3.0' \
        'cachetools~=3.1.1' 'dm-tree~=0.1.1' 'grpcio~=1.32.0' 'h5py~=2.10.0' 'numpy~=1.19.2' \
        'portpicker~=1.3.1' 'retrying~=1.3.3' 'semantic-version~=2.8.5' \
        'tensorflow-addons~=0.12.0' 'tensorflow-privacy~=0.5.0' tqdm
    git clone https://github.com/mriberodiaz/f3ast /tmp/f3ast-src && git -C /tmp/f3ast-src checkout 27b4e33adffea94a3fe53a5600fe5498f4cd3d5d
    nice python scripts/reference/authors_training.py --f3ast /tmp/f3ast-src \
        --f3ast-python /work/tff-venv/bin/python --jobs 2

    git clone https://github.com/Yoruko-Tang/FedCor /tmp/fedcor-src && git -C /tmp/fedcor-src checkout d941083ce2840e877476182d898c1ffa878d599b
    git clone https://github.com/CityChan/HiCS-FL /tmp/hics-src && git -C /tmp/hics-src checkout 25f309d118d72c8ca176b6551704f648b304e100
    pip install --target /tmp/cvxopt-pkg cvxopt
    PYTHONPATH=/tmp/cvxopt-pkg FEDSEL_DATA=../shared/data nice python scripts/reference/authors_training.py \
        --fedcor /tmp/fedcor-src --hics /tmp/hics-src --jobs 2 [--only fedcor|hics]

Rows already in the CSVs are skipped, so an interrupted grid resumes, and grids over other
settings (`--settings`) or repositories (`--only`), or the same ones, may run side by side
(a run is marked as taken in $TMPDIR/authors-training-running while it runs). A run whose grid
was stopped while it ran is recorded with `--collect WORKDIR --commit SHA --command CMD`.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

FEDCOR_COMMIT = "d941083ce2840e877476182d898c1ffa878d599b"
HICS_COMMIT = "25f309d118d72c8ca176b6551704f648b304e100"
F3AST_COMMIT = "27b4e33adffea94a3fe53a5600fe5498f4cd3d5d"
SEEDS = [1, 2, 3, 4, 5]
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "authors-code"
FIELDS = [
    "section", "table", "setting", "method", "metric", "seed", "value", "censored",
    "planned", "command", "commit", "config_hash",
]

# FedCor: the README's FMNIST commands (common part, then each method's flags).
FEDCOR_COMMON = [
    "--dataset=fmnist", "--model=mlp", "--mlp_layers", "64", "30", "--epochs=500",
    "--num_users=100", "--frac=0.05", "--local_ep=3", "--local_bs=64", "--lr=5e-3",
    "--schedule", "150", "300", "--lr_decay=0.5", "--optimizer=sgd", "--iid=0",
    "--unequal=0", "--verbose=0",
]
FEDCOR_METHODS = {
    "uniform": [],
    "powd": ["--power_d", "--d=10"],
    "fedcor": [
        "--gpr", "--poly_norm=0", "--GPR_interval=10", "--group_size=100",
        "--GPR_gamma=0.95", "--update_mean", "--warmup=15", "--discount=0.95",
    ],
}
FEDCOR_SETTINGS = {
    "2SPC": (["--shards_per_client=2"], 0.69),
    "Dir": (["--alpha=0.2"], 0.64),
}
FEDCOR_ROUNDS = 500

# HiCS-FL: their FMNIST config (read from the checkout), method per arm, targets per setting.
HICS_METHODS = {"random-code": "random", "powd-code": "poc", "hics-code": "hics"}
HICS_SETTINGS = {
    "setting2": ("configs/FMNIST/ablation/FMNIST_hics_2_lambda10_gamma4_M5.json", [0.70, 0.75]),
    "setting3": ("configs/FMNIST/ablation/FMNIST_hics_3_lambda10_gamma4_M5.json", [0.70]),
}
HICS_SECTIONS = {0.70: ("hics-fig2-fmnist-authors", "Fig. 2"), 0.75: ("hics-table1-fmnist-authors", "Table 1")}
HICS_ROUNDS = 200

# F3AST: Table 9's flags (the paper's App. D sizes), the arms' schedules, α per setting in the
# rule's run order (α = 0, then 1, then 0.5).
F3AST_FLAGS = [
    "--task=synthetic", "--num_users=100", "--clients_per_round=10", "--total_rounds=500",
    "--client_optimizer=sgd", "--client_learning_rate=0.01", "--client_batch_size=20",
    "--client_epochs_per_round=1", "--server_optimizer=sgd", "--server_learning_rate=1.0",
    "--iid=0", "--sine_wave=True", "--var_q_clients=0.25", "--beta=0.001", "--initialize_p=True",
    "--rounds_per_eval=10", "--rounds_per_checkpoint=500", "--experiment_name=run",
]
F3AST_METHODS = {"fedavg": "none", "f3ast": "importance"}
F3AST_SETTINGS = {"alpha0": 0.0, "alpha1": 1.0, "alpha0.5": 0.5}
F3AST_SECTION = ("f3ast-table9-synthetic-authors", "Table 9")
F3AST_ROUNDS = 500
F3AST_Q_PATH = "/home/monica/AVAIL_VECTORS/q_client_0.25_synthetic.npy"
# The second word of the seed of the q stream (`smartphones_q`), any constant but none of the
# seeds: it keeps q apart from the data.
F3AST_Q_STREAM = 4


# ---------------------------------------------------------------- stand-ins (child process)


def _read_idx(path: Path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _torchvision_standin() -> dict[str, types.ModuleType]:
    """`torchvision` with what the authors' FMNIST path calls: FashionMNIST from the local
    IDX files, ToTensor and Normalize (applied to the whole set at once, in float32, the
    same arithmetic as torchvision's per-image transforms)."""
    import torch

    data_dir = Path(os.environ.get("FEDSEL_DATA", "../shared/data")) / "fashion-mnist"

    class ToTensor:
        def __call__(self, x):  # x: uint8 [N, H, W] -> float [N, 1, H, W] in [0, 1]
            return x.unsqueeze(1).to(torch.float32).div(255)

    class Normalize:
        def __init__(self, mean, std):
            self.mean = torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1, 1)
            self.std = torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1, 1)

        def __call__(self, x):
            return x.sub(self.mean).div(self.std)

    class Compose:
        def __init__(self, ts):
            self.ts = ts

        def __call__(self, x):
            for t in self.ts:
                x = t(x)
            return x

    class FashionMNIST(torch.utils.data.Dataset):
        def __init__(self, root, train=True, download=False, transform=None):
            kind = "train" if train else "t10k"
            self.data = torch.from_numpy(_read_idx(data_dir / f"{kind}-images-idx3-ubyte.gz").copy())
            self.targets = torch.from_numpy(_read_idx(data_dir / f"{kind}-labels-idx1-ubyte.gz").astype("int64"))
            self._x = transform(self.data) if transform is not None else self.data

        @property
        def train_labels(self):
            return self.targets

        def __len__(self):
            return len(self.targets)

        def __getitem__(self, i):
            return self._x[i], int(self.targets[i])

    class _Unused:
        def __init__(self, *a, **k):
            raise RuntimeError("not on the FMNIST path: a stand-in")

    tv = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    datasets.FashionMNIST = FashionMNIST
    datasets.CIFAR10 = datasets.MNIST = datasets.ImageFolder = _Unused
    transforms = types.ModuleType("torchvision.transforms")
    transforms.ToTensor, transforms.Normalize, transforms.Compose = ToTensor, Normalize, Compose
    transforms.Resize = transforms.CenterCrop = _Unused
    models = types.ModuleType("torchvision.models")
    models.resnet18 = _Unused
    tv.datasets, tv.transforms, tv.models = datasets, transforms, models
    return {"torchvision": tv, "torchvision.datasets": datasets,
            "torchvision.transforms": transforms, "torchvision.models": models}


def _install_standins(extra: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    mods = _torchvision_standin()
    tq = types.ModuleType("tqdm")
    tq.tqdm = lambda it=None, *a, **k: it
    mods["tqdm"] = tq
    for name in extra:
        mods[name] = types.ModuleType(name)
        mods[name].__getattr__ = _placeholder(name)
    for name, mod in mods.items():
        # torch looks some modules up by spec; a stand-in has one with no loader.
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent in mods:
            setattr(mods[parent], child, mod)


def _placeholder(name):
    """A stand-in module's attributes: a class that refuses to be built (dunders stay absent)."""

    def get(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {"__init__": _refuse(name)})

    return get


def _refuse(name):
    def init(self, *a, **k):
        raise RuntimeError(f"{name}: a stand-in for an import the FMNIST path never uses")

    return init


def child_fedcor(checkout: Path, setting: str, method: str, seed: int, out: Path) -> None:
    import pickle
    import runpy

    _install_standins(["matplotlib", "matplotlib.pyplot"])
    part, target = FEDCOR_SETTINGS[setting]
    argv = FEDCOR_COMMON + part + FEDCOR_METHODS[method] + [
        f"--seed={seed}", f"--target_accuracy={target}"]
    src = checkout / "src"
    sys.path.insert(0, str(src))
    sys.argv = [str(src / "federated_main.py")] + argv
    runpy.run_path(str(src / "federated_main.py"), run_name="__main__")
    (pkl,) = list(Path("save").rglob(f"*_{seed}.pkl"))
    with open(pkl, "rb") as f:
        record = pickle.load(f)
    test_accuracy = [float(a) for a in record[6]]
    out.write_text(json.dumps({"acc": test_accuracy, "argv": argv}))


class _StopRun(Exception):
    pass


def child_hics(checkout: Path, setting: str, method: str, seed: int, out: Path) -> None:
    _install_standins([
        "PIL", "PIL.Image", "imageio", "ipdb", "progress", "progress.bar",
        "pytorch_lmdb_imagenet", "pytorch_lmdb_imagenet.folder2lmdb",
    ])
    import torch
    from torch import nn

    class MLP(nn.Module):
        """fedsel's `mlp` for HiCS-FL's grid: 784-64-30-10, ReLU, no dropout."""

        def __init__(self, *a, **k):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(784, 64), nn.Linear(64, 30), nn.Linear(30, 10)

        def forward(self, x):
            x = x.reshape(x.shape[0], -1)
            return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    loader = torch.utils.data.DataLoader

    class SerialLoader(loader):
        def __init__(self, *a, **k):
            k["num_workers"] = 0
            super().__init__(*a, **k)

    torch.utils.data.DataLoader = SerialLoader
    sys.path.insert(0, str(checkout))
    import cnn
    import clustering

    cnn.FMNIST_CNN = MLP
    clustering.choice = _choice
    clustering.np = _NumPy1()
    import trainer
    from server import server_hics

    server_hics.choice = _choice
    config_path, targets = HICS_SETTINGS[setting]
    args = json.loads((checkout / config_path).read_text())
    args.update({"method": HICS_METHODS[method], "seed": seed, "device": ["cpu"],
                 "exp": f"{setting}_{method}_{seed}"})
    stop_at = max(targets)
    accs: list[float] = []
    for cls in (trainer.Server_base, trainer.Server_PowOfChoice, trainer.Server_HiCS):
        original = cls.global_acc

        def global_acc(self, _original=original):
            _original(self)
            accs.append(float(self.Global_acc[-1]))
            if accs[-1] >= stop_at:
                raise _StopRun

        cls.global_acc = global_acc
    os.makedirs("weights", exist_ok=True)
    torch.manual_seed(seed)
    try:
        trainer._train(args)
    except _StopRun:
        pass
    out.write_text(json.dumps({"acc": accs, "args": args}))


class _OneElement(np.ndarray):
    """An array whose int() works when it holds one element, as under NumPy 1.x."""

    def __int__(self):
        return int(self.reshape(-1)[0]) if self.size == 1 else super().__int__()


def _choice(*a, **k):
    """NumPy's global `choice` (the same draws), as a `_OneElement` array."""
    return np.asarray(np.random.choice(*a, **k)).view(_OneElement)


class _NumPy1:
    """NumPy, but `array` gives arrays whose one-element int() works (as under NumPy 1.x)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def array(*a, **k):
        return np.array(*a, **k).view(_OneElement)


def _jax_standin() -> None:
    """`jax` with the names TFF 0.18's experimental XLA backend touches on import; any call
    raises (the authors' code runs TensorFlow computations only)."""

    def refuse(*a, **k):
        raise RuntimeError("jax: a stand-in; TFF's XLA backend is not installed")

    class ShapeDtypeStruct:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype

    jax = types.ModuleType("jax")
    jax.ShapeDtypeStruct, jax.xla_computation = ShapeDtypeStruct, refuse
    tree_util = types.ModuleType("jax.tree_util")
    tree_util.tree_flatten = refuse
    lib = types.ModuleType("jax.lib")
    xla_bridge = types.ModuleType("jax.lib.xla_bridge")
    xla_bridge.xla_client = types.SimpleNamespace(
        **{n: type(n, (), {"__init__": refuse}) for n in ("XlaComputation", "Client", "Shape")})
    jax.tree_util, jax.lib, lib.xla_bridge = tree_util, lib, xla_bridge
    for name, mod in (("jax", jax), ("jax.tree_util", tree_util), ("jax.lib", lib),
                      ("jax.lib.xla_bridge", xla_bridge)):
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = mod


def smartphones_q(seed: int, coupled: bool = False) -> np.ndarray:
    """App. D.4's SmartPhones q for a run of seed S: q_k = t_k / max t, t_k ~ LogNormal(0, 0.25),
    drawn from `RandomState([S, F3AST_Q_STREAM])`, a stream apart from the data's.

    `coupled` draws it from `RandomState(S)` instead, as this driver did before 2026-11-27:
    that is the stream `np.random.seed(S)` gives their data generator, whose first draw is the
    sizes n_k = ⌊exp(4 + 2 z_k)⌋ + 50, so t_k = exp(0.25 z_k) came from the same z_k and the
    largest clients were the most available (q rose with n_k). Kept to explain the rows it
    made (`f3ast_federation.py --coupled-q`)."""
    rs = np.random.RandomState(seed if coupled else [seed, F3AST_Q_STREAM])
    t = rs.lognormal(0.0, 0.25, 100)
    return t / t.max()


def child_f3ast(checkout: Path, setting: str, method: str, seed: int, out: Path) -> None:
    import random

    _jax_standin()
    sys.path.insert(0, str(checkout))
    random.seed(seed)
    np.random.seed(seed)
    import tensorflow as tf

    tf.random.set_seed(seed)
    from absl import app
    from optimization.main import federated_trainer
    from optimization.synthetic import federated_synthetic
    from utils import training_loop, training_loop_importance
    from utils.datasets import synthetic_dataset

    generate = synthetic_dataset.generate_synthetic

    def as_arrays(*a, **k):
        return tuple([np.asarray(c, dtype=np.float32) for c in part] for part in generate(*a, **k))

    synthetic_dataset.generate_synthetic = as_arrays
    q = smartphones_q(seed)

    class NumPyWithQ:
        """NumPy, but the load of their SmartPhones q file returns App. D.4's q."""

        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def load(path, *a, **k):
            return q if path == F3AST_Q_PATH else np.load(path, *a, **k)

    federated_synthetic.np = NumPyWithQ()
    accs: list = []
    for loop in (training_loop, training_loop_importance):
        def write_metrics(mngr, writer, metrics, round_num, _original=loop._write_metrics):
            if "eval" in metrics:
                accs.append([round_num, float(metrics["eval"]["sparse_categorical_accuracy"])])
            return _original(mngr, writer, metrics, round_num)

        loop._write_metrics = write_metrics
    alpha = F3AST_SETTINGS[setting]
    argv = F3AST_FLAGS + [
        f"--schedule={F3AST_METHODS[method]}", f"--alpha={alpha}", f"--beta_data={alpha}",
        f"--client_datasets_random_seed={seed}", f"--root_output_dir={Path.cwd() / 'out'}"]
    try:
        app.run(federated_trainer.main, argv=["federated_trainer"] + argv)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    out.write_text(json.dumps({"acc": accs, "argv": argv}))


# ---------------------------------------------------------------- the grid (parent process)


def plan(only: str | None, settings: list[str] | None, seeds: list[int] | None = None,
         methods: list[str] | None = None):
    """The runs to do: the rule's seeds (`SEEDS`) unless `seeds` names others, whose rows
    are written unplanned (an explanation, never a verdict's evidence)."""
    seeds = seeds or SEEDS
    cells = []
    if only in (None, "fedcor"):
        for setting in FEDCOR_SETTINGS:
            if settings and setting not in settings:
                continue
            for seed in seeds:
                for method in FEDCOR_METHODS:
                    if not methods or method in methods:
                        cells.append(("fedcor", setting, method, seed))
    if only in (None, "hics"):
        for setting in HICS_SETTINGS:
            if settings and setting not in settings:
                continue
            for seed in seeds:
                for method in HICS_METHODS:
                    if not methods or method in methods:
                        cells.append(("hics", setting, method, seed))
    if only in (None, "f3ast"):
        for setting in F3AST_SETTINGS:
            if settings and setting not in settings:
                continue
            for seed in seeds:
                for method in F3AST_METHODS:
                    if not methods or method in methods:
                        cells.append(("f3ast", setting, method, seed))
    return cells


def rows_for(repo: str, setting: str, method: str, seed: int, acc: list[float], command: str,
             commit: str, detail: str) -> list[dict]:
    config_hash = hashlib.sha256(detail.encode()).hexdigest()
    if repo == "f3ast":
        last_round, final_acc = acc[-1]
        if last_round != F3AST_ROUNDS:
            raise RuntimeError(f"f3ast {setting} {method} {seed}: last evaluation at round {last_round}")
        return [{
            "section": F3AST_SECTION[0], "table": F3AST_SECTION[1], "setting": setting,
            "method": method, "metric": "final_acc", "seed": seed, "value": repr(final_acc),
            "censored": "false", "planned": "true" if seed in SEEDS else "false",
            "command": command, "commit": commit, "config_hash": config_hash,
        }]
    if repo == "fedcor":
        targets = [(FEDCOR_SETTINGS[setting][1], "fedcor-table1-fmnist-authors", "Table 1", FEDCOR_ROUNDS)]
    else:
        targets = [(t, *HICS_SECTIONS[t], HICS_ROUNDS) for t in HICS_SETTINGS[setting][1]]
    rows = []
    for target, section, table, rounds in targets:
        reached = next((i + 1 for i, a in enumerate(acc) if a >= target), None)
        if reached is None and len(acc) < rounds:
            raise RuntimeError(f"{repo} {setting} {method} {seed}: stopped at {len(acc)} rounds short of {target}")
        rows.append({
            "section": section, "table": table, "setting": setting, "method": method,
            "metric": "rounds_to_target", "seed": seed,
            "value": f"{float(reached if reached is not None else rounds):.1f}",
            "censored": "false" if reached is not None else "true", "planned": "true" if seed in SEEDS else "false",
            "command": command, "commit": commit, "config_hash": config_hash,
        })
    return rows


def csv_path(section: str) -> Path:
    return OUT / f"{section}.csv"


def done(section: str) -> set:
    p = csv_path(section)
    if not p.exists():
        return set()
    with open(p, newline="") as f:
        return {(r["setting"], r["method"], r["seed"]) for r in csv.DictReader(f)}


def append(rows: list[dict]) -> None:
    for row in rows:
        p = csv_path(row["section"])
        new = not p.exists()
        with open(p, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
            if new:
                w.writeheader()
            w.writerow(row)


def sections_of(repo: str, setting: str) -> list[str]:
    if repo == "f3ast":
        return [F3AST_SECTION[0]]
    if repo == "fedcor":
        return ["fedcor-table1-fmnist-authors"]
    return [HICS_SECTIONS[t][0] for t in HICS_SETTINGS[setting][1]]


def is_done(repo: str, setting: str, method: str, seed: int) -> bool:
    return all((setting, method, str(seed)) in done(s) for s in sections_of(repo, setting))


RUNNING = Path(tempfile.gettempdir()) / "authors-training-running"


def claim(repo: str, setting: str, method: str, seed: int) -> Path | None:
    """Marks a run as taken, so that grids side by side never run it twice; None if taken."""
    RUNNING.mkdir(exist_ok=True)
    mark = RUNNING / f"{repo}-{setting}-{method}-{seed}"
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    return mark


def record(repo: str, setting: str, method: str, seed: int, res: Path, commit: str,
           command: str, seconds: float) -> None:
    """Appends the rows of one finished run (its child's result file)."""
    authors = {"fedcor": FEDCOR_COMMIT, "hics": HICS_COMMIT, "f3ast": F3AST_COMMIT}[repo]
    r = json.loads(res.read_text())
    detail = json.dumps({"repo": repo, "authors_commit": authors, "setting": setting,
                         "method": method, "seed": seed,
                         "run": r.get("argv") or r.get("args")}, sort_keys=True)
    cmd = f"{command} (authors' {repo} at {authors[:7]})"
    rows = rows_for(repo, setting, method, seed, r["acc"], cmd, commit, detail)
    append(rows)
    print(f"{repo} {setting} {method} seed {seed}: "
          + ", ".join(f"{x['section']} {x['value']}{' (censored)' if x['censored'] == 'true' else ''}" for x in rows)
          + f" [{seconds:.0f} s, {len(r['acc'])} rounds]", flush=True)


def grid(a) -> None:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    checkouts = {"fedcor": a.fedcor, "hics": a.hics, "f3ast": a.f3ast}
    command = ("PYTHONPATH=/tmp/cvxopt-pkg FEDSEL_DATA=../shared/data nice python scripts/reference/authors_training.py "
               + " ".join(sys.argv[1:]))
    todo = [c for c in plan(a.only, a.settings, a.seeds, a.methods) if not is_done(*c)]
    print(f"{len(todo)} runs to do", flush=True)
    running: list = []
    scratch = Path(tempfile.mkdtemp(prefix="authors-runs-"))
    while todo or running:
        while todo and len(running) < a.jobs:
            repo, setting, method, seed = todo.pop(0)
            # Another grid may have finished this run meanwhile, or be running it.
            if checkouts[repo] is None or is_done(repo, setting, method, seed):
                continue
            mark = claim(repo, setting, method, seed)
            if mark is None:
                continue
            work = scratch / f"{repo}-{setting}-{method}-{seed}"
            work.mkdir()
            res = work / "result.json"
            log = open(work / "log.txt", "w")
            python = a.f3ast_python if repo == "f3ast" else sys.executable
            p = subprocess.Popen(
                [str(python), str(Path(__file__).resolve()), "--child", repo,
                 "--checkout", str(checkouts[repo]), "--setting", setting, "--method", method,
                 "--seed", str(seed), "--result", str(res)],
                cwd=work, stdout=log, stderr=subprocess.STDOUT)
            running.append((p, (repo, setting, method, seed), res, time.time(), work, mark))
        time.sleep(2)
        for item in list(running):
            p, (repo, setting, method, seed), res, t0, work, mark = item
            if p.poll() is None:
                continue
            running.remove(item)
            if p.returncode != 0:
                tail = (work / "log.txt").read_text()[-3000:]
                print(f"FAILED {repo} {setting} {method} {seed}:\n{tail}", flush=True)
            else:
                record(repo, setting, method, seed, res, commit, command, time.time() - t0)
            mark.unlink()


def collect(work: Path, commit: str, command: str) -> None:
    """Appends the rows of a run whose grid was stopped while it ran: its work directory
    (named repo-setting-method-seed) holds the child's result file."""
    repo, setting, *method, seed = work.name.split("-")
    record(repo, setting, "-".join(method), int(seed), work / "result.json", commit, command, 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fedcor", type=Path, help="a checkout of Yoruko-Tang/FedCor at " + FEDCOR_COMMIT)
    ap.add_argument("--hics", type=Path, help="a checkout of CityChan/HiCS-FL at " + HICS_COMMIT)
    ap.add_argument("--f3ast", type=Path, help="a checkout of mriberodiaz/f3ast at " + F3AST_COMMIT)
    ap.add_argument("--f3ast-python", type=Path, default=Path(sys.executable),
                    help="the Python of an environment with the F3AST authors' requirements (TFF 0.18)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", choices=["fedcor", "hics", "f3ast"])
    ap.add_argument("--settings", nargs="*", help="only these settings (2SPC, Dir, setting2, setting3, alpha0, alpha1, alpha0.5)")
    ap.add_argument("--seeds", type=int, nargs="*",
                    help="other seeds than the rule's 1-5: their rows are unplanned arms")
    ap.add_argument("--methods", nargs="*", help="only these methods (e.g. powd, random-code)")
    ap.add_argument("--collect", type=Path, help="append the rows of a finished run's work directory")
    ap.add_argument("--commit", help="with --collect: the commit its grid ran at")
    ap.add_argument("--command", help="with --collect: the command of its grid")
    ap.add_argument("--child", choices=["fedcor", "hics", "f3ast"], help=argparse.SUPPRESS)
    ap.add_argument("--checkout", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "fedcor":
        child_fedcor(a.checkout.resolve(), a.setting, a.method, a.seed, a.result)
    elif a.child == "hics":
        child_hics(a.checkout.resolve(), a.setting, a.method, a.seed, a.result)
    elif a.child == "f3ast":
        child_f3ast(a.checkout.resolve(), a.setting, a.method, a.seed, a.result)
    elif a.collect is not None:
        collect(a.collect, a.commit, a.command)
    else:
        for name, path, tell in (("fedcor", a.fedcor, "src/federated_main.py"), ("hics", a.hics, "trainer.py"),
                                 ("f3ast", a.f3ast, "optimization/main/federated_trainer.py")):
            if path is not None and not (path / tell).is_file():
                sys.exit(f"--{name} {path}: no {tell}; pass a checkout at the commit in the docstring")
        grid(a)


if __name__ == "__main__":
    main()
