"""Type stubs of the Rust extension; `fedsel/__init__.py` wraps the functions."""

import os
from typing import Any, Callable, Mapping, Protocol, Sequence

VERSION: str

class FedselError(Exception):
    """A fedsel error: a bad config, missing data, a failed run. The message is the CLI's."""

def run(
    *,
    path: str | os.PathLike[str] | None = None,
    text: str | None = None,
    table: dict[str, Any] | None = None,
    overrides: list[str] = ...,
    out: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    progress: str = "off",
    overwrite: bool = False,
    resume: bool = False,
    on_round: Callable[[dict[str, Any]], Any] | None = None,
    selector: Any = None,
) -> tuple[str, list[str]]: ...
def class_path(selector: Any) -> str:
    """`py:module:Class` for a selector object's class."""

class SelectionStream:
    """`ctx.rng`: the round's selection stream, lent for one `select` / `plan` call."""

    def sample(self, items: Sequence[int], k: int) -> list[int]: ...
    def weighted_sample(self, items: Sequence[int], weights: Sequence[float], k: int) -> list[int]: ...
    def random(self) -> float: ...
    def integers(self, low: int, high: int) -> int: ...
    def numpy(self) -> Any: ...

class ClientQuery:
    """`ctx.query`: reports from available clients, booked in the ledger and on the clock,
    lent for one `select` / `plan` call. Arrays come back as NumPy arrays."""

    def losses(self, clients: Sequence[int]) -> Any: ...
    def minibatch_losses(self, clients: Sequence[int]) -> Any: ...
    def probe(self, train: Sequence[int], evaluate: Sequence[int]) -> Any: ...
    def advance(self, train: Sequence[int], evaluate: Sequence[int]) -> Any: ...
    def updates(self, clients: Sequence[int]) -> Any: ...
    def gradients(self, clients: Sequence[int], scope: str = "full") -> Any: ...
    def gram(self, clients: Sequence[int]) -> Any: ...
def sweep(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    jobs: int | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    overrides: list[str] = ...,
    progress: bool = False,
    keep_going: bool = False,
) -> tuple[int, int, int, list[tuple[str, str]], str | None, int]: ...
def report(dir: str | os.PathLike[str], *, smooth: int | None = None) -> str: ...
def cli(argv: list[str]) -> int:
    """Runs the `fedsel` command line on `argv` (the program's name first) and returns its
    exit status; the GIL is released while it runs. While `fedsel run` runs, SIGINT and
    SIGTERM are the CLI's: the run stops after its round (status 130 or 143)."""
def partition(
    *,
    path: str | os.PathLike[str] | None = None,
    text: str | None = None,
    table: dict[str, Any] | None = None,
    overrides: list[str] = ...,
    data_dir: str | os.PathLike[str] | None = None,
) -> list[tuple[list[int], list[int]]]: ...

class Query(Protocol):
    """What a strategy may ask while it selects; implement the methods your strategy uses
    (a missing one raises FedselError naming it). Each answers for the clients named, in
    their order."""

    def losses(self, clients: list[int]) -> Sequence[float]:
        """Held-out loss of the current global model on each client (Pow-d, FedCor, AFL)."""
    def minibatch_losses(self, clients: list[int]) -> Sequence[float]:
        """Loss on one random training mini-batch of each client (cpow-d)."""
    def probe(self, clients: list[int], evaluate: list[int]) -> Sequence[float]:
        """`clients` train from the global model, their models are aggregated, and the
        probe model's held-out loss on each of `evaluate` comes back (FedCor)."""
    def advance(self, clients: list[int], evaluate: list[int]) -> Sequence[float]:
        """Like `probe`, but the aggregated model becomes the global model (FedGP)."""
    def updates(self, clients: list[int]) -> Sequence[Sequence[float]]:
        """Each client's update x_k - w, trained from the global model (FedGS_cos)."""
    def gradients(self, clients: list[int], scope: str) -> Sequence[Sequence[float]]:
        """Each client's gradient at the global model, over `scope` = "full" or
        "minibatch" of its training data (DivFL)."""
    def noise_responses(
        self, updates: list[list[float]], batch: int
    ) -> Sequence[Sequence[float]]:
        """Mean logits of each model w + update on `batch` Gaussian-noise inputs (FedGS_func)."""
    def gram(self, clients: list[int]) -> Sequence[Sequence[float]]:
        """The Gram matrix of the clients' private features, by secure scalar products
        (FedGS with graph = "sspp")."""

class Selector:
    """A fedsel selection strategy, used without the simulator.

    `strategy` is a strategy's name (`py:module:Class` for a class written in Python) or
    a selector object written in Python. `options` are the strategy's config keys
    (`[selection.<strategy>]`), e.g. `d=10` for powd, or a Python class's arguments. `classes` is the output layer's width (HiCS-FL). The oracle arguments are only
    for strategies defined with oracle knowledge. `durations`: each client's round trip in
    seconds as its device reports it at registration (Oort's `code` protocol reads it).
    `devices`: one dict per client of what its device reports at registration
    (`download_s`, `compute_s`, `upload_s` in seconds, `steps` of the run's own work,
    `epoch_steps` a pass over its data, `batch`), needed by strategies that rank devices
    (PyramidFL), which then give `orders`.
    """

    def __init__(
        self,
        strategy: str | Any,
        *,
        sizes: Sequence[int],
        per_round: int,
        rounds: int,
        seed: int = 0,
        classes: int = 0,
        oracle_features: Sequence[Sequence[float]] | None = None,
        oracle_label_histograms: Sequence[Sequence[int]] | None = None,
        durations: Sequence[float] | None = None,
        devices: Sequence[Mapping[str, float | int]] | None = None,
        **options: Any,
    ) -> None: ...
    @property
    def strategy(self) -> str:
        """The strategy's name."""
    @property
    def aggregation(self) -> str:
        """The strategy's own aggregation rule: "mean", "data_size" or "selector"."""
    @property
    def updates(self) -> str:
        """Which part of each update `observe` needs: "none", "full" or "output_layer"
        (the output layer's bias then weight)."""
    @property
    def weights(self) -> list[float] | None:
        """The last selection's aggregation weights when the rule is "selector" (F3AST)."""
    @property
    def orders(self) -> list[tuple[float, float | None]] | None:
        """The last selection's orders, one (work, dropout) per selected entry, when the
        strategy gives them (PyramidFL): the entry trains floor(steps * work) mini-batch
        steps and leaves the fraction `dropout` of its update out of its upload (None: the
        whole update)."""
    def select(
        self, round: int, available: Sequence[int], budget: int, query: Query | object
    ) -> list[int]:
        """Chooses at most `budget` clients of `available` for `round`, asking `query`."""
    def observe(
        self,
        selected: Sequence[int],
        *,
        updates: Sequence[Sequence[float]] | None = None,
        train_losses: Sequence[float] | None = None,
        durations: Sequence[float] | None = None,
        dropped: Sequence[int] | None = None,
        dropped_durations: Sequence[float] | None = None,
    ) -> list[int]:
        """Reports the last selection's outcome; returns the clients left out of what the
        strategy learns for a non-finite loss, update or duration (each also a
        RuntimeWarning). `durations`: each entry's measured round trip in seconds, one per
        entry of `selected`, which system-aware strategies (Oort) learn from. `dropped`:
        entries of the selection whose update the server did not wait for, with
        `dropped_durations` each one's lower bound in seconds (the round's close)."""
    @property
    def rejected(self) -> int:
        """How many reported entries `observe` has left out so far."""
    def state(self) -> Any:
        """Everything learned, as JSON-able data."""
    def load_state(self, state: Any) -> None:
        """Restores what `state()` returned."""
