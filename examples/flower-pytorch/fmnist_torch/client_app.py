"""The ClientApp: node `partition-id` trains and evaluates the CNN on its fedsel partition.

The federation's nodes share Fashion-MNIST out between them: `num-partitions` (the
federation's size, from the node config) partitions, this node's being `partition-id`.
Train messages answer with the local state dict, `train_loss` and `num-examples` (the
node's training examples). Evaluate messages answer with the held-out `eval_loss` and
`eval_acc`, and, as their `num-examples`, the node's training-set size: the fedsel strategy
reads the node's size from there.
"""

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fmnist_torch import task

app = ClientApp()

# The train requests a fedsel strategy sends: the round's own, probes, local updates.
REQUESTS = ["", "probe_train", "update_train"]


def _local(context: Context) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    c = context.run_config
    root = str(task.data_dir(str(c["data-dir"])))
    nodes = int(context.node_config["num-partitions"])
    return task.node_data(root, nodes, int(c["shards-per-client"]), int(c["seed"]), int(context.node_config["partition-id"]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    x, y, _, _ = _local(context)
    c = context.run_config
    config = msg.content["config"]
    # Each (round, node, request kind) draws its own batches, reproducibly; a probe
    # training is not the round's own.
    kind = REQUESTS.index(str(config.get("fedsel", "")))
    rng = np.random.default_rng([int(c["seed"]), int(config.get("server-round", 0)), int(context.node_config["partition-id"]), kind])
    net = task.model(msg.content["arrays"].to_torch_state_dict())
    loss = task.train(net, x, y, int(c["local-steps"]), int(c["batch-size"]), float(c["lr"]), rng)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    return Message(content=RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    _, y, hx, hy = _local(context)
    loss, acc = task.loss_acc(task.model(msg.content["arrays"].to_torch_state_dict()), hx, hy)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(y)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
