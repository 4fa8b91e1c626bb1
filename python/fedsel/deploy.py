"""A Flower deployment on this machine: one SuperLink and N SuperNodes as separate
processes on loopback, and runs of a Flower app on them.

    python -m fedsel.deploy examples/flower-fmnist --nodes 10 \\
        --run-config 'strategy="f3ast" num-server-rounds=5 clients=10' --results f3ast.json

What it sets up, in a fresh working directory:

* TLS: a certificate authority made for this deployment signs the SuperLink's certificate
  (for ``localhost`` and ``127.0.0.1``); the SuperLink serves its Fleet, Control and Runtime
  APIs with it, and the SuperNodes and the ``flwr`` CLI trust only that CA. (A SuperNode's
  own Runtime API, where its SuperExec and ClientApps connect, stays plain HTTP on loopback,
  flwr's default.)
* SuperNode authentication (``flower-superlink --enable-supernode-auth``): every SuperNode has
  its own EC key pair; the public keys are registered with ``flwr supernode register``
  before the nodes start, and the SuperLink refuses a node whose key it does not know.
* Node ``i`` gets ``--node-config 'partition-id=i num-partitions=N'``, so its data is fixed
  by its place in the deployment, not by the order in which it connected.
* Every process gets its own port and ``FLWR_HOME`` under the working directory, so
  deployments can run side by side; every process started, with everything it started in
  turn (each SuperNode's SuperExec and ClientApps, the SuperLink's SuperExec and ServerApp),
  is stopped when the deployment closes, however it ends.

The module drives Flower through its command-line programs only (the ``flwr`` CLI's entry
point is called in-process to register many keys at once). Linux: process trees are read
from ``/proc``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["Deployment", "free_port", "main"]

#: Registers every public key named on the command line with `flwr supernode register`,
#: in one interpreter: the flwr CLI takes seconds of CPU to start, which on a busy
#: machine is the bulk of a registration.
_REGISTER = """
import sys
from importlib.metadata import entry_points
(flwr,) = entry_points(group="console_scripts", name="flwr")
cli = flwr.load()
for key in sys.argv[2:]:
    try:
        cli(["supernode", "register", key, sys.argv[1], "--format", "json"], standalone_mode=False)
    except SystemExit:
        pass
"""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _json_objects(text: str) -> list[Any]:
    """The JSON objects in `text`, which may hold other output between them."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        out.append(obj)
        i = end
    return out


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name, in parentheses, may hold spaces: the fields after it are fixed.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants (the SuperLink starts its SuperExec in a session of
    its own, so a process group would not reach it)."""
    children, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _signal(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _die_with_parent() -> None:
    """Runs in a child before it becomes a Flower program: the kernel kills it (SIGKILL)
    when the process that started it dies, even by SIGKILL, so that nothing outlives a
    launcher or test that could not tear down. Flower's own children follow their parent
    (`--parent-pid`)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signs for localhost and 127.0.0.1: (CA
    certificate, server certificate, server key). EC P-256 keys, valid for two days."""
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    cert, key, csr, ext = folder / "server.pem", folder / "server.key", folder / "server.csr", folder / "server.ext"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
             "-subj", "/CN=fedsel deployment CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    ext.write_text("basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return ca, cert, key


def make_node_key(stem: Path) -> tuple[Path, Path]:
    """A SuperNode's key pair as flwr reads them: the private key in OpenSSH format, the
    public key as an OpenSSH line, on a NIST curve (P-384). Returns (private, public)."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    k = ec.generate_private_key(ec.SECP384R1())
    private, public = stem.with_suffix(".key"), stem.with_suffix(".pub")
    private.write_bytes(k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()))
    private.chmod(0o600)
    public.write_bytes(k.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH))
    return private, public


class Deployment:
    """A SuperLink and `nodes` SuperNodes on loopback, in `workdir` (see the module's doc).

    Use it as a context manager: entering starts the SuperLink, registers the nodes' keys
    (``auth``) and starts the nodes, returning once every node is connected; leaving stops
    every process. :meth:`run` submits a run and waits for it; :meth:`submit` and
    :meth:`wait` do the same in two steps, so that nodes can be stopped mid-run with
    :meth:`kill`. Every process logs to its own file in `workdir`.
    """

    CONNECTION = "deployment"

    def __init__(self, app: Path | str, nodes: int, workdir: Path | str, *, auth: bool = True, bin_dir: Path | str | None = None, start_timeout: float = 300.0) -> None:
        self.app = Path(app).resolve()
        self.nodes = nodes
        self.workdir = Path(workdir).resolve()
        self.auth = auth
        self.bin = Path(bin_dir) if bin_dir else Path(sys.executable).parent
        self.start_timeout = start_timeout
        self.port = 0
        self.ca = self.cert = self.key = Path()
        self.link: subprocess.Popen[bytes] | None = None
        self.supernodes: list[subprocess.Popen[bytes] | None] = []
        #: Flower's node id of node i (the one whose partition-id is i).
        self.node_ids: list[int] = []
        self._others: list[subprocess.Popen[bytes]] = []
        #: Run id -> the `flwr run --stream` process following it, and its log's name.
        self._runs: dict[int, tuple[subprocess.Popen[bytes], str]] = {}
        for name in ("flwr", "flower-superlink", "flower-supernode"):
            if shutil.which(name, path=str(self.bin)) is None:
                raise FileNotFoundError(f"{name} not found in {self.bin}")

    # -- processes -------------------------------------------------------------------

    def _env(self, home: str) -> dict[str, str]:
        """The process's environment: its own FLWR_HOME, and this interpreter's programs
        first on PATH (the SuperLink and SuperNodes start flower-superexec, flwr-serverapp
        and flwr-clientapp by name)."""
        flwr_home = self.workdir / home
        flwr_home.mkdir(parents=True, exist_ok=True)
        return {**os.environ, "FLWR_HOME": str(flwr_home), "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"}

    def _spawn(self, name: str, args: list[str], home: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")
        try:
            return subprocess.Popen(args, env=self._env(home), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, preexec_fn=_die_with_parent)
        finally:
            log.close()

    def _cli(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """The flwr CLI, configured to reach this deployment's SuperLink."""
        return subprocess.run([str(self.bin / "flwr"), *args], env=self._env("cli"), capture_output=True, text=True, timeout=timeout, cwd=self.workdir)

    def log(self, name: str) -> str:
        """The log of process `name` (`superlink`, `node-3`, `run-1`, ...)."""
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def __enter__(self) -> Deployment:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Certificates, the SuperLink, the nodes' keys and the nodes, in that order;
        returns once every node is connected."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        tls = self.workdir / "tls"
        tls.mkdir(exist_ok=True)
        self.ca, self.cert, self.key = make_tls(tls)
        self.port = free_port()
        cli_home = self.workdir / "cli"
        cli_home.mkdir(exist_ok=True)
        (cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{self.CONNECTION}"\n\n'
            f'[superlink.{self.CONNECTION}]\naddress = "127.0.0.1:{self.port}"\nroot-certificates = "{self.ca}"\n'
        )
        args = [
            str(self.bin / "flower-superlink"),
            "--ssl-certfile", str(self.cert), "--ssl-keyfile", str(self.key), "--ssl-ca-certfile", str(self.ca),
            # The app's dependencies are those of this environment (no package index needed).
            "--disable-runtime-dependency-installation",
            "--host", "127.0.0.1", "--port", str(self.port),
            # No --database: flwr's state in memory. With its SQLite file, concurrent node
            # requests failed with "database is locked" on a loaded machine, and a message
            # whose download failed that way was never answered.
        ]
        if self.auth:
            args.append("--enable-supernode-auth")
        self.link = self._spawn("superlink", args, "superlink")
        self._wait_for_port()
        keys: list[Path | None] = [None] * self.nodes
        if self.auth:
            (self.workdir / "keys").mkdir(exist_ok=True)
            pairs = [make_node_key(self.workdir / "keys" / f"node-{i}") for i in range(self.nodes)]
            self.register([pub for _, pub in pairs])
            keys = [priv for priv, _ in pairs]
        self.supernodes = [self._supernode(i, keys[i], f"node-{i}") for i in range(self.nodes)]
        self.node_ids = [self._node_id(i, self.start_timeout) for i in range(self.nodes)]

    def _wait_for_port(self) -> None:
        """Until the SuperLink accepts connections (seconds on a busy machine)."""
        deadline = time.time() + self.start_timeout
        while True:
            if self.link is None or self.link.poll() is not None:
                raise RuntimeError(f"flower-superlink exited:\n{self.log('superlink')}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.time() > deadline:
                    raise TimeoutError(f"no SuperLink on port {self.port} after {self.start_timeout}s:\n{self.log('superlink')}") from None
                time.sleep(0.5)

    def register(self, public_keys: list[Path]) -> list[int]:
        """Registers SuperNode public keys with the SuperLink; returns their node ids."""
        p = subprocess.run(
            [str(self.bin / "python"), "-c", _REGISTER, self.CONNECTION, *map(str, public_keys)],
            env=self._env("cli"), capture_output=True, text=True, timeout=self.start_timeout, cwd=self.workdir,
        )
        replies = _json_objects(p.stdout)
        if p.returncode != 0 or len(replies) != len(public_keys) or not all(r.get("success") for r in replies):
            raise RuntimeError(f"flwr supernode register failed:\n{p.stdout}\n{p.stderr}")
        return [int(r["node-id"]) for r in replies]

    def spawn_node(self, partition: int, private_key: Path | None, name: str) -> subprocess.Popen[bytes]:
        """Starts one more SuperNode, for partition `partition`, authenticated by
        `private_key` (none: unauthenticated), logging to `<name>.log`; it is stopped with
        the deployment."""
        proc = self._supernode(partition, private_key, name)
        self._others.append(proc)
        return proc

    def _supernode(self, partition: int, private_key: Path | None, name: str) -> subprocess.Popen[bytes]:
        args = [
            str(self.bin / "flower-supernode"),
            "--superlink", f"127.0.0.1:{self.port}",
            "--root-certificates", str(self.ca),
            "--node-config", f"partition-id={partition} num-partitions={self.nodes}",
            # The node's own Runtime API, where its SuperExec and ClientApps connect.
            "--host", "127.0.0.1", "--port", str(free_port()),
        ]
        if private_key is not None:
            args += ["--auth-supernode-private-key", str(private_key)]
        return self._spawn(name, args, name)

    def _node_id(self, i: int, within: float) -> int:
        """Node i's Flower id, once the SuperLink has accepted it (the node logs its id
        only after its activation succeeded)."""
        deadline = time.time() + within
        while True:
            if m := re.search(r"SuperNode ID: (\d+)", self.log(f"node-{i}")):
                return int(m.group(1))
            proc = self.supernodes[i]
            if proc is None or proc.poll() is not None:
                raise RuntimeError(f"node {i} exited:\n{self.log(f'node-{i}')}")
            if time.time() > deadline:
                raise TimeoutError(f"node {i} not connected after {within}s:\n{self.log(f'node-{i}')}")
            time.sleep(0.5)

    def kill(self, i: int) -> None:
        """Kills node i and everything it started at once (SIGKILL), as a crash would:
        the node says nothing to the SuperLink, which finds out from its missing heartbeats."""
        proc = self.supernodes[i]
        if proc is None:
            return
        _signal(_tree(proc.pid), signal.SIGKILL)
        proc.wait()
        self.supernodes[i] = None

    def close(self) -> None:
        """Stops every process this deployment started and all their descendants: SIGTERM
        first (SuperNodes then leave the SuperLink), SIGKILL for what is left after 20 s."""
        roots = [p for p in [*(s for s, _ in self._runs.values()), *self.supernodes, *self._others, self.link] if p is not None]
        pids = sorted({q for p in roots for q in _tree(p.pid)})
        _signal([p.pid for p in roots], signal.SIGTERM)
        deadline = time.time() + 20
        while time.time() < deadline and any(p.poll() is None for p in roots):
            time.sleep(0.2)
        # Descendants found now too: a ClientApp may have started since the first look.
        left = sorted({q for p in roots if p.poll() is None for q in _tree(p.pid)} | {q for q in pids if _alive(q)})
        _signal(left, signal.SIGKILL)
        for p in roots:
            p.wait()
        self.link, self.supernodes, self._others, self._runs = None, [], [], {}

    # -- runs ------------------------------------------------------------------------

    def submit(self, run_config: str = "") -> int:
        """Starts a run of the app and returns its run id once the SuperLink has accepted
        it. `flwr run --stream` follows the run, its logs in `run-<n>.log` for the n-th run
        submitted (see :meth:`run_log`); runs may overlap."""
        name = f"run-{len(self._runs) + 1}"
        args = [str(self.bin / "flwr"), "run", str(self.app), self.CONNECTION, "--stream"]
        if run_config:
            args += ["--run-config", run_config]
        stream = self._spawn(name, args, "cli")
        deadline = time.time() + self.start_timeout
        while True:
            if m := re.search(r"Successfully started run (\d+)", self.log(name)):
                self._runs[int(m.group(1))] = (stream, name)
                return int(m.group(1))
            if stream.poll() is not None or time.time() > deadline:
                stream.kill()
                stream.wait()
                raise RuntimeError(f"flwr run gave no run id:\n{self.log(name)}")
            time.sleep(0.5)

    def run_log(self, run_id: int) -> str:
        """What `flwr run --stream` printed for the run: its ServerApp's and ClientApps' logs."""
        return self.log(self._runs[run_id][1])

    def wait(self, run_id: int, timeout: float) -> str:
        """Waits up to `timeout` s for the run to end; returns its status as the SuperLink
        gives it (`finished:completed` for a run that ended well). The log stream may end
        before the run does (seen on a loaded machine), so the status is asked for until it
        says finished."""
        deadline = time.time() + timeout
        try:
            self._runs[run_id][0].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"run {run_id} still running after {timeout}s:\n{self.run_log(run_id)[-3000:]}") from None
        while not (status := self.status(run_id)).startswith("finished"):
            if time.time() > deadline:
                raise TimeoutError(f"run {run_id} still {status} after {timeout}s:\n{self.run_log(run_id)[-3000:]}")
            time.sleep(5)
        return status

    def status(self, run_id: int) -> str:
        p = self._cli("ls", "--run-id", str(run_id), self.CONNECTION, "--format", "json")
        for obj in _json_objects(p.stdout):
            for run in obj.get("runs", []):
                if int(run.get("run-id", -1)) == run_id:
                    return str(run["status"])
        raise RuntimeError(f"flwr ls gave no status for run {run_id}:\n{p.stdout}\n{p.stderr}")

    def run(self, run_config: str = "", timeout: float = 1800.0) -> str:
        """Submits a run and waits for it; returns its final status."""
        return self.wait(self.submit(run_config), timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedsel.deploy", description="Deploys a Flower app on this machine (SuperLink + SuperNodes over TLS on loopback) and runs it once.")
    parser.add_argument("app", type=Path, help="the Flower app's directory")
    parser.add_argument("--nodes", type=int, default=10, help="SuperNodes; node i gets partition-id=i num-partitions=NODES")
    parser.add_argument("--run-config", default="", help="the run config overrides, as for `flwr run --run-config`")
    parser.add_argument("--results", type=Path, help="passed to the app as its `results` run-config key (the JSON file the example's ServerApp writes)")
    parser.add_argument("--no-auth", action="store_true", help="no SuperNode authentication (TLS stays on)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the run may take")
    parser.add_argument("--workdir", type=Path, help="where certificates, keys, state and logs go (kept); default: a temporary directory, removed unless the run fails")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the deployment is torn down either way.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fedsel-deploy-"))
    run_config = args.run_config
    if args.results:
        run_config += f' results="{args.results.resolve()}"'
    ok = False
    t0 = time.time()
    try:
        with Deployment(args.app, args.nodes, workdir, auth=not args.no_auth) as d:
            print(f"SuperLink on https://127.0.0.1:{d.port} (TLS{', SuperNode auth' if d.auth else ''}), {d.nodes} SuperNodes connected after {time.time() - t0:.0f}s", flush=True)
            t1 = time.time()
            run_id = d.submit(run_config.strip())
            print(f"run {run_id} submitted; logs in {workdir}", flush=True)
            status = d.wait(run_id, args.timeout)
            print(f"run {run_id}: {status} after {time.time() - t1:.0f}s ({time.time() - t0:.0f}s in all)", flush=True)
            ok = status == "finished:completed"
    finally:
        if ok and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not ok:
            print(f"the deployment's logs are in {workdir}", file=sys.stderr)
    if ok and args.results:
        print(f"results: {args.results}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
