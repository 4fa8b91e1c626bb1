"""The ClientApp: node `partition-id` trains and evaluates on its fedsel partition.

Train messages answer with the local model, `train_loss` and `num-examples` (the node's
training examples). Evaluate messages answer with the held-out `eval_loss` and
`eval_acc`, and, as their `num-examples`, the node's training-set size: the fedsel
strategy reads the node's size from there. The run config's `faulty-node` makes one node
send the `fault`'s replies instead, to test that the server drops them; its `slow-nodes`
make those nodes sleep `slow-delay` seconds in every training, to test that the server
measures round trips.
"""

import time

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fmnist import task

app = ClientApp()

# The train requests a fedsel strategy sends: the round's own, probes, local updates.
REQUESTS = ["", "probe_train", "update_train"]


def _local(context: Context) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    c = context.run_config
    clients = int(c["clients"])
    if int(context.node_config["num-partitions"]) != clients:
        raise ValueError(f"{context.node_config['num-partitions']} nodes for {clients} partitions: set num-supernodes to `clients`")
    root = str(task.data_dir(str(c["data-dir"])))
    return task.node_data(root, clients, int(c["shards-per-client"]), int(c["seed"]), int(context.node_config["partition-id"]))


def _arrays(msg: Message) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in msg.content["arrays"].items()}


def _fault(context: Context) -> str:
    """The fault this node plays (run config `faulty-node` and `fault`), "" for none."""
    c = context.run_config
    return str(c["fault"]) if int(c["faulty-node"]) == int(context.node_config["partition-id"]) else ""


def _slow(context: Context) -> bool:
    """Whether this node's partition is one of the run config's `slow-nodes`."""
    slow = [p.strip() for p in str(context.run_config["slow-nodes"]).split(",")]
    return str(context.node_config["partition-id"]) in slow


@app.train()
def train(msg: Message, context: Context) -> Message:
    x, y, _, _ = _local(context)
    c = context.run_config
    if _slow(context):
        time.sleep(float(c["slow-delay"]))
    config = msg.content["config"]
    # Each (round, node, request kind) draws its own batches, reproducibly; a probe
    # training is not the round's own.
    kind = REQUESTS.index(str(config.get("fedsel", "")))
    rng = np.random.default_rng([int(c["seed"]), int(config.get("server-round", 0)), int(context.node_config["partition-id"]), kind])
    local, loss = task.train(_arrays(msg), x, y, int(c["local-steps"]), int(c["batch-size"]), float(c["lr"]), rng)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    fault = _fault(context)
    if fault == "nan":
        local = {k: np.full_like(v, np.nan) for k, v in local.items()}
        metrics["train_loss"] = float("nan")
    if fault == "malformed":
        local["weight"] = np.ascontiguousarray(local["weight"].T)
        return Message(content=RecordDict({"arrays": task.to_record(local)}), reply_to=msg)
    return Message(content=RecordDict({"arrays": task.to_record(local), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    x, y, hx, hy = _local(context)
    loss, acc = task.loss_acc(_arrays(msg), hx, hy)
    # `partition-id` names the node across Flower runs (the strategy's `node_key`).
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(y), "partition-id": int(context.node_config["partition-id"])})
    fault = _fault(context)
    if fault == "nan":
        metrics["eval_loss"] = float("nan")
    if fault == "malformed":
        del metrics["eval_loss"]
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
