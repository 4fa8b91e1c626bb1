"""fedsel selectors choosing the nodes of a Flower federation (Flower's message API).

:class:`FedselStrategy` is Flower's ``FedAvg`` with its node sampling replaced by a fedsel
:class:`~fedsel.Selector` and its aggregation by the strategy's own rule. Everything the
selector learns comes through real Flower messages, so a simulation and a deployment see
the same thing:

* the federation is the nodes connected at the first round, once ``min_available_nodes``
  are (set it to the federation's size in a deployment), that answer one evaluate message
  sent to every node then: each node's size is the ``num-examples`` of its reply;
* availability in a round is the set of the federation's nodes connected then
  (``grid.get_node_ids()``); a node that dies without leaving stays connected for Flower
  until it misses its heartbeats (up to a minute with flwr 1.41), and a message sent to it
  meanwhile is answered with an error once the SuperLink gives up on it;
* a round goes on with the replies it got: a train reply that is missing or an error is
  booked under ``failed_replies`` and left out of the aggregate, and the round's record in
  :attr:`FedselStrategy.history` names the nodes that failed;
* a reply is checked before anything reads it, since one faulty or hostile node must not
  bring the server down nor poison the model or the selector: arrays under the strategy's
  key with the global model's names and shapes, a float dtype where the model's is one,
  every value finite (and every update the selector reads within float32's range); a
  metric record; the metrics read (``num-examples`` a whole number >= 1, ``eval_loss``,
  ``train_loss`` and the other metrics of a train reply) finite numbers. A reply that
  fails is dropped as a failed one would be, booked under ``rejected_replies``, logged as
  a warning and named, with what was wrong, in the round's ``rejected`` record;
* held-out losses (Pow-d, FedCor, AFL) are evaluate messages to the nodes the selector
  names, answered with an ``eval_loss`` metric;
* a node that does not answer one of the selector's requests (it died, or timed out) is
  unavailable for that round: the selection is made again, from the selector's state
  before the round, among the nodes left, so that the selector learns nothing from a
  request that was not answered in full; the round's record names these nodes;
* probe trainings (FedCor) and local updates (FedGS_cos) are train messages whose models
  are not aggregated into the global one;
* updates (HiCS-FL, Clustered Sampling) are read from the round's train replies, whole or
  the output layer only (its bias, then its weight; :func:`output_layer` says which
  arrays those are);
* aggregation is the strategy's: the plain mean, data-size weights (FedGS, DivFL) or the
  selector's own weights (F3AST's p_k / r_k, not renormalised); an aggregate with a
  non-finite value (finite replies can still overflow the model's dtype) is not taken: the
  model stays as it was for that round;
* each train reply's round trip is handed to the selector (Oort's system utility reads it)
  and recorded in the round's ``durations``: :meth:`FedselStrategy.round_trip` says what
  it measures.

Requests that need something Flower's messages do not carry (mini-batch losses, client
gradients, secure scalar products, noise responses) are not answered: a strategy that
asks for them fails with an error naming the missing method.

Every message sent is booked in :attr:`FedselStrategy.ledger`.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from logging import INFO, WARNING
from typing import Any, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from . import FedselError, Selector
from . import _checkpoint, _fedsel

__all__ = ["FedselStrategy", "output_layer"]

T = TypeVar("T")

# Flower carries a metric as a float64 at worst, which counts whole numbers exactly up to
# here; a larger `num-examples` is no node's dataset.
_MAX_EXAMPLES = 2**53
# The selector takes updates as float32: a value beyond this would reach it as inf.
_F32_MAX = float(np.finfo(np.float32).max)


def _arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord(array_dict={k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


class _Rejected(Exception):
    """What makes a reply unusable: it breaks the protocol or carries a non-finite value."""


def _metric_record(message: Message) -> MetricRecord:
    """The reply's (first) metric record."""
    records = list(message.content.metric_records.values())
    if not records:
        raise _Rejected("no metric record")
    return records[0]


def _number(name: str, value: Any) -> float:
    """`value`, the metric `name`, as a float: it must be one finite real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Rejected(f"`{name}` is {type(value).__name__} {value!r:.60}, not a number")
    if not math.isfinite(value):
        raise _Rejected(f"`{name}` is {value}")
    return float(value)


def _finite(metrics: MetricRecord, name: str) -> float:
    """The metric `name`, which the reply must carry as one finite number."""
    if name not in metrics:
        raise _Rejected(f"no `{name}` metric (has {sorted(metrics)})")
    return _number(name, metrics[name])


def _examples(metrics: MetricRecord, name: str) -> int:
    """The node's number of examples, under `name`: a whole number, at least 1."""
    value = _finite(metrics, name)
    if value != int(value) or not 1 <= value <= _MAX_EXAMPLES:
        raise _Rejected(f"`{name}` is {metrics[name]!r}, not a whole number from 1 to 2**53")
    return int(value)


def _all_finite(metrics: MetricRecord) -> None:
    """Every metric, which Flower averages into the round's train metrics, is a finite
    number or a list of them."""
    for name, value in metrics.items():
        for v in value if isinstance(value, list) else [value]:
            _number(name, v)


def _local_model(message: Message, key: str, reference: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model a node sent back under `key`: the arrays of `reference` (the global
    model), by name and shape, of a float dtype where the reference's is one (its very
    dtype otherwise), every value finite."""
    records = message.content.array_records
    if key not in records:
        raise _Rejected(f"no array record `{key}` (has {list(records)})")
    arrays: dict[str, np.ndarray] = {}
    for name, array in records[key].items():
        try:
            value = array.numpy()
        except (TypeError, ValueError, OSError, EOFError) as e:
            raise _Rejected(f"array `{name}` cannot be read: {e}") from None
        if not isinstance(value, np.ndarray):
            raise _Rejected(f"array `{name}` is a {type(value).__name__}, not one array")
        arrays[name] = value
    missing = [k for k in reference if k not in arrays]
    unknown = [k for k in arrays if k not in reference]
    if missing or unknown:
        raise _Rejected(f"arrays {missing} missing and {unknown} unknown to the model")
    for name, ref in reference.items():
        x = arrays[name]
        if x.shape != ref.shape:
            raise _Rejected(f"array `{name}` has shape {x.shape}, not the model's {ref.shape}")
        if np.issubdtype(ref.dtype, np.floating):
            if not np.issubdtype(x.dtype, np.floating):
                raise _Rejected(f"array `{name}` has dtype {x.dtype}, not a float one")
            bad = x.size - int(np.count_nonzero(np.isfinite(x)))
            if bad:
                raise _Rejected(f"array `{name}` has {bad} non-finite values")
        elif x.dtype != ref.dtype:
            raise _Rejected(f"array `{name}` has dtype {x.dtype}, not the model's {ref.dtype}")
    return arrays


def _representable(update: np.ndarray) -> np.ndarray:
    """`update` (finite models can still differ by more than float32 holds), if the
    selector can take it."""
    over = update.size - int(np.count_nonzero(np.abs(update) <= _F32_MAX))
    if over:
        raise _Rejected(f"its update has {over} values beyond float32's range")
    return update


def output_layer(arrays: dict[str, np.ndarray]) -> tuple[str, str]:
    """The (bias key, weight key) of the model's output layer, which HiCS-FL and Clustered
    Sampling read and whose bias length is the number of classes.

    Named arrays (a PyTorch ``state_dict``, as ``ArrayRecord(model.state_dict())`` keeps
    its keys, or NumPy arrays under names): the last bias ``<prefix>.bias`` (or ``bias``)
    that is 1-D and whose sibling ``<prefix>.weight`` (or ``weight``) is 2-D with one row
    per bias entry, i.e. the last fully connected layer in the record's order, which for a
    ``state_dict`` is the order the modules were registered in. Norm layers (1-D weights),
    convolutions (4-D weights), running statistics and ``num_batches_tracked`` (0-d) never
    match, so a model whose head is not a linear layer, or whose last registered linear
    layer is not its head, must name it with ``output_keys``.

    Unnamed arrays (an ArrayRecord made from a list, keyed ``"0"``, ``"1"``, ...): the last
    1-D array directly after a 2-D array with one row per entry, the same layer as laid
    out by ``model.parameters()`` or a NumPy model's list.
    """
    keys = list(arrays)

    def pair(b: str, w: str) -> bool:
        return w in arrays and arrays[b].ndim == 1 and arrays[w].ndim == 2 and arrays[w].shape[0] == arrays[b].shape[0]

    if all(k.isdigit() for k in keys):
        found = [(b, keys[i - 1]) for i, b in enumerate(keys) if i > 0 and pair(b, keys[i - 1])]
    else:
        found = [(b, b[: -len("bias")] + "weight") for b in keys if (b == "bias" or b.endswith(".bias")) and pair(b, b[: -len("bias")] + "weight")]
    if not found:
        shapes = ", ".join(f"{k} {tuple(np.shape(v))}" for k, v in arrays.items())
        raise FedselError(f"no output layer (a 1-D `.bias` with a 2-D `.weight` of as many rows) among the model's arrays [{shapes}]; pass output_keys=(bias key, weight key)")
    return found[-1]


class FedselStrategy(FedAvg):
    """FedAvg whose node sampling and aggregation are a fedsel strategy's.

    ``strategy`` is any fedsel strategy name (``py:module:Class`` for a class written in
    Python) and ``options`` its config keys (as ``[selection.<strategy>]`` in a fedsel
    config; a Python class's constructor arguments); ``selector=`` takes a selector object
    written in Python instead of a name (docs/your-selector.md). ``per_round`` nodes are trained per
    round, ``num_rounds`` is the run's length (some strategies plan with it). The output
    layer, for strategies that read it, is the ArrayRecord's ``output_keys`` = (bias key,
    weight key), by default the one :func:`output_layer` finds: the last ``<prefix>.bias``
    whose ``<prefix>.weight`` is 2-D, or for unnamed arrays the last 1-D array after a 2-D
    one. ``timeout`` bounds each exchange of messages. Other keyword arguments go to
    ``FedAvg``; federated evaluation is off unless ``fraction_evaluate`` is given, since the
    selectors send their own evaluate messages.

    ``checkpoint_dir`` makes the strategy save, every ``checkpoint_every`` rounds and after
    the last, the global arrays, the selector's state, the round, the federation, the
    history and the ledger there, atomically; a strategy started (:meth:`start`) with a
    checkpoint in its ``checkpoint_dir`` goes on from the round after it, and refuses one
    made with another config, naming what differs. ``node_key`` names a metric of the
    nodes' size replies (an evaluate reply's metric record) that identifies each node
    across Flower runs, whose node ids change (a simulation draws them anew): the
    federation is then ordered by it, and a restarted strategy finds the checkpoint's nodes
    by it. Without it nodes are known by their Flower node ids, in id order.
    """

    def __init__(
        self,
        strategy: str | None = None,
        *,
        selector: Any = None,
        per_round: int,
        num_rounds: int,
        seed: int = 0,
        options: dict[str, Any] | None = None,
        output_keys: tuple[str, str] | None = None,
        timeout: float | None = 600.0,
        on_round: Callable[[dict[str, Any]], Any] | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 1,
        node_key: str | None = None,
        **fedavg: Any,
    ) -> None:
        fedavg.setdefault("fraction_evaluate", 0.0)
        super().__init__(**fedavg)
        if (strategy is None) == (selector is None):
            raise FedselError("give a strategy's name or a selector object (selector=...), one of them")
        #: A selector written in Python (docs/your-selector.md), or None for a named strategy.
        self.selector_object = selector
        self.strategy = strategy if selector is None else _fedsel.class_path(selector)
        self.per_round = per_round
        self.num_rounds = num_rounds
        self.seed = seed
        self.options = dict(options or {})
        self.output_keys = output_keys
        self.timeout = timeout
        #: Called after each round's aggregation with the round's record (as
        #: ``fedsel.run``'s ``on_round``; see :meth:`_round_done`).
        self.on_round = on_round
        if checkpoint_every < 1:
            raise FedselError(f"checkpoint_every is {checkpoint_every}, not a number of rounds >= 1")
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.checkpoint_every = checkpoint_every
        self.node_key = node_key
        #: Every node id met (this process's and, after a restart, the checkpoint's) with
        #: its key, the size reply's ``node_key`` metric, where ``node_key`` is given.
        self.node_keys: dict[int, int | float] = {}
        self._resumed = 0
        self.selector: Selector | None = None
        self.nodes: list[int] = []
        self.index: dict[int, int] = {}
        self.sizes: list[int] = []
        #: Messages sent and replies received, by kind, over the whole run.
        self.ledger: Counter[str] = Counter()
        #: Per round: when it was configured, the available nodes, those of them that
        #: did not answer the selector's requests (left out of the choice), the selection,
        #: the nodes whose reply was rejected (with what was wrong), the selected nodes
        #: whose train reply failed, the round trip in seconds of every train reply read
        #: (``durations``, by node; see :meth:`round_trip`) and that round's ledger.
        self.history: list[dict[str, Any]] = []
        self._global: dict[str, np.ndarray] = {}
        self._entries: list[int] = []
        self._weights: list[float] | None = None
        self._round_ledger: Counter[str] = Counter()
        self._rejected: dict[int, str] = {}
        self._sent: dict[int, float] = {}

    def summary(self) -> None:
        log(INFO, "\t├── fedsel strategy: %s, %d nodes per round", self.strategy, self.per_round)
        super().summary()

    # -- messages ------------------------------------------------------------------

    def _reject(self, node: int, kind: str, reason: _Rejected) -> None:
        """Logs a rejected reply and names it in the round's record."""
        log(WARNING, "node %d: %s reply rejected: %s", node, kind, reason)
        self._rejected[node] = f"{kind} reply: {reason}"

    def _exchange(self, kind: str, arrays: dict[str, np.ndarray], nodes: list[int], grid: Grid, config: dict[str, Any], read: Callable[[Message], T]) -> dict[int, T]:
        """Sends `arrays` to `nodes` as `kind` messages and returns, by node, what `read`
        takes from each good reply; a reply it rejects is left out. Every message and reply
        is booked under `kind`."""
        content = RecordDict({self.arrayrecord_key: _record(arrays), self.configrecord_key: ConfigRecord(config)})
        message_type = MessageType.TRAIN if kind in ("train", "probe_train", "update_train") else MessageType.EVALUATE
        messages = [Message(content=content, message_type=message_type, dst_node_id=n) for n in nodes]
        replies = list(grid.send_and_receive(messages, timeout=self.timeout))
        got: dict[int, T] = {}
        rejected = 0
        for m in replies:
            if m.has_error():
                continue
            try:
                got[m.metadata.src_node_id] = read(m)
            except _Rejected as e:
                self._reject(m.metadata.src_node_id, kind, e)
                rejected += 1
        for book in (self.ledger, self._round_ledger):
            book[f"{kind}_messages"] += len(messages)
            book["model_broadcasts"] += len(messages)
            book[f"{kind}_replies"] += len(got)
            book["rejected_replies"] += rejected
            book["failed_replies"] += len(messages) - len(got) - rejected
        return got

    def _ask(self, kind: str, arrays: dict[str, np.ndarray], clients: list[int], grid: Grid, config: dict[str, Any], read: Callable[[Message], T]) -> list[T]:
        """What `read` takes from the reply of every named client, in order. A selector's
        request must be answered in full, so a node that is silent, or whose reply is
        rejected, raises :class:`_Unanswered`, naming it."""
        nodes = [self.nodes[k] for k in clients]
        got = self._exchange(kind, arrays, sorted(set(nodes)), grid, config, read)
        missing = sorted({n for n in nodes if n not in got})
        if missing:
            raise _Unanswered(kind, missing, self.strategy)
        return [got[n] for n in nodes]

    def _aggregate(self, old: dict[str, np.ndarray], entries: list[int], locals_: list[dict[str, np.ndarray]], weights: list[float] | None) -> dict[str, np.ndarray]:
        """The strategy's own rule over the entries' local models."""
        rule = self.selector.aggregation
        if rule == "selector":
            w = np.asarray(weights, dtype=np.float64)
            return {k: old[k] + sum(wi * (x[k] - old[k]) for wi, x in zip(w, locals_)).astype(old[k].dtype) for k in old}
        if rule == "data_size":
            w = np.asarray([self.sizes[k] for k in entries], dtype=np.float64)
        else:
            w = np.ones(len(entries))
        w = w / w.sum()
        return {k: sum(wi * x[k] for wi, x in zip(w, locals_)).astype(old[k].dtype) for k in old}

    def _output_layer(self, arrays: dict[str, np.ndarray]) -> tuple[str, str]:
        """The (bias key, weight key) of the output layer, by :func:`output_layer` unless
        ``output_keys`` names them."""
        if self.output_keys is None:
            return output_layer(arrays)
        b, w = self.output_keys
        missing = [k for k in (b, w) if k not in arrays]
        if missing:
            raise FedselError(f"output_keys {missing} not in the model's arrays {list(arrays)}")
        if arrays[b].ndim != 1:
            raise FedselError(f"output_keys bias `{b}` has shape {arrays[b].shape}, not one value per class")
        return b, w

    def _update(self, local: dict[str, np.ndarray], old: dict[str, np.ndarray]) -> np.ndarray:
        """The part of x_k - w the selector reads, flattened as the core lays it out."""
        if self.selector.updates == "output_layer":
            b, w = self._output_layer(old)
            return np.concatenate([(local[b] - old[b]).ravel(), (local[w] - old[w]).ravel()])
        return np.concatenate([(local[k] - old[k]).ravel() for k in old])

    # -- Flower's strategy interface -------------------------------------------------

    def _connected(self, grid: Grid) -> set[int]:
        """The federation's nodes connected now. The first round waits, as FedAvg does, for
        ``min_available_nodes``; later rounds go on with whoever is connected, waiting only
        while none is, since in a deployment nodes leave and may never come back."""
        if self.selector is None:
            return set(sample_nodes(grid, self.min_available_nodes, 0)[1])
        while not (connected := set(grid.get_node_ids()) & set(self.index)):
            log(INFO, "Waiting for a node of the federation to connect")
            time.sleep(1)
        return connected

    def _start(self, arrays: dict[str, np.ndarray], grid: Grid) -> None:
        """Meets the federation: the connected nodes that report their size (a node that
        dies before it answers is not part of it)."""
        got = self._sizes(arrays, grid)
        self.nodes = list(got)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.sizes = [got[n][0] for n in self.nodes]
        self.selector = self._new_selector(arrays)

    def _sizes(self, arrays: dict[str, np.ndarray], grid: Grid) -> dict[int, tuple[int, int | float | None]]:
        """The connected nodes that report their size: (size, key) by node id, in id order,
        or in key order where ``node_key`` names the key (a size reply without it is
        rejected, and two nodes of one key are an error)."""
        connected = sorted(self._connected(grid))

        def read(m: Message) -> tuple[int, int | float | None]:
            metrics = _metric_record(m)
            return _examples(metrics, "num-examples"), None if self.node_key is None else _finite(metrics, self.node_key)

        got = self._exchange("size", arrays, connected, grid, {"fedsel": "size"}, read)
        if not got:
            raise FedselError(f"none of the {len(connected)} connected nodes answered the size request")
        if self.node_key is None:
            return {n: got[n] for n in connected if n in got}
        by_key: dict[int | float, list[int]] = {}
        for n, (_, key) in got.items():
            by_key.setdefault(key, []).append(n)
        twice = {k: v for k, v in by_key.items() if len(v) > 1}
        if twice:
            raise FedselError(f"nodes share a `{self.node_key}`: {twice}")
        self.node_keys.update({n: key for n, (_, key) in got.items()})
        return {n: got[n] for n in sorted(got, key=lambda n: got[n][1])}

    def _new_selector(self, arrays: dict[str, np.ndarray]) -> Selector:
        options = dict(self.options)
        if self.strategy == "hics":
            options.setdefault("entropy_report", False)
        b, _ = self._output_layer(arrays)
        return Selector(
            self.strategy if self.selector_object is None else self.selector_object,
            sizes=self.sizes,
            per_round=self.per_round,
            rounds=self.num_rounds,
            seed=self.seed,
            classes=int(arrays[b].shape[0]),
            **options,
        )

    def _select(self, server_round: int, available: list[int], old: dict[str, np.ndarray], grid: Grid) -> tuple[list[int], list[int]]:
        """The selector's choice among `available` and the nodes that left the round
        unanswered. A request a node did not answer aborts the selection; the selector goes
        back to its state before the round (a new selector if it has never chosen, so that
        its initial phase runs again) and chooses again without that node. The draws are
        keyed by the round, so the choice is the one it would have made had the node been
        unavailable from the start."""
        before = self.selector.state() if self.history else None
        unanswered: list[int] = []
        while True:
            query = _FlowerQuery(self, old, grid, server_round)
            try:
                return self.selector.select(server_round - 1, available, min(self.per_round, len(available)), query), unanswered
            except _Unanswered as e:
                log(INFO, "configure_train: %s; choosing again without them", e)
                unanswered += e.nodes
                gone = {self.index[n] for n in e.nodes}
                if not gone & set(available):
                    # Only the first round's initial phase (FedGS) asks beyond the
                    # available nodes; it cannot do without a node of the federation.
                    raise FedselError(f"round {server_round}: {e}, and strategy {self.strategy} cannot choose without them") from e
                available = [k for k in available if k not in gone]
                if not available:
                    raise FedselError(f"round {server_round}: no available node answered the requests of strategy {self.strategy}") from e
                if before is None:
                    self.selector = self._new_selector(old)
                else:
                    self.selector.load_state(before)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Lets the fedsel selector choose among the connected nodes, answering its
        requests with messages, then configures their training."""
        old = _arrays(arrays)
        self._round_ledger = Counter()
        # The round's record holds this very dict, which aggregate_train adds to.
        self._rejected = {}
        if self.selector is None:
            self._start(old, grid)
        connected = self._connected(grid)
        available = [self.index[n] for n in sorted(connected) if n in self.index]
        self._entries, unanswered = self._select(server_round, available, old, grid)
        self._weights = self.selector.weights
        self._global = old
        nodes = sorted({self.nodes[k] for k in self._entries})
        log(INFO, "configure_train: fedsel %s chose %d of %d available nodes", self.strategy, len(nodes), len(available))
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        for book in (self.ledger, self._round_ledger):
            book["train_messages"] += len(nodes)
            book["model_broadcasts"] += len(nodes)
        self.history.append({
            "round": server_round,
            "time": time.time(),
            "available": [self.nodes[k] for k in available],
            "unanswered": unanswered,
            "selected": [self.nodes[k] for k in self._entries],
            "rejected": self._rejected,
        })
        messages = list(self._construct_messages(record, nodes, MessageType.TRAIN))
        self._sent = {m.metadata.dst_node_id: m.metadata.created_at for m in messages}
        return messages

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """FedAvg's federated evaluation (off unless ``fraction_evaluate`` > 0), booked."""
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        self.ledger["federated_evaluate_messages"] += len(messages)
        self.ledger["model_broadcasts"] += len(messages)
        return messages

    def round_trip(self, reply: Message) -> float:
        """Seconds from the creation of the round's train message to `reply`'s, by their
        ``created_at`` stamps: the message's way to the node (the SuperLink's queue, the
        node's polling), the node's wait for a worker and its training, up to the moment it
        made its reply; not the reply's upload nor the server's polling for it. Flower's
        grid hands over a round's replies together (it polls every 3 s in flwr 1.42), so
        the time they reach the strategy does not tell nodes apart. In a deployment the
        two stamps come from the server's and the node's clocks, which must agree
        (Flower's message TTLs already assume so); a negative or non-finite round trip (a
        clock far behind, a forged stamp) rejects the reply, since the selector would
        learn a speed the node does not have."""
        node = reply.metadata.src_node_id
        if node not in self._sent:
            raise _Rejected("no train message was sent to it this round")
        seconds = _number("created_at", reply.metadata.created_at) - self._sent[node]
        if not seconds >= 0:
            raise _Rejected(f"its round trip is {seconds} s (created_at {reply.metadata.created_at!r}, sent at {self._sent[node]!r})")
        return seconds

    def _read_train(self, message: Message) -> tuple[dict[str, np.ndarray], float, np.ndarray | None, float]:
        """A train reply's local model, its train loss (0 where it reports none), the
        update the selector reads (None where it reads none) and its round trip."""
        seconds = self.round_trip(message)
        local = _local_model(message, self.arrayrecord_key, self._global)
        metrics = _metric_record(message)
        _examples(metrics, self.weighted_by_key)
        _all_finite(metrics)
        loss = _finite(metrics, "train_loss") if "train_loss" in metrics else 0.0
        if self.selector.updates == "none":
            return local, loss, None, seconds
        with np.errstate(over="ignore"):
            return local, loss, _representable(self._update(local, self._global)), seconds

    def _train_metrics(self, replies: list[Message]) -> MetricRecord | None:
        """The average of the replies' train metrics (``train_metrics_aggr_fn``), or none
        where their metric records disagree (more than one in a reply, other names, lists of
        other lengths), which Flower's average cannot take: each reply was checked alone,
        and no one node is to blame for a mismatch, so the model still takes every reply."""
        records = [list(m.content.metric_records.values()) for m in replies]
        layouts = [{k: len(v) if isinstance(v, list) else None for k, v in r[0].items()} for r in records]
        if any(len(r) != 1 for r in records) or any(layout != layouts[0] for layout in layouts):
            log(WARNING, "aggregate_train: train metrics not aggregated: the replies' metric records differ (%s)", layouts)
            return None
        return self.train_metrics_aggr_fn([m.content for m in replies], self.weighted_by_key)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregates the replies that pass the checks by the strategy's rule, reports
        the round to the selector and saves a checkpoint when one is due."""
        arrays, metrics = self._aggregate_train(server_round, replies)
        self._checkpoint(server_round, self._global if arrays is None else _arrays(arrays))
        return arrays, metrics

    def _aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregates the replies that pass the checks by the strategy's rule and reports
        the round to the selector."""
        replies = list(replies)
        valid = [m for m in replies if not m.has_error()]
        log(INFO, "aggregate_train: Received %s results and %s failures", len(valid), len(replies) - len(valid))
        for m in replies:
            if m.has_error():
                log(INFO, "\t> Received error in reply from node %d: %s", m.metadata.src_node_id, m.error.reason)
        selected = {self.nodes[k] for k in self._entries}
        read: dict[int, tuple[dict[str, np.ndarray], float, np.ndarray | None, float]] = {}
        for m in valid:
            try:
                read[m.metadata.src_node_id] = self._read_train(m)
            except _Rejected as e:
                self._reject(m.metadata.src_node_id, "train", e)
        replied = {m.metadata.src_node_id for m in valid}
        for book in (self.ledger, self._round_ledger):
            book["train_replies"] += len(read)
            book["rejected_replies"] += len(replied) - len(read)
            book["failed_replies"] += len(selected - replied)
        self.history[-1]["ledger"] = dict(self._round_ledger)
        self.history[-1]["failed"] = sorted(selected - replied)
        self.history[-1]["durations"] = {n: r[3] for n, r in sorted(read.items())}
        kept = [i for i, k in enumerate(self._entries) if self.nodes[k] in read]
        if not kept:
            return self._round_done(server_round, None, None)
        entries = [self._entries[i] for i in kept]
        locals_, losses, updates, durations = zip(*(read[self.nodes[k]] for k in entries))
        metrics = self._train_metrics([m for m in valid if m.metadata.src_node_id in read])
        weights = None if self._weights is None else [self._weights[i] for i in kept]
        with np.errstate(over="ignore", invalid="ignore"):
            new = self._aggregate(self._global, entries, list(locals_), weights)
        bad = {k: int(v.size - np.count_nonzero(np.isfinite(v))) for k, v in new.items() if np.issubdtype(v.dtype, np.floating)}
        if any(bad.values()):
            reason = ", ".join(f"`{k}` {n}" for k, n in bad.items() if n)
            log(WARNING, "round %d: the aggregate has non-finite values (%s); the model stays as it was", server_round, reason)
            for book in (self.ledger, self._round_ledger):
                book["rejected_aggregates"] += 1
            self.history[-1]["ledger"] = dict(self._round_ledger)
            self.history[-1]["aggregate_rejected"] = reason
            return self._round_done(server_round, None, metrics)
        self.selector.observe(entries, updates=None if updates[0] is None else [u.tolist() for u in updates], train_losses=list(losses), durations=list(durations))
        return self._round_done(server_round, _record(new), metrics)

    def _round_done(self, server_round: int, arrays: ArrayRecord | None, metrics: MetricRecord | None) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Calls ``on_round`` with the round's record: ``round``, ``n_available``,
        ``n_selected`` (entries, duplicates counted), ``n_failed``, the aggregated train
        metrics the nodes sent and the round's ledger counts."""
        if self.on_round is not None:
            h = self.history[-1]
            record: dict[str, Any] = {
                "round": server_round,
                "n_available": len(h["available"]),
                "n_selected": len(h["selected"]),
                "n_failed": len(h.get("failed", [])),
            }
            record.update({k: v for k, v in (metrics or {}).items() if k not in record})
            record.update({k: v for k, v in h.get("ledger", {}).items() if k not in record})
            self.on_round(record)
        return arrays, metrics


    # -- checkpoints -----------------------------------------------------------------

    def _checkpoint_meta(self, server_round: int) -> dict[str, Any]:
        return {
            "round": server_round,
            "nodes": self.nodes,
            "node_keys": [self.node_keys.get(n) for n in self.nodes] if self.node_key is not None else None,
            "sizes": self.sizes,
            "selector": self.selector.state(),
            "history": self.history,
            "ledger": dict(self.ledger),
        }

    def _checkpoint(self, server_round: int, arrays: dict[str, np.ndarray]) -> None:
        """Saves the checkpoint after `server_round` when one is due: every
        ``checkpoint_every`` rounds and after the last."""
        if self.checkpoint_dir is None or (server_round % self.checkpoint_every and server_round != self.num_rounds):
            return
        meta = {"config": _checkpoint.config(self, arrays), **self._checkpoint_meta(server_round)}
        path = _checkpoint.save(self.checkpoint_dir, meta, arrays)
        log(INFO, "checkpoint: round %d saved to %s", server_round, path)

    def _resume(self, initial: dict[str, np.ndarray], grid: Grid) -> tuple[int, dict[str, np.ndarray]]:
        """The last round of the checkpoint in ``checkpoint_dir`` and its arrays, with the
        federation, the selector, the history and the ledger restored from it; (0,
        `initial`) where there is none. The checkpoint's nodes are found among the
        connected ones by their key (``node_key``) or else kept by id; a node of the
        checkpoint not found is unavailable until the run ends."""
        loaded = None if self.checkpoint_dir is None else _checkpoint.load(self.checkpoint_dir)
        if loaded is None:
            return 0, initial
        meta, arrays = loaded
        path = self.checkpoint_dir / _checkpoint.FILE
        _checkpoint.check(path, meta["config"], _checkpoint.config(self, initial))
        nodes = [int(n) for n in meta["nodes"]]
        if self.node_key is not None:
            keys = meta["node_keys"]
            self.node_keys.update({int(n): k for n, k in zip(nodes, keys)})
            now = {key: n for n, (_, key) in self._sizes(arrays, grid).items()}
            unknown = sorted(set(now) - set(keys))
            if unknown:
                log(WARNING, "checkpoint: nodes of `%s` %s are not of the checkpoint's federation; they are left out", self.node_key, unknown)
            # A node of the checkpoint not connected now gets an id no node has.
            missing = [k for k in keys if k not in now]
            if missing:
                log(WARNING, "checkpoint: the nodes of `%s` %s did not answer; they stay unavailable", self.node_key, missing)
            nodes = [now.get(k, -1 - i) for i, k in enumerate(keys)]
        self.nodes = nodes
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.sizes = [int(x) for x in meta["sizes"]]
        self.history = meta["history"]
        # The ledger goes on from the checkpoint's, with the size messages sent just now.
        self.ledger = Counter(meta["ledger"]) + self.ledger
        self.selector = self._new_selector(arrays)
        self.selector.load_state(meta["selector"])
        log(INFO, "checkpoint: going on after round %d of %d from %s", meta["round"], self.num_rounds, path)
        return int(meta["round"]), arrays

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600, train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Flower's ``Strategy.start``, which goes on after the checkpoint in
        ``checkpoint_dir`` where there is one: from its arrays, for the rounds after its
        round up to `num_rounds`, numbered as in an uninterrupted run (Flower's log counts
        them from 1), with `evaluate_fn` called first on the checkpoint's round."""
        done, arrays = self._resume(_arrays(initial_arrays), grid)
        if done == 0:
            return super().start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)
        if num_rounds != self.num_rounds:
            raise FedselError(f"start(num_rounds={num_rounds}) but the strategy's num_rounds is {self.num_rounds}")
        # Flower's loop numbers rounds from 1: the methods it calls see them shifted.
        for name in ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate"):
            method = getattr(type(self), name)
            setattr(self, name, lambda r, *a, _m=method: _m(self, r + done, *a))
        shifted = None if evaluate_fn is None else (lambda r, a: evaluate_fn(r + done, a))
        try:
            result = super().start(grid, _record(arrays), num_rounds - done, timeout, train_config, evaluate_config, shifted)
        finally:
            for name in ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate"):
                delattr(self, name)
        for book in (result.train_metrics_clientapp, result.evaluate_metrics_clientapp, result.evaluate_metrics_serverapp):
            moved = {r + done: m for r, m in book.items()}
            book.clear()
            book.update(moved)
        if not len(result.arrays):
            result.arrays = _record(arrays)
        return result


class _Unanswered(FedselError):
    """Nodes that did not answer a selector's request: unavailable for the round."""

    def __init__(self, kind: str, nodes: list[int], strategy: str):
        super().__init__(f"{kind}: nodes {nodes} gave no usable reply (strategy {strategy})")
        self.nodes = nodes


class _FlowerQuery:
    """Answers a selector's requests with Flower messages to the nodes it names."""

    def __init__(self, strategy: FedselStrategy, arrays: dict[str, np.ndarray], grid: Grid, server_round: int):
        self.s = strategy
        self.arrays = arrays
        self.grid = grid
        self.config = {"server-round": server_round}

    def _ask(self, kind: str, arrays: dict[str, np.ndarray], clients: list[int], read: Callable[[Message], T]) -> list[T]:
        return self.s._ask(kind, arrays, list(clients), self.grid, {**self.config, "fedsel": kind}, read)

    def _losses(self, kind: str, arrays: dict[str, np.ndarray], clients: list[int]) -> list[float]:
        return self._ask(kind, arrays, clients, lambda m: _finite(_metric_record(m), "eval_loss"))

    def _local_model(self, message: Message) -> dict[str, np.ndarray]:
        return _local_model(message, self.s.arrayrecord_key, self.arrays)

    def _update(self, message: Message) -> np.ndarray:
        local = self._local_model(message)
        with np.errstate(over="ignore"):
            return _representable(np.concatenate([(local[k] - self.arrays[k]).ravel() for k in self.arrays]))

    def losses(self, clients: list[int]) -> list[float]:
        return self._losses("loss", self.arrays, clients)

    def probe(self, clients: list[int], evaluate: list[int]) -> list[float]:
        locals_ = self._ask("probe_train", self.arrays, clients, self._local_model)
        # A probe model is aggregated by the run's rule; F3AST's weights belong to its own
        # selection, so a probe uses the plain mean (FedCor's rule, the only prober).
        weights = [1.0 / len(clients)] * len(clients) if self.s.selector.aggregation == "selector" else None
        probe = self.s._aggregate(self.arrays, list(clients), locals_, weights)
        return self._losses("probe_loss", probe, evaluate)

    def updates(self, clients: list[int]) -> list[list[float]]:
        return [u.tolist() for u in self._ask("update_train", self.arrays, clients, self._update)]
