"""deploy/affinity: nginx.conf run as a process, read back as a policy, and compared with Envoy's.

The routing policy both proxies must express, in one vocabulary (Envoy's words):
  header       the request header hashed (the layout key the clients send)
  consistent   the hash is a ring (a replica that leaves moves only its own keys)
  no_header    what a call without the header gets ("spread": a random replica)
  retry_on     conditions on which a call goes to the next replica of the ring
  tries        attempts in all, the first included
  next_host    a retry picks another replica than the ones tried
nginx cannot see a gRPC status (it is an HTTP 200 with a grpc-status), so Envoy's `unavailable`
is left out of the comparison and required of Envoy alone: behind nginx the clients retry it.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import time

SRC = os.environ.get("PRAXIS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
AFFINITY = os.path.join(SRC, "deploy", "affinity")
NGINX_TEMPLATE = os.path.join(AFFINITY, "nginx.conf")
ENVOY_CONFIG = os.path.join(AFFINITY, "envoy-config.yaml")
MARKERS = ("@LISTEN@", "@UPSTREAM_SERVERS@")
# nginx's grpc_next_upstream conditions in Envoy's retry_on words. `error` is a failure to
# connect, or the connection reset or the stream refused before an answer; `timeout` is a connect
# (or send, or header) timeout, which Envoy counts as connect-failure.
NGINX_RETRY_WORDS = {"error": {"connect-failure", "reset", "refused-stream"},
                     "timeout": {"connect-failure"}}
CONSISTENT_LB = {"RING_HASH", "MAGLEV"}
PREVIOUS_HOSTS = "envoy.retry_host_predicates.previous_hosts"


def nginx_binary():
    """$NGINX_BIN, else nginx on PATH or in /usr/sbin (Debian's, installed by scripts/setup.sh)."""
    path = os.environ.get("NGINX_BIN") or shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"nginx not found at {path}: scripts/setup.sh installs Debian's nginx")
    return path


def render(template, listen, servers):
    """The template with its markers filled: `listen` (HOST:PORT) and one server line each."""
    for marker in MARKERS:
        assert template.count(marker) == 1, f"{marker}: expected once in {NGINX_TEMPLATE}"
    lines = "\n        ".join(f"server {s};" for s in servers)
    return template.replace("@LISTEN@", listen).replace("@UPSTREAM_SERVERS@", lines)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx from deploy/affinity/nginx.conf in front of `servers` (HOST:PORT), listening on a free
    loopback port, with `prefix` as its prefix (config, pid, temp dirs). Its access log (the
    template logs to stdout) and error log (stderr) are files in `prefix`."""

    def __init__(self, servers, prefix, timeout=20):
        with open(NGINX_TEMPLATE) as f:
            template = f.read()
        os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
        self.access_path = os.path.join(prefix, "access.log")
        self.error_path = os.path.join(prefix, "error.log")
        # The port is free when picked but may be taken before nginx binds it: try again then.
        for _ in range(3):
            port = free_port()
            self.address = f"127.0.0.1:{port}"
            with open(os.path.join(prefix, "nginx.conf"), "w") as f:
                f.write(render(template, self.address, servers))
            with open(self.access_path, "w") as out, open(self.error_path, "w") as err:
                self.proc = subprocess.Popen(
                    [nginx_binary(), "-p", prefix, "-c", "nginx.conf", "-e", "stderr"],
                    stdout=out, stderr=err)
            if self._wait_listening(port, os.path.join(prefix, "nginx.pid"), timeout):
                return
            if "Address already in use" not in self.error_log():
                break
        raise RuntimeError(
            f"nginx did not start (exit {self.proc.returncode}):\n{self.error_log()}")

    def _wait_listening(self, port, pid_path, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            # nginx writes its pid file after binding its listeners.
            if os.path.exists(pid_path):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return True
                except OSError:
                    pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"nginx did not listen on {port} within {timeout} s:\n{self.error_log()}")

    def error_log(self):
        with open(self.error_path) as f:
            return f.read()

    def access_log(self):
        """One dict per call: layout, uri, status, grpc (the gRPC status, None if none seen),
        upstreams (the replicas tried, in order)."""
        calls = []
        with open(self.access_path) as f:
            for line in f:
                m = re.search(r'layout="([^"]*)" uri=(\S+) status=(\d+) grpc_header=(\S+) '
                              r'grpc_trailer=(\S+) upstream="([^"]*)"', line)
                assert m, f"access log line in no known format: {line!r}"
                layout, uri, status, header, trailer, upstreams = m.groups()
                grpc = next((int(v) for v in (header, trailer) if v != "-"), None)
                calls.append(dict(layout=layout, uri=uri, status=int(status), grpc=grpc,
                                  upstreams=[u.strip() for u in re.split(r"[,:]\s", upstreams)
                                             if u.strip() and u.strip() != "-"]))
        return calls

    def stop(self):
        """Fast shutdown (SIGTERM); killed if it takes over 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def parse_nginx(text):
    """An nginx config as a tree: [(directive, [args], children or None)]. Comments dropped,
    quotes kept off; enough for the files in deploy/, not a full nginx parser."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[{};]|[^\s{};]+',
                        re.sub(r"(?m)#.*$", "", text))
    tokens = [t[1:-1] if t[:1] in "\"'" else t for t in tokens]
    pos = 0

    def block():
        nonlocal pos
        out, words = [], []
        while pos < len(tokens):
            t = tokens[pos]
            pos += 1
            if t == ";":
                out.append((words[0], words[1:], None))
                words = []
            elif t == "{":
                out.append((words[0], words[1:], block()))
                words = []
            elif t == "}":
                return out
            else:
                words.append(t)
        return out

    return block()


def find(tree, name):
    return [d for d in tree if d[0] == name]


def nginx_policy(text):
    """The policy of an nginx config (a rendered or unrendered template), in the module's words."""
    http = find(parse_nginx(text), "http")[0][2]
    locations = [d for s in find(http, "server") for d in find(s[2], "location")]
    location = next(l for l in locations if find(l[2], "grpc_pass"))
    upstream_name = find(location[2], "grpc_pass")[0][1][0].split("://", 1)[1]
    upstream = next(u for u in find(http, "upstream") if u[1] == [upstream_name])
    hashes = find(upstream[2], "hash")
    key, *flags = hashes[0][1] if hashes else ("", )
    no_header = "all on one replica"  # the empty string hashed
    maps = {m[1][1]: (m[1][0], m[2]) for m in find(http, "map")}
    if key in maps:  # a map from a header: its default must be the header, "" its fallback
        source, entries = maps[key]
        values = {e[0]: e[1][0] for e in entries}
        if values.get("default") == source:
            key = source
            if values.get("") == "$request_id":
                no_header = "spread"
    header = key[len("$http_"):].replace("_", "-") if key.startswith("$http_") else None
    conditions = find(location[2], "grpc_next_upstream")
    conditions = conditions[0][1] if conditions else ["error", "timeout"]  # nginx's default
    retry_on = set().union(*(NGINX_RETRY_WORDS.get(c, {f"nginx:{c}"}) for c in conditions
                             if c != "non_idempotent"))
    tries = find(location[2], "grpc_next_upstream_tries")
    return dict(header=header, consistent="consistent" in flags, no_header=no_header,
                retry_on=retry_on, tries=int(tries[0][1][0]) if tries else 0,
                next_host=True,  # nginx never retries on a replica it has tried for that call
                retries_posts="non_idempotent" in conditions)


def envoy_policy(config):
    """The policy of the Envoy bootstrap (parsed YAML) in deploy/affinity, in the same words."""
    resources = config["static_resources"]
    route = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    cluster = next(c for c in resources["clusters"] if c["name"] == route["cluster"])
    headers = [h["header"]["header_name"] for h in route.get("hash_policy", []) if "header" in h]
    # Envoy hashes the policies it can evaluate; with only a header policy and no header, there
    # is no hash and the ring picks a random host.
    only_headers = all("header" in h for h in route.get("hash_policy", []))
    retry = route.get("retry_policy", {})
    retry_on = {w.strip() for w in retry.get("retry_on", "").split(",") if w.strip()}
    predicates = [p["name"] for p in retry.get("retry_host_predicate", [])]
    return dict(header=headers[0] if len(headers) == 1 else None,
                consistent=cluster.get("lb_policy") in CONSISTENT_LB,
                no_header="spread" if only_headers else "pinned",
                retry_on=retry_on - {"unavailable"},
                tries=(retry.get("num_retries", 1) + 1) if retry else 1,
                next_host=PREVIOUS_HOSTS in predicates
                and retry.get("host_selection_retry_max_attempts", 1) > 1,
                retries_posts=True,  # Envoy retries regardless of the method
                retries_unavailable="unavailable" in retry_on)


def policy_problems(nginx_text, envoy_config, layout_header):
    """Where either config departs from the affinity policy or from the other ([] if none)."""
    n, e = nginx_policy(nginx_text), envoy_policy(envoy_config)
    problems = []
    for name, p in (("nginx", n), ("envoy", e)):
        if p["header"] != layout_header:
            problems.append(
                f"{name}: hashes on {p['header']!r}, the clients send {layout_header!r}")
        if not p["consistent"]:
            problems.append(f"{name}: the hash is not consistent (a ring): a replica leaving "
                            "would move every layout")
        if p["no_header"] != "spread":
            problems.append(f"{name}: calls without the header go {p['no_header']}, not spread")
        if not p["next_host"]:
            problems.append(f"{name}: a retry may go back to the replica that failed it")
        if not p["retries_posts"]:
            problems.append(f"{name}: gRPC calls are POSTs and are not retried (non_idempotent)")
        if p["tries"] < 2:
            problems.append(f"{name}: {p['tries']} tries: a refused call is not retried")
    if n["retry_on"] != e["retry_on"]:
        problems.append(f"retry conditions differ: nginx {sorted(n['retry_on'])}, "
                        f"envoy {sorted(e['retry_on'])} (besides unavailable)")
    if n["tries"] != e["tries"]:
        problems.append(f"tries differ: nginx {n['tries']}, envoy {e['tries']}")
    if not e["retries_unavailable"]:
        problems.append("envoy: retry_on lacks unavailable (a draining replica's refusal)")
    return problems
