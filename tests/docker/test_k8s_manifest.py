"""docker/k8s/: the nightly CronJob runs cron's entry point, which takes the night's date when it
starts, on cron's schedule; the TFJob trains the date it is created for, two workers of the
stages' image, non-root, on the nightly's claim, reachable only from the job's own pods and
restarted only for failures a restart can fix. No manifest names a date."""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import zoneinfo

import pytest
import yaml

from contract.messages import (
    EXIT_BAD_INPUT,
    EXIT_DISK_FULL,
    EXIT_RETRYABLE,
    restart_may_help,
)
from pipeline.train_task import Train
from tests.factories import PROJECT_ROOT
from train.config import SHAPING_SETTINGS

K8S = PROJECT_ROOT / "docker" / "k8s"
CRONTAB = PROJECT_ROOT / "cron" / "nightly.crontab"
# A Kubernetes object's name (DNS-1123 subdomain) and a label's value.
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
# What the nightly pod adds to cron's command: the pod's own network namespace stands in for
# the one the train launcher makes on a host.
POD_FLAGS = ["--Train-allow-host-network"]


def documents(name: str, text: str | None = None) -> dict[str, dict]:
    text = (K8S / name).read_text() if text is None else text
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text)}


def tfjob_for(date: str) -> dict[str, dict]:
    """tfjob.yaml as `envsubst '$RUN_DATE'` writes it for `date`."""
    return documents("tfjob.yaml", (K8S / "tfjob.yaml").read_text().replace("${RUN_DATE}", date))


def nightly_pod() -> tuple[dict, dict]:
    """The nightly CronJob's pod spec and its one container."""
    cron_job = documents("nightly.yaml")["CronJob"]
    pod = cron_job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def cron_line() -> tuple[str, list[str]]:
    """cron/nightly.crontab's schedule and the arguments it gives luigi."""
    for line in CRONTAB.read_text().splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#") or "=" in fields[0]:
            continue  # a comment, a blank line or a variable
        found = re.search(r"\S*/luigi ((?:[^\s>|;&]+ ?)+)", " ".join(fields[5:]))
        if found and "FullRun" in found.group(1).split():
            return " ".join(fields[:5]), found.group(1).split()
    raise AssertionError(f"no job line of {CRONTAB} runs luigi's FullRun")


def test_no_manifest_names_a_date():
    manifests = sorted(K8S.glob("*.yaml"))
    assert {path.name for path in manifests} >= {"nightly.yaml", "tfjob.yaml"}
    for path in manifests:
        dates = re.findall(r"\d{4}-\d{2}-\d{2}", path.read_text())
        assert not dates, f"{path.name} names {dates}"


def test_nightly_runs_crons_entry_point_on_crons_schedule():
    schedule, luigi_args = cron_line()
    cron_job = documents("nightly.yaml")["CronJob"]["spec"]
    assert cron_job["schedule"] == schedule
    pod, container = nightly_pod()
    # The image's entrypoint runs `luigi ARGS...` as given (docker/entrypoint.sh).
    assert container["args"] == ["luigi", *luigi_args, *POD_FLAGS]
    # Each added flag changes how the workers reach each other, never the model trained.
    train_params = dict(Train.get_params())
    for flag in POD_FLAGS:
        name = flag.removeprefix("--Train-").replace("-", "_")
        assert name in train_params and name not in SHAPING_SETTINGS, flag


def test_nightly_date_is_the_pods_date_when_it_starts():
    cron_job = documents("nightly.yaml")["CronJob"]["spec"]
    pod, container = nightly_pod()
    # No date in the command: FullRun takes today's, as under cron.
    assert not any(arg.split("=")[0] in ("--date", "--FullRun-date") for arg in container["args"])
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert "RUN_DATE" not in env
    # Today is the schedule's day: the pod's zone is the one the schedule is read in.
    assert env["TZ"] == cron_job["timeZone"]
    zoneinfo.ZoneInfo(env["TZ"])  # a zone name, not an offset (the image has tzdata)
    # One night at a time; a failed night is not retried blindly (podFailurePolicy needs Never).
    assert cron_job["concurrencyPolicy"] == "Forbid"
    assert cron_job["jobTemplate"]["spec"]["backoffLimit"] == 0
    assert pod["restartPolicy"] == "Never"


def test_nightly_reads_the_images_luigi_cfg_and_writes_to_the_claim():
    docs = documents("nightly.yaml")
    pod, container = nightly_pod()
    env = {item["name"]: item.get("value") for item in container["env"]}
    dockerfile = (PROJECT_ROOT / "docker" / "Dockerfile").read_text()
    (workdir,) = re.findall(r"^WORKDIR (\S+)", dockerfile, re.M)
    assert env["LUIGI_CONFIG_PATH"] == f"{workdir}/luigi.cfg"
    assert "!luigi.cfg" in (PROJECT_ROOT / ".dockerignore").read_text().split()
    # luigi.cfg's relative paths (runs, .cache/...) land on the claim.
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    claim = docs["PersistentVolumeClaim"]["metadata"]["name"]
    (data,) = [n for n, v in volumes.items() if "persistentVolumeClaim" in v]
    assert volumes[data]["persistentVolumeClaim"]["claimName"] == claim
    assert container["workingDir"] == mounts[data]
    assert pod["securityContext"]["runAsUser"] == 1000


def test_nightly_pod_admits_nothing_from_outside():
    docs = documents("nightly.yaml")
    labels = docs["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    policy = docs["NetworkPolicy"]["spec"]
    selected = policy["podSelector"]["matchLabels"]
    assert selected and selected.items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress"] and policy["ingress"] == []


def test_tfjob_takes_its_date_when_created():
    raw = documents("tfjob.yaml")
    worker = raw["TFJob"]["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    (container,) = worker["containers"]
    paths = [arg for arg in container["args"] if arg.startswith(("--data-dir", "--train-dir"))]
    assert len(paths) == 2 and all("/${RUN_DATE}/" in path for path in paths)
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["RUN_DATE"] == "${RUN_DATE}"  # the entrypoint refuses a bad one (exit 2)
    # Unsubstituted, nothing can be created; substituted, every name is valid.
    assert not NAME.fullmatch(raw["TFJob"]["metadata"]["name"])
    docs = tfjob_for("2026-01-31")
    for kind, doc in docs.items():
        assert NAME.fullmatch(doc["metadata"]["name"]), kind
    template = docs["TFJob"]["spec"]["tfReplicaSpecs"]["Worker"]["template"]
    assert all(LABEL_VALUE.fullmatch(value) for value in template["metadata"]["labels"].values())
    (container,) = template["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["RUN_DATE"] == "2026-01-31"  # a string, not a YAML date


def test_tfjob_runs_two_train_workers_on_the_nightly_claim():
    claim = documents("nightly.yaml")["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    worker = tfjob_for("2026-01-31")["TFJob"]["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "tensorflow"
    assert container["args"][:2] == ["train", "worker"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    mount = container["volumeMounts"][0]["mountPath"]
    paths = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--")][:2]
    assert all(path.startswith(f"{mount}/runs/2026-01-31/") for path in paths)


def test_tfjob_pods_run_as_the_image_user_and_restart_by_exit_code():
    worker = documents("tfjob.yaml")["TFJob"]["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["template"]["spec"]["securityContext"]["runAsUser"] == 1000
    # The operator's ExitCode policy: 1-127 permanent, 128-255 retried.
    assert worker["restartPolicy"] == "ExitCode"
    assert not restart_may_help(EXIT_BAD_INPUT) and not restart_may_help(EXIT_DISK_FULL)
    assert restart_may_help(EXIT_RETRYABLE) and 128 <= EXIT_RETRYABLE <= 255


def test_network_policy_admits_only_the_jobs_own_pods():
    docs = tfjob_for("2026-01-31")
    policy = docs["NetworkPolicy"]["spec"]
    pod_labels = docs["TFJob"]["spec"]["tfReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    selected = policy["podSelector"]["matchLabels"]
    assert selected and selected.items() <= pod_labels.items()  # it covers the workers
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (source,) = rule["from"]  # one source, no namespace or address block beside it
    assert source == {"podSelector": {"matchLabels": selected}}


@pytest.mark.docker
def test_nightly_command_starts_fullrun_for_the_date_it_starts(stage_image, tmp_path):
    """The pod's command in the image, with a parameter FullRun refuses before any work: the
    refused attempt's ledger record carries the date the entry point took."""
    pod, container = nightly_pod()
    env = {item["name"]: item["value"] for item in container["env"]}
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    refused = "--Evaluate-min-accuracy=93"
    command = [
        "docker", "run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}",
        "-v", f"{tmp_path}:{mounts['data']}", "-w", container["workingDir"],
        *(f"--env={name}={value}" for name, value in env.items()),
        stage_image, *container["args"], refused,
    ]  # fmt: skip
    zone = zoneinfo.ZoneInfo(env["TZ"])
    before = datetime.datetime.now(zone).date().isoformat()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    after = datetime.datetime.now(zone).date().isoformat()
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-2000:]
    ledger = tmp_path / "runs" / "ledger.jsonl"
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    for record in records:  # the attempt's record (and any record of its start)
        assert record["date"] in (before, after) and record["entry_point"] == "FullRun"
        program, *args = shlex.split(record["command"])
        assert program.endswith("/luigi") and args == [*container["args"][1:], refused]
    assert records[-1]["outcome"] == "refused"
    # luigi.cfg was found and the parameters checked: the refusal is the parameter's.
    assert "min_accuracy" in records[-1]["reason"]
