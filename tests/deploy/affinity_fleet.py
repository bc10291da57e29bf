"""The fleet that tests/deploy/test_affinity.py runs: three praxis-server replicas behind nginx,
one client of nginx, the per-replica counts read from their /metrics, the layouts sent, the
closed-loop load kept up during a drain, and the per-replica table printed to the test log."""
import collections
import os
import re
import sys
import threading
import time

from deploy_checks import scrape
from server_process import tiny_inputs

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
os.environ.setdefault("PRAXIS_PROTO_DIR", os.path.join(SRC, "proto"))
if os.path.join(SRC, "client", "python") not in sys.path:
    sys.path.insert(0, os.path.join(SRC, "client", "python"))
from praxis_client import PraxisError, Client, layout_key, make_request  # noqa: E402

REPLICA_FLAGS = ("--threads=1",  # three replicas share the machine's 2 cores
                 "--metrics_port=0", "--metrics_host=127.0.0.1", "--drain_seconds=10")
# (text_len, h, w, K, F). Masks are cached per tower: the encoder's key is the whole window, the
# decoder's only (K, F, h, w). Every layout here has its own (K, F, h, w), none the warm-up's
# (K=2, F=1, 4x4), so that a layout's first step on a replica builds exactly its two masks.
LAYOUTS = [(5, 3, 4, 2, 1), (4, 2, 2, 1, 1), (6, 4, 3, 1, 1), (3, 3, 3, 2, 1),
           (7, 2, 3, 1, 1), (5, 2, 4, 2, 1), (4, 3, 2, 1, 2), (6, 2, 2, 2, 1),
           # More, sent only while the ones before all hashed onto one replica.
           (3, 4, 2, 1, 1), (5, 3, 3, 1, 1), (4, 4, 4, 1, 1), (6, 3, 2, 2, 1),
           (2, 2, 3, 2, 1), (5, 2, 2, 1, 2), (7, 4, 3, 2, 1), (3, 3, 4, 1, 1)]
FIRST_LAYOUTS = 8
SPREAD_LAYOUT = (8, 3, 3, 1, 2)  # the header-less calls': masks of its own
MASKS_PER_LAYOUT = 2  # the encoder tower's mask and the decoder tower's (decode=True)
STEPS = 3  # per layout when placed alone
# Closed loops sending steps through nginx during the drain: enough that the replica has steps
# queued and arriving when SIGTERM comes, so that some are refused UNAVAILABLE while it drains.
LOAD_THREADS = 8
LOAD_BEFORE_SIGTERM_S = 1.0


def decoder_key(layout):
    text_len, h, w, k, f = layout
    return (k, f, h, w)


assert len({decoder_key(l) for l in LAYOUTS + [SPREAD_LAYOUT, (16, 4, 4, 2, 1)]}) == \
    len(LAYOUTS) + 2, "two layouts share decoder masks: mask builds would not count layouts"


def step_args(layout):
    text_len, h, w, k, f = layout
    return tiny_inputs(text_len=text_len, h=h, w=w, k=k, f=f)


# Step calls answered OK and UNAVAILABLE, Session steps answered OK, masks built (cache misses).
Counts = collections.namedtuple("Counts", "ok unavailable session masks")


def sample(text, name, **labels):
    """The sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
    total = 0.0
    for m in re.finditer(rf"^{name}(?:{{([^}}]*)}})?\s+(\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return int(total)


class Fleet:
    """The three replicas, nginx in front, and one client of nginx (the Python client: it sends
    the layout header and retries UNAVAILABLE with backoff, as a robot's loop would)."""

    def __init__(self, replicas, nginx):
        self.replicas = replicas
        self.nginx = nginx
        self.live = list(range(len(replicas)))
        # Patient enough to outlast a drain: about 10 s of backoff before giving up.
        self.client = Client(nginx.address, timeout=10, max_attempts=12)

    def name(self, i):
        return f"r{i} :{self.replicas[i].address.rsplit(':', 1)[1]}"

    def counts(self):
        """{replica: Counts} of the live replicas, from their /metrics."""
        out = {}
        for i in self.live:
            text = scrape(self.replicas[i].metrics_port)
            out[i] = Counts(sample(text, "praxis_requests_total", method="Step", code="OK"),
                            sample(text, "praxis_requests_total", method="Step",
                                   code="UNAVAILABLE"),
                            sample(text, "praxis_requests_total", method="Session", code="OK"),
                            sample(text, "praxis_mask_cache_misses_total"))
        return out

    def step(self, layout):
        """One step of `layout` through nginx; returns its layout key (checked to be the one the
        client sent as the header)."""
        kw = step_args(layout)
        sent = layout_key(make_request(**kw))
        got = self.client.step(**kw).layout_key
        assert got == sent, f"the server's layout key {got} is not the header's {sent}"
        return got

    def send_alone(self, layout, steps):
        """`steps` steps of `layout`, nothing else in flight: (key, {replica: Counts delta})."""
        before = self.counts()
        for _ in range(steps):
            key = self.step(layout)
        after = self.counts()
        return key, {i: Counts(*(a - b for a, b in zip(after[i], before[i]))) for i in after}


def landed(delta):
    """The replicas that answered any step in a {replica: Counts delta}."""
    return [i for i, d in delta.items() if d.ok]


def table(fleet, rows, title, notes=None):
    """rows: {key: {replica: Counts delta}} → the per-replica table, as text."""
    def cell(d):
        return f"{d.ok} req {d.masks} masks" if d and (d.ok or d.masks) else "-"

    replicas = range(len(fleet.replicas))
    width = max(len(k) for k in rows) + 2
    names = [fleet.name(i) + ("" if i in fleet.live else " stopped") for i in replicas]
    lines = [title, f"{'layout':<{width}}" + "".join(f"{n:>22}" for n in names)]
    for key, delta in rows.items():
        note = f"  {notes[key]}" if notes and key in notes else ""
        lines.append(f"{key:<{width}}" + "".join(f"{cell(delta.get(i)):>22}" for i in replicas)
                     + note)
    sums = [Counts(*(sum(x) for x in zip(*(d[i] for d in rows.values() if i in d)))) if any(
        i in d for d in rows.values()) else None for i in replicas]
    lines.append(f"{'total':<{width}}" + "".join(f"{cell(t):>22}" for t in sums))
    return "\n".join(lines)


class Load:
    """LOAD_THREADS closed loops through the fleet's client, each cycling over `layouts` from its
    own offset. Records each step's end; a step that fails (after the client's own retries of
    UNAVAILABLE and of a far-side CANCELLED) is a lost call."""

    def __init__(self, fleet, layouts):
        self.fleet, self.layouts = fleet, layouts
        self.done, self.failures = [], []  # (key, monotonic end), (key, error)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(n,), daemon=True)
                         for n in range(LOAD_THREADS)]
        for t in self._threads:
            t.start()

    def _loop(self, offset):
        n = offset
        while not self._stop.is_set():
            layout = self.layouts[n % len(self.layouts)]
            n += 1
            try:
                key = self.fleet.step(layout)
                with self._lock:
                    self.done.append((key, time.monotonic()))
            except (PraxisError, AssertionError) as e:
                with self._lock:
                    self.failures.append((layout, str(e)))

    def served(self, keys, after):
        """How many steps of each key ended after `after`."""
        with self._lock:
            return collections.Counter(k for k, t in self.done if t > after and k in keys)

    def wait(self, what, predicate, timeout=20):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"under load: no {what} within {timeout} s " \
                f"({len(self.done)} steps done, failures {self.failures[:3]})"
            time.sleep(0.02)

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "a load thread did not end"
