"""docker/Dockerfile and docker/compose.yaml agree with ``paratrain serve`` and with each other."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from paratrain.commands.cli import build_parser

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _instructions() -> dict[str, list[str]]:
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.setdefault(word.upper(), []).append(rest.strip())
    return found


def test_the_image_runs_serve_as_a_non_root_user_with_a_doctor_healthcheck() -> None:
    ins = _instructions()
    assert json.loads(ins["ENTRYPOINT"][-1]) == ["tini", "--", "paratrain", "serve"]
    assert ins["USER"][-1] == "${USER_NAME}" and "root" not in ins["USER"][-1]
    health = ins["HEALTHCHECK"][-1]
    assert json.loads(health.split("CMD", 1)[1]) == ["paratrain", "doctor", "--quick", "--json"]
    assert re.match(r"BASE_IMAGE=pytorch/pytorch:\d+\.\d+\.\d+-cuda[\d.]+-cudnn\d+-runtime$",
                    ins["ARG"][0])  # fmt: skip
    defaults = build_parser().parse_args(["serve"])
    assert sorted(ins["EXPOSE"][-1].split()) == sorted(
        [str(defaults.jupyter_port), str(defaults.ssh_port)]
    )
    assert "/workspace/data" in ins["VOLUME"][-1] and "/workspace/checkpoints" in ins["VOLUME"][-1]


def test_compose_maps_the_image_ports_gpus_and_shared_memory() -> None:
    service = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["paratrain"]
    assert service["build"]["dockerfile"] == "docker/Dockerfile" and service["gpus"] == "all"
    assert service["ipc"] == "host"
    assert set(service["ports"]) == {"8888:8888", "2222:2222"}
    mounts = {v.split(":")[1] for v in service["volumes"]}
    assert {"/workspace/data", "/workspace/checkpoints", "/workspace/runs"} <= mounts
