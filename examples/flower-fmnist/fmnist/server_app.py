"""The ServerApp: FedAvg with fedsel choosing the nodes, and a test-set evaluation.

The run config's `strategy` names the fedsel strategy. At the end the app prints the
accuracy per round, the nodes chosen and the ledger of messages the strategy sent, and
writes them, with the test loss per round, as JSON to the run config's `results` path when one is given; that file is also
written after every round, with `done` the last round finished.
"""

import json
import os
import time

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fedsel.flower import FedselStrategy
from fmnist import task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    c = context.run_config
    rounds = int(c["num-server-rounds"])
    root = str(task.data_dir(str(c["data-dir"])))
    tx, ty = task.split(root, "t10k")
    if int(c["test-examples"]) > 0:
        tx, ty = tx[: int(c["test-examples"])], ty[: int(c["test-examples"])]

    accs: dict[int, float] = {}
    losses: dict[int, float] = {}

    def write(out: dict) -> None:
        """Replaces the results file at once, so a reader never sees half of it."""
        if str(c["results"]):
            tmp = f"{c['results']}.tmp"
            with open(tmp, "w") as f:
                json.dump(out, f, indent=1)
            os.replace(tmp, str(c["results"]))

    def test(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        losses[server_round], accs[server_round] = task.loss_acc({k: v.numpy() for k, v in arrays.items()}, tx, ty)
        # The results so far, after every round: a run that dies keeps its finished rounds.
        write({"strategy": strategy.strategy, "rounds": rounds, "done": server_round, "test_acc": accs, "test_loss": losses, "ledger": dict(strategy.ledger), "history": strategy.history, "node_keys": strategy.node_keys})
        if int(c["stop-after"]) and server_round == int(c["stop-after"]):
            # For the restart tests: the ServerApp dies here, after the round's checkpoint.
            raise RuntimeError(f"stop-after={server_round}: the ServerApp stops")
        return MetricRecord({"test_loss": losses[server_round], "test_acc": accs[server_round]})

    strategy = FedselStrategy(
        str(c["strategy"]),
        per_round=int(c["per-round"]),
        num_rounds=rounds,
        seed=int(c["seed"]),
        options=json.loads(str(c["options"])) if str(c["options"]) else None,
        min_available_nodes=int(c["per-round"]),
        checkpoint_dir=str(c["checkpoint-dir"]) or None,
        checkpoint_every=int(c["checkpoint-every"]),
        # Node ids change from one Flower run to the next; partitions do not.
        node_key="partition-id",
    )
    t0 = time.time()
    result = strategy.start(
        grid=grid,
        initial_arrays=task.to_record(task.init_arrays()),
        num_rounds=rounds,
        evaluate_fn=test,
    )
    wall = time.time() - t0
    acc = {int(r): float(m["test_acc"]) for r, m in result.evaluate_metrics_serverapp.items()}
    out = {
        "strategy": strategy.strategy,
        "rounds": rounds,
        "done": rounds,
        "wall_s": wall,
        "test_acc": acc,
        "test_loss": losses,
        "ledger": dict(strategy.ledger),
        "history": strategy.history,
        "node_keys": strategy.node_keys,
        "final_arrays": {k: v.numpy().tolist() for k, v in result.arrays.items()} if str(c["checkpoint-dir"]) else None,
    }
    print(f"fedsel {strategy.strategy}: {rounds} rounds in {wall:.1f}s, final test acc {acc.get(rounds)}, ledger {dict(strategy.ledger)}")
    write(out)
