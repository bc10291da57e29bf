"""praxis-forward (the C++ model from the command line) against the reference's golden outputs."""

import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file

CASES = ["k1", "k3", "no_decode", "rope_shifts", "ragged"]


def _env(name: str) -> str:
    value = os.environ.get(name, "")
    assert value, f"{name} must be set (the CTest target sets it)"
    return value


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("attention", ["sparse", "dense"])
def test_forward_matches_golden(case, attention, tmp_path):
    """Every output of praxis-forward equals the reference's to 1e-4 (positions exactly)."""
    tiny = _env("PRAXIS_TINY_DIR")
    inputs = os.path.join(tiny, "goldens", f"case_{case}.inputs.safetensors")
    golden = load_file(os.path.join(tiny, "goldens", f"case_{case}.outputs.safetensors"))
    given = load_file(inputs)
    shifts = ",".join(str(int(s)) for s in given["rope_shifts"])
    out = tmp_path / "out.safetensors"
    subprocess.run([_env("PRAXIS_FORWARD_BIN"), "--checkpoint", os.path.join(tiny, "model"),
                    "--inputs", inputs, "--out", str(out), "--attention", attention,
                    "--rope_shifts", shifts, f"--decode={bool(int(given['decode'][0]))}".lower()],
                   check=True, timeout=120)
    got = load_file(str(out))
    assert set(got) == set(golden)
    for name, want in golden.items():
        if want.dtype == torch.int64:
            assert torch.equal(got[name], want), name
        else:
            assert (got[name] - want).abs().max().item() <= 1e-4, name


def test_forward_refuses_bad_inputs_naming_the_field(tmp_path):
    """A malformed step exits non-zero with the field named, and writes nothing."""
    tiny = _env("PRAXIS_TINY_DIR")
    given = load_file(os.path.join(tiny, "goldens", "case_k3.inputs.safetensors"))
    given["timesteps"] = given["timesteps"] + 5.0
    bad = tmp_path / "bad.safetensors"
    from safetensors.torch import save_file
    save_file(given, str(bad))
    out = tmp_path / "out.safetensors"
    r = subprocess.run([_env("PRAXIS_FORWARD_BIN"), "--checkpoint", os.path.join(tiny, "model"),
                        "--inputs", str(bad), "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "timesteps" in r.stderr
    assert not out.exists()
