"""The Dockerfile: hadolint passes, and it serves what the server and the manifests expect."""
import os
import re
import subprocess
import sys

import deploy_checks as dc

DOCKERFILE = os.path.join(dc.SRC, "Dockerfile")
HADOLINT = os.path.join(os.path.dirname(sys.executable), "hadolint")


def hadolint(path):
    return subprocess.run([HADOLINT, "--no-color", path], capture_output=True, text=True)


def test_hadolint_passes():
    r = hadolint(DOCKERFILE)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_would_catch_a_bad_line(tmp_path):
    """The lint is live: an unpinned, cache-keeping apt-get added to our file fails it."""
    bad = tmp_path / "Dockerfile"
    with open(DOCKERFILE) as f:
        bad.write_text(f.read() + "RUN apt-get update && apt-get install -y curl\n")
    r = hadolint(str(bad))
    assert r.returncode != 0 and "DL3008" in r.stdout, r.stdout


def test_ports_healthcheck_and_user_match_the_server(help_flags):
    with open(DOCKERFILE) as f:
        text = f.read()
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", text, re.M) for p in line.split()}
    assert exposed == {int(help_flags["port"]), int(help_flags["metrics_port"])}
    health = re.search(r"^HEALTHCHECK .*\n\s*CMD (\[.*\])$", text, re.M)
    assert health and '"praxis-cli", "health"' in health.group(1)
    assert f'--address=127.0.0.1:{help_flags["port"]}' in health.group(1)
    user = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    assert user and int(user[-1][0]) != 0, "the runtime stage runs as a numeric non-root user"
    pod = dc.one(dc.render("base"), "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"]) == tuple(map(int, user[-1]))
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms == ["${BUILD_IMAGE}", "${RUNTIME_IMAGE}"]
    assert "scripts/setup.sh" in text and "scripts/build.sh" in text
