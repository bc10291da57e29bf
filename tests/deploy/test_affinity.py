"""deploy/affinity run for real: nginx (deploy/affinity/nginx.conf, Debian's nginx) in front of
three praxis-server processes on loopback, and the Envoy config checked to express the same policy.

Proved from each replica's /metrics (praxis_requests_total{method="Step"} and
praxis_mask_cache_misses_total), with nginx's access and error logs as second witnesses:
- the steps of each layout all land on one replica, and the fleet builds each layout's masks once;
- calls without the layout header are spread over the replicas;
- SIGTERM to one replica under load loses no call (each succeeds, or is answered UNAVAILABLE and
  retried by the client to success), the replica answers every step it accepted and exits 0, and
  its layouts move to the others, each to one replica, while theirs stay where they were.
The per-replica tables and the drain result are printed to the test log.

Environment: PRAXIS_SERVER_BIN, PRAXIS_SOURCE_DIR, NGINX_BIN (default: nginx on PATH or in
/usr/sbin), PYTHONPATH holding tests/client, tests/deploy and client/python.
"""
import collections
import copy
import re
import signal
import time
from concurrent import futures

import grpc
import pytest
import yaml

import affinity_checks as ac
from affinity_fleet import (LAYOUTS, FIRST_LAYOUTS, LOAD_BEFORE_SIGTERM_S, LOAD_THREADS,
                            MASKS_PER_LAYOUT, REPLICA_FLAGS, SPREAD_LAYOUT, STEPS, Fleet, Load,
                            landed, step_args, table)
from deploy_checks import LAYOUT_HEADER
from server_process import Server
# client/python is on the path: PYTHONPATH (CTest), else affinity_fleet put it there.
from praxis_client import assemble, make_request, pb  # noqa: E402
from praxis_client import LAYOUT_HEADER as CLIENT_LAYOUT_HEADER  # noqa: E402


def report(capsys, text):
    """Into the test log (CTest keeps stdout), past pytest's capture."""
    with capsys.disabled():
        print("\n" + text, flush=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with futures.ThreadPoolExecutor(3) as pool:  # each start loads the model: in parallel
        starts = [pool.submit(Server, *REPLICA_FLAGS) for _ in range(3)]
    replicas = [s.result() for s in starts if s.exception() is None]
    nginx = None
    try:
        for s in starts:
            if s.exception() is not None:
                raise s.exception()
        nginx = ac.Nginx([r.address for r in replicas], str(tmp_path_factory.mktemp("nginx")))
        f = Fleet(replicas, nginx)
        yield f
        f.client.close()
    finally:
        if nginx:
            nginx.stop()
        for r in replicas:  # the drained one has exited already: stop() checks its status
            r.stop()


@pytest.fixture(scope="module")
def placement(fleet):
    """Each layout sent alone, STEPS times: {key: {replica: Counts delta}} in order, and the
    access-log lines of those calls. Layouts are added past FIRST_LAYOUTS only while all so far
    hashed onto one replica (chance: 3 x 3^-8 for 8 layouts), so that the table shows routing."""
    rows, keys = {}, {}
    first = len(fleet.nginx.access_log())
    for n, layout in enumerate(LAYOUTS):
        if n >= FIRST_LAYOUTS and len({i for d in rows.values() for i in landed(d)}) > 1:
            break
        key, rows[key] = fleet.send_alone(layout, STEPS)
        keys[key] = layout
    return dict(rows=rows, layouts=keys, access=fleet.nginx.access_log()[first:])


def test_each_layout_lands_on_one_replica(fleet, placement, capsys):
    rows = placement["rows"]
    report(capsys, table(fleet, rows, f"affinity: {len(rows)} layouts through nginx "
                         f"{fleet.nginx.address}, {STEPS} steps each, alone; per replica: steps "
                         "answered and masks built (/metrics deltas)"))
    for key, delta in rows.items():
        assert len(landed(delta)) == 1, f"{key}: steps answered by {landed(delta)}: {delta}"
        home = landed(delta)[0]
        assert delta[home].ok == STEPS and delta[home].unavailable == 0, f"{key}: {delta}"
        assert all(d.masks == 0 for i, d in delta.items() if i != home), \
            f"{key}: masks built on a replica that answered none of its steps: {delta}"
        assert delta[home].masks == MASKS_PER_LAYOUT, \
            f"{key}: its replica built {delta[home].masks} masks, expected {MASKS_PER_LAYOUT}"
        # nginx's own record agrees: every call of the layout went to that replica, first try.
        tried = {tuple(c["upstreams"]) for c in placement["access"] if c["layout"] == key}
        assert tried == {(fleet.replicas[home].address,)}, f"{key}: nginx sent it to {tried}"
    built = sum(d.masks for delta in rows.values() for d in delta.values())
    assert built == MASKS_PER_LAYOUT * len(rows), \
        f"the fleet built {built} masks for {len(rows)} layouts"
    report(capsys, f"fleet mask builds: {built} = {MASKS_PER_LAYOUT} per layout x {len(rows)} "
           "distinct layouts")
    used = {landed(d)[0] for d in rows.values()}
    assert len(used) > 1, f"all {len(rows)} layouts hashed onto one replica: is the key the header?"


def test_a_session_follows_its_layout(fleet, placement):
    """A robot's Session stream, opened with its layout's header, goes through nginx (HTTP/2 both
    ways, messages in both directions) to the replica its layout's steps go to."""
    homes = {k: landed(delta) for k, delta in placement["rows"].items()}
    key = next(k for k, h in homes.items() if h and h[0] in fleet.live)  # the first still served
    layout, home = placement["layouts"][key], homes[key][0]

    before = {i: c.session for i, c in fleet.counts().items()}
    with fleet.client.session(timeout=30, layout=key) as s:
        for _ in range(3):
            assert s.step(**step_args(layout)).layout_key == key
    after = {i: c.session for i, c in fleet.counts().items()}
    assert {i: after[i] - before[i] for i in after if after[i] != before[i]} == {home: 3}, \
        f"session steps of {key} by replica: {before} -> {after}; its steps go to r{home}"


def test_calls_without_the_header_are_spread(fleet):
    """nginx maps a missing header to the request id: such calls go to any replica, not all to
    the one the empty string hashes to (16 calls: all on one replica by chance is <= 2^-15)."""
    request = make_request(**step_args(SPREAD_LAYOUT))
    channel = grpc.insecure_channel(fleet.nginx.address)
    step = channel.unary_stream("/praxis.v1.Praxis/Step",
                                request_serializer=pb.StepRequest.SerializeToString,
                                response_deserializer=pb.StepResponse.FromString)
    before = fleet.counts()
    try:
        for _ in range(16):
            assemble(step(request, timeout=30))
    finally:
        channel.close()
    after = fleet.counts()
    answered = {i: after[i].ok - before[i].ok for i in after}
    assert sum(answered.values()) == 16 and sum(1 for n in answered.values() if n) > 1, answered


# A drain under load: the replica stopped, its layouts, the load, its exit status and how long after
# SIGTERM it came.
Drain = collections.namedtuple("Drain", "victim moved load code seconds")


def drain_under_load(fleet, layouts, homes):
    """SIGTERM to the replica with the most layouts while Load runs through nginx; the load stops
    once each of its layouts has been served twice more, by the others, after it exited."""
    owned = collections.Counter(homes.values())
    victim = max(fleet.live, key=lambda i: (owned[i], -i))  # the replica with the most layouts
    moved = [k for k, h in homes.items() if h == victim]
    load = Load(fleet, list(layouts.values()))
    try:
        began = time.monotonic()
        load.wait("step of every layout", lambda: len(load.served(homes, 0)) == len(homes) and
                  time.monotonic() - began > LOAD_BEFORE_SIGTERM_S)
        sigterm = time.monotonic()
        fleet.replicas[victim].proc.send_signal(signal.SIGTERM)
        code = fleet.replicas[victim].proc.wait(timeout=30)
        exited = time.monotonic()
        fleet.live.remove(victim)
        # Each of its layouts served twice more, by the others, before the load stops.
        load.wait("steps of its layouts after it exited",
                  lambda: all(load.served(moved, exited)[k] >= 2 for k in moved))
    finally:
        load.stop()
    return Drain(victim, moved, load, code, exited - sigterm)


def check_drained_replica(fleet, drain):
    """No call lost; the drained replica exited 0 having answered every step it accepted. Its stop
    line (a re.Match: accepted, answered)."""
    assert drain.load.failures == [], f"calls lost under the drain: {drain.load.failures[:5]}"
    log = fleet.replicas[drain.victim].log()
    assert drain.code == 0, log
    stop_line = re.search(r"stopped after \d+ batches: (\d+) steps accepted, (\d+) answered OK.*",
                          log)
    assert stop_line, f"no stop line in the drained replica's output:\n{log}"
    accepted, answered = map(int, stop_line.groups())
    assert accepted == answered, f"the drained replica answered {answered} of {accepted} steps"
    return stop_line


def check_layouts_after_the_drain(fleet, layouts, homes, drain, capsys):
    """Each layout sent alone again through the replicas left: one replica each, the moved ones
    anywhere, the others where they were, no masks built again. {key: {replica: Counts delta}}."""
    after_rows = {}
    for key, layout in layouts.items():
        _, after_rows[key] = fleet.send_alone(layout, 2)
    notes = {k: f"moved from r{drain.victim}" for k in drain.moved}
    report(capsys, table(fleet, after_rows, f"after SIGTERM to {fleet.name(drain.victim)}: each "
                         "layout sent alone (2 steps) through nginx", notes))
    for key, delta in after_rows.items():
        assert len(landed(delta)) == 1, f"{key}: answered by {landed(delta)}: {delta}"
        if key not in drain.moved:
            assert landed(delta) == [homes[key]], f"{key} left {fleet.name(homes[key])}, which " \
                "still serves: the ring moved more than the stopped replica's layouts"
        assert all(d.masks == 0 for d in delta.values()), \
            f"{key}: masks built again after the load had warmed its new replica: {delta}"
    return after_rows


def check_nginx_saw_only_the_drain(fleet, first_call, victim_address):
    """nginx's logs since `first_call`: the only refusals and next-replica moves are the drained
    replica's, and its error log names no other. (refused calls, moved calls, error lines)."""
    calls = [c for c in fleet.nginx.access_log()[first_call:] if c["uri"].endswith("/Step")]
    refused = [c for c in calls if c["grpc"] != 0]

    # UNAVAILABLE from it while it drained; CANCELLED from gRPC for a call that reached it in the
    # instant it shut down, before our code saw it (the client retries both); nginx's 502 for it.
    def the_victims(c):
        return victim_address in c["upstreams"] and (
            (c["grpc"] in (14, 1) and c["upstreams"][-1] == victim_address) or c["status"] == 502)

    assert all(map(the_victims, refused)), \
        f"refusals other than the drained replica's: {[c for c in refused if not the_victims(c)]}"
    next_upstream = [c for c in calls if len(c["upstreams"]) > 1]
    assert all(c["upstreams"][0] == victim_address for c in next_upstream), next_upstream[:5]
    errors = [l for l in fleet.nginx.error_log().splitlines()
              if re.search(r"\[(warn|error|crit|alert|emerg)\]", l)]
    assert all(f'upstream: "grpc://{victim_address}' in l for l in errors), \
        "nginx logged a problem not about the stopped replica:\n" + "\n".join(errors)
    return refused, next_upstream, errors


def drain_report(fleet, layouts, drain, stop_line, nginx_seen, after_rows, totals):
    """The drain's summary for the test log; totals: (fleet_ok, client_ok, masks built)."""
    refused, next_upstream, errors = nginx_seen
    fleet_ok, client_ok, built = totals
    victim_address = fleet.replicas[drain.victim].address
    return "\n".join([
        f"drain: SIGTERM to {fleet.name(drain.victim)} under load ({LOAD_THREADS} client threads, "
        f"{len(layouts)} layouts); it exited {drain.code} {drain.seconds:.2f} s after the signal",
        f"  server: {stop_line.group(0)}",
        f"  clients: {len(drain.load.done)} steps under load, all OK, {len(drain.load.failures)} "
        f"lost; {sum(1 for c in refused if c['grpc'] == 14)} UNAVAILABLE answers (draining) and "
        f"{sum(1 for c in refused if c['status'] == 502)} nginx 502s, each retried by the "
        "client to success",
        f"  nginx: {len(next_upstream)} calls moved to the next replica by nginx itself; "
        f"{len(errors)} error-log lines, all about {victim_address}:",
        *(f"    {l}" for l in errors),
        f"  layouts: {len(drain.moved)} moved ("
        + ", ".join(f"{n} to {fleet.name(i)}" for i, n in sorted(collections.Counter(
            landed(after_rows[k])[0] for k in drain.moved).items()))
        + f"), {len(layouts) - len(drain.moved)} stayed where they were",
        f"  fleet: {fleet_ok} steps answered = {client_ok} received by the clients; "
        f"{built} masks built since the drain began = {MASKS_PER_LAYOUT} x {len(drain.moved)} "
        "moved"])


def test_sigterm_under_load_loses_nothing_and_moves_its_layouts(fleet, placement, capsys):
    rows, layouts = placement["rows"], placement["layouts"]
    homes = {}
    for key, delta in rows.items():
        assert len(landed(delta)) == 1, f"{key} has no single replica; see the placement test"
        homes[key] = landed(delta)[0]
    first_call = len(fleet.nginx.access_log())
    start = fleet.counts()
    drain = drain_under_load(fleet, layouts, homes)
    stop_line = check_drained_replica(fleet, drain)
    answered = int(stop_line.group(2))
    after_rows = check_layouts_after_the_drain(fleet, layouts, homes, drain, capsys)
    end = fleet.counts()
    # Each moved layout built its masks once, on one replica, while the load ran; the others none.
    built = sum(end[i].masks - start[i].masks for i in fleet.live)
    assert built == MASKS_PER_LAYOUT * len(drain.moved), \
        f"{built} masks built by {fleet.live} since the drain began, expected " \
        f"{MASKS_PER_LAYOUT} for each of {len(drain.moved)} moved layouts"

    # Every step the clients got was answered by exactly one replica, and no refusal but the
    # drained replica's UNAVAILABLE reached them.
    assert all(end[i].unavailable == start[i].unavailable for i in fleet.live), \
        f"a replica that was not stopped refused steps UNAVAILABLE: {start} -> {end}"
    client_ok = len(drain.load.done) + 2 * len(layouts)
    # The stop line counts Session steps too.
    fleet_ok = (sum(end[i].ok - start[i].ok for i in fleet.live) + answered
                - start[drain.victim].ok - start[drain.victim].session)
    assert fleet_ok == client_ok, f"replicas answered {fleet_ok} steps, the clients got {client_ok}"
    nginx_seen = check_nginx_saw_only_the_drain(fleet, first_call,
                                                fleet.replicas[drain.victim].address)
    report(capsys, drain_report(fleet, layouts, drain, stop_line, nginx_seen, after_rows,
                                (fleet_ok, client_ok, built)))


def envoy_config():
    with open(ac.ENVOY_CONFIG) as f:
        return yaml.safe_load(f)


def nginx_template():
    with open(ac.NGINX_TEMPLATE) as f:
        return f.read()


def test_envoy_expresses_the_same_policy():
    """Both configs in deploy/affinity hash the clients' header on a ring, spread calls without
    it, and retry the same failures on the next replica as many times."""
    assert LAYOUT_HEADER == CLIENT_LAYOUT_HEADER
    assert ac.policy_problems(nginx_template(), envoy_config(), CLIENT_LAYOUT_HEADER) == []


def route(config):
    return config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["route"]


def envoy_mutations():
    return [
        ("header", lambda c: route(c)["hash_policy"][0]["header"].update(header_name="x-layout")),
        ("round robin", lambda c: c["static_resources"]["clusters"][0].update(
            lb_policy="ROUND_ROBIN")),
        ("no unavailable", lambda c: route(c)["retry_policy"].update(
            retry_on="connect-failure,refused-stream,reset")),
        ("fewer retries", lambda c: route(c)["retry_policy"].update(num_retries=1)),
        ("same host again", lambda c: route(c)["retry_policy"].pop("retry_host_predicate")),
        ("pinned without header", lambda c: route(c)["hash_policy"].append(
            {"connection_properties": {"source_ip": True}})),
    ]


NGINX_MUTATIONS = [
    ("not consistent", "hash $praxis_affinity_key consistent;", "hash $praxis_affinity_key;"),
    ("header", "default $http_x_praxis_layout;", "default $http_x_layout;"),
    ("empty key", '""      $request_id;', ""),
    ("no POST retries", "error timeout non_idempotent;", "error timeout;"),
    ("no error retries", "error timeout non_idempotent;", "timeout non_idempotent;"),
    ("fewer tries", "grpc_next_upstream_tries 3;", "grpc_next_upstream_tries 2;"),
]


@pytest.mark.parametrize("what,mutate", envoy_mutations(), ids=[m[0] for m in envoy_mutations()])
def test_policy_check_catches_an_envoy_difference(what, mutate):
    config = copy.deepcopy(envoy_config())
    mutate(config)
    assert ac.policy_problems(nginx_template(), config, CLIENT_LAYOUT_HEADER), what


@pytest.mark.parametrize("what,old,new", NGINX_MUTATIONS, ids=[m[0] for m in NGINX_MUTATIONS])
def test_policy_check_catches_an_nginx_difference(what, old, new):
    text = nginx_template()
    assert text.count(old) == 1, f"{old!r} not in nginx.conf: update the mutation"
    assert ac.policy_problems(text.replace(old, new), envoy_config(), CLIENT_LAYOUT_HEADER), what
