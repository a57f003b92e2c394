"""docker/k8s/tfjob.yaml: two workers of the stages' image, non-root, on one shared claim,
reachable only from the job's own pods and restarted only for failures a restart can fix."""

from __future__ import annotations

import yaml

from contract.messages import EXIT_BAD_INPUT, EXIT_DISK_FULL, EXIT_RETRYABLE, restart_may_help
from tests.factories import PROJECT_ROOT


def documents() -> dict[str, dict]:
    with open(PROJECT_ROOT / "docker" / "k8s" / "tfjob.yaml") as f:
        return {doc["kind"]: doc for doc in yaml.safe_load_all(f)}


def test_tfjob_runs_two_train_workers_on_the_shared_claim():
    docs = documents()
    claim = docs["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    worker = docs["TFJob"]["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "tensorflow"
    assert container["args"][:2] == ["train", "worker"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    mount = container["volumeMounts"][0]["mountPath"]
    paths = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--")][:2]
    assert all(path.startswith(mount + "/") for path in paths)


def test_tfjob_pods_run_as_the_image_user_and_restart_by_exit_code():
    worker = documents()["TFJob"]["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["template"]["spec"]["securityContext"]["runAsUser"] == 1000
    # The operator's ExitCode policy: 1-127 permanent, 128-255 retried.
    assert worker["restartPolicy"] == "ExitCode"
    assert not restart_may_help(EXIT_BAD_INPUT) and not restart_may_help(EXIT_DISK_FULL)
    assert restart_may_help(EXIT_RETRYABLE) and 128 <= EXIT_RETRYABLE <= 255


def test_network_policy_admits_only_the_jobs_own_pods():
    docs = documents()
    policy = docs["NetworkPolicy"]["spec"]
    pod_labels = docs["TFJob"]["spec"]["tfReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    selected = policy["podSelector"]["matchLabels"]
    assert selected and selected.items() <= pod_labels.items()  # it covers the workers
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (source,) = rule["from"]  # one source, no namespace or address block beside it
    assert source == {"podSelector": {"matchLabels": selected}}
