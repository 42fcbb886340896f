"""The Kubernetes path as written: ``deploy/README.md``'s steps, then the manifests they apply.

:func:`resolve_kubernetes` runs the README's Kubernetes ``sh`` blocks in bash with ``kubectl``
recorded (:func:`tests.deploy.rehearsal.run_steps`): each ``kubectl create secret generic`` (or
``create configmap``) with its ``--from-literal``/``--from-file``/``--from-env-file`` values, as
the shell evaluated them, is a Secret that exists; each ``kubectl apply -f`` a manifest applied.
The manifests are those of ``deploy/kubernetes/kustomization.yaml`` (when there is one, with its
generators), and the files the steps apply. Every container of every workload then gets its
environment (``envFrom``, then ``env``: ``value``, ``secretKeyRef``, ``configMapKeyRef``,
``fieldRef``) from what exists; a Secret or key nobody creates fails unless marked optional,
naming the manifest, container, variable, Secret and key. Containers running ``tiletune`` are the
processes; a PostgreSQL container is the database, reached through the Services that select it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.compose_plan import MAX_REPLICAS, database_service, listening_port, parse_dotenv
from tests.deploy.rehearsal import (
    ROOT,
    DatabaseService,
    Deployment,
    DockerTarget,
    ProcessPlan,
    RehearsalError,
    contract_problems,
    database_problems,
    docker_targets,
    image_command,
    readme_section,
    run_steps,
    shell_blocks,
)

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod")
MANIFESTS = Path("deploy") / "kubernetes"
#: kubectl's options that take the next word as their value when not written ``--option=value``.
VALUE_OPTIONS = {
    "-f": "--filename", "--filename": "--filename", "-k": "--kustomize", "--kustomize": "--kustomize",
    "--from-literal": "--from-literal", "--from-file": "--from-file", "--from-env-file": "--from-env-file",
    "-o": "--output", "--output": "--output", "-l": "--selector", "--selector": "--selector",
    "--type": "--type",
}  # fmt: skip


@dataclass
class Applied:
    """What the steps leave in the cluster: Secrets and ConfigMaps by (kind, namespace, name), manifests."""

    stores: dict[tuple[str, str, str], dict[str, str]] = field(default_factory=dict)
    manifests: list[tuple[Path, str | None]] = field(default_factory=list)  # (file, apply's namespace)
    kustomizations: list[Path] = field(default_factory=list)
    replicas: dict[str, int] = field(default_factory=dict)  # a kustomization's counts, by workload
    skipped: list[str] = field(default_factory=list)


def kubectl_arguments(args: list[str]) -> tuple[str, list[str], dict[str, list[str]]]:
    """One recorded ``kubectl`` call: (namespace, its words, its options' values by long name)."""
    namespace, words, options = "default", [], {}  # type: ignore[var-annotated]
    items = iter(args)
    for arg in items:
        if arg in ("-n", "--namespace"):
            namespace = next(items, namespace)
        elif arg.startswith("--namespace="):
            namespace = arg.partition("=")[2]
        elif arg.startswith("-n") and not arg.startswith("--"):
            namespace = arg[2:]
        elif arg in VALUE_OPTIONS:
            options.setdefault(VALUE_OPTIONS[arg], []).append(next(items, ""))
        elif arg.startswith("--") and "=" in arg:
            key, _, value = arg.partition("=")
            options.setdefault(VALUE_OPTIONS.get(key, key), []).append(value)
        elif arg.startswith("-"):
            options.setdefault(arg, []).append("")
        else:
            words.append(arg)
    return namespace, words, options


def created_data(options: dict[str, list[str]], root: Path) -> dict[str, str]:
    """The keys and values of ``kubectl create secret generic``/``configmap`` from its options."""
    data: dict[str, str] = {}
    for literal in options.get("--from-literal", []):
        key, _, value = literal.partition("=")
        data[key] = value
    for entry in options.get("--from-file", []):
        key, _, path = entry.rpartition("=")
        file = root / path
        data[key or file.name] = file.read_text() if file.is_file() else ""
    for path in options.get("--from-env-file", []):
        data.update(parse_dotenv((root / path).read_text()) if (root / path).is_file() else {})
    return data


def follow_steps(readme: str, root: Path, problems: list[str]) -> Applied:
    """Run the README's Kubernetes steps; what their ``kubectl`` calls create and apply."""
    script = "\n".join(shell_blocks(readme_section(readme, "kubernetes")))
    if not script.strip():
        raise RehearsalError(["deploy/README.md: the Kubernetes section has no ```sh block of steps"])
    with tempfile.TemporaryDirectory(prefix="rehearsal-kube-") as folder:
        calls = run_steps(script, Path(folder))
    applied = Applied()
    for call in calls:
        if call[0] != "kubectl":
            continue
        namespace, words, options = kubectl_arguments(call[1:])
        if words[:3] == ["create", "secret", "generic"] or words[:2] == ["create", "configmap"]:
            kind, name = ("Secret", words[3]) if words[1] == "secret" else ("ConfigMap", words[2])
            if (kind, namespace, name) in applied.stores:
                problems.append(
                    f"deploy/README.md: {kind} {name} is created twice (kubectl refuses the second)"
                )
            applied.stores[(kind, namespace, name)] = created_data(options, root)
        elif words[:1] == ["apply"]:
            for path in options.get("--filename", []):
                add_applied_file(applied, root, path, namespace)
            applied.kustomizations.extend(
                root / path / "kustomization.yaml" for path in options.get("--kustomize", [])
            )
    return applied


def add_applied_file(applied: Applied, root: Path, path: str, namespace: str | None) -> None:
    """``kubectl apply -f PATH``: a file of the repository, or each YAML file of a folder."""
    target = root / path
    if target.is_dir():
        files = sorted([*target.glob("*.yaml"), *target.glob("*.yml")])
        applied.manifests.extend((file, namespace) for file in files if file.name != "kustomization.yaml")
    elif target.is_file():
        applied.manifests.append((target, namespace))
    elif path != "-":
        applied.skipped.append(f"kubectl apply -f {path}: not in the repository (the operator's own file)")


def add_kustomization(applied: Applied, kustomization: Path) -> None:
    """A kustomization's resources (files, in order) and its Secret and ConfigMap generators."""
    spec = yaml.safe_load(kustomization.read_text()) or {}
    namespace = spec.get("namespace")
    for resource in spec.get("resources") or []:
        add_applied_file(applied, kustomization.parent, resource, namespace)
    applied.replicas.update({entry["name"]: int(entry["count"]) for entry in spec.get("replicas") or []})
    for kind, key in (("Secret", "secretGenerator"), ("ConfigMap", "configMapGenerator")):
        for generator in spec.get(key) or []:
            options = {
                "--from-literal": generator.get("literals") or [],
                "--from-file": generator.get("files") or [],
                "--from-env-file": generator.get("envs") or [],
            }
            store = (kind, generator.get("namespace") or namespace or "default", generator["name"])
            applied.stores[store] = created_data(options, kustomization.parent)


def manifest_objects(applied: Applied, root: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object the applied manifests hold, with the manifest's path (relative to ``root``) and a
    namespace (its own, else the one it was applied in)."""
    seen: set[Path] = set()
    for path, namespace in applied.manifests:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict):
                metadata = document.setdefault("metadata", {})
                metadata.setdefault("namespace", namespace or "default")
                yield path.relative_to(root).as_posix(), document


def resolve_kubernetes(root: Path = ROOT, readme_text: str | None = None) -> Deployment:
    """The Kubernetes path of ``root``'s deploy files as a :class:`Deployment` (``readme_text``: the
    README to follow instead of ``root``'s); every defect found is one :class:`RehearsalError`."""
    readme = readme_text if readme_text is not None else (root / "deploy" / "README.md").read_text()
    problems: list[str] = []
    applied = follow_steps(readme, root, problems)
    default_kustomization = root / MANIFESTS / "kustomization.yaml"
    defaults = [default_kustomization] if default_kustomization.exists() else []
    for kustomization in dict.fromkeys([*applied.kustomizations, *defaults]):
        add_kustomization(applied, kustomization)
    objects = list(manifest_objects(applied, root))
    for _, document in objects:
        if document.get("kind") in ("Secret", "ConfigMap"):
            parts = ("data", "stringData", "binaryData")
            data = {key: value for part in parts for key, value in (document.get(part) or {}).items()}
            metadata = document["metadata"]
            applied.stores[(document["kind"], metadata["namespace"], metadata["name"])] = {
                k: str(v) for k, v in data.items()
            }
    deployment = Deployment(name="kubernetes", processes=[], skipped=applied.skipped)
    builder = WorkloadReader(docker_targets(root / "Dockerfile"), applied, problems)
    for manifest, document in objects:
        if document.get("kind") in WORKLOAD_KINDS:
            builder.add(deployment, manifest, document)
    for manifest, document in objects:
        if document.get("kind") == "Service":
            builder.add_service(deployment, manifest, document)
    if not any(plan.kind == "server" for plan in deployment.processes):
        problems.append("the applied manifests run no `tiletune server`")
    problems.extend([*contract_problems(deployment, problems), *database_problems(deployment)])
    if problems:
        raise RehearsalError(problems)
    return deployment


@dataclass
class Pod:
    """A workload's pod template, as the Services that select it see it."""

    namespace: str
    labels: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)  # the containers' named ports
    server_ports: list[int] = field(default_factory=list)  # the ports its `tiletune server`s listen on
    database: DatabaseService | None = None


class WorkloadReader:
    """Reads workloads into a :class:`Deployment`: their containers' commands and environments (from
    the Secrets and ConfigMaps of :class:`Applied`), then the Services that reach them."""

    def __init__(self, targets: dict[str, DockerTarget], applied: Applied, problems: list[str]) -> None:
        self.targets = targets
        self.stores = applied.stores
        self.replicas = applied.replicas
        self.problems = problems
        self.pods: list[Pod] = []

    def add(self, deployment: Deployment, manifest: str, document: dict[str, Any]) -> None:
        """A workload's containers (init containers first), each replica a process (see
        :meth:`rehearsed_replicas`)."""
        kind, metadata, spec = document["kind"], document["metadata"], document.get("spec") or {}
        template = spec if kind == "Pod" else spec.get("template") or {}
        pod_spec = template.get("spec") or {} if kind != "Pod" else spec
        labels = (metadata if kind == "Pod" else template.get("metadata") or {}).get("labels") or {}
        pod = Pod(metadata["namespace"], dict(labels))
        self.pods.append(pod)
        replicas = self.rehearsed_replicas(f"{manifest}: {kind}/{metadata['name']}", document, deployment)
        for container in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]:
            where = f"{manifest}: {kind}/{metadata['name']} container {container.get('name')}"
            pod.ports.update(
                {p["name"]: int(p["containerPort"]) for p in container.get("ports") or [] if "name" in p}
            )
            env = self.environment(container, pod.namespace, f"{metadata['name']}-0", where)
            plan = self.plan(container, env, where, deployment)
            if plan is None:
                if str(container.get("image", "")).rsplit("/", 1)[-1].startswith("postgres"):
                    pod.database = database_service(env)
                continue
            if plan.kind == "server":
                pod.server_ports.append(self.checked_server_port(container, plan, pod, where))
            for replica in range(1, replicas + 1):
                suffix = f" (replica {replica})" if replicas > 1 else ""
                deployment.processes.append(
                    ProcessPlan(plan.source + suffix, plan.target, plan.argv, dict(env), plan.readiness_path)
                )

    def rehearsed_replicas(self, where: str, document: dict[str, Any], deployment: Deployment) -> int:
        """How many replicas of a workload run: its kustomization's count, else its own ``replicas``
        (a DaemonSet, Job or Pod: one, as on one node), at most :data:`MAX_REPLICAS`; a workload
        scaled to 0 as written (accelerator workers until their device counts are set) runs once,
        so that its command and environment are rehearsed too."""
        kind, name = document["kind"], document["metadata"]["name"]
        scalable = kind in ("Deployment", "StatefulSet", "ReplicaSet")
        written = (
            self.replicas.get(name, int((document.get("spec") or {}).get("replicas", 1))) if scalable else 1
        )
        rehearsed = max(1, min(written, MAX_REPLICAS))
        if written != rehearsed:
            deployment.skipped.append(f"{where}: {written} replicas as written, rehearsed with {rehearsed}")
        return rehearsed

    def plan(
        self, container: dict[str, Any], env: dict[str, str], where: str, deployment: Deployment
    ) -> ProcessPlan | None:
        """The container's process when it runs ``tiletune`` (its command, else its image's), else None."""
        image = str(container.get("image", ""))
        image_name = image.rsplit("/", 1)[-1].split("@", maxsplit=1)[0].split(":", maxsplit=1)[0]
        if image_name.startswith("postgres"):
            return None
        target = self.targets.get(image_name)
        command, args = container.get("command"), container.get("args")
        if command is not None:
            argv = [*map(str, command), *map(str, args or [])]
        elif target is not None:
            argv = image_command(target, list(map(str, args)) if args is not None else None)
        else:
            self.problems.append(
                f"{where}: image {image} is no Dockerfile target and the container sets no command"
            )
            return None
        if not argv or Path(argv[0]).name != "tiletune":
            deployment.skipped.append(f"{where}: runs {argv[:1]} (not tiletune)")
            return None
        probe = (container.get("readinessProbe") or {}).get("httpGet") or {}
        return ProcessPlan(
            where, target.name if target else image_name, argv, env, probe.get("path", "/readyz")
        )

    def checked_server_port(self, container: dict[str, Any], plan: ProcessPlan, pod: Pod, where: str) -> int:
        """The port the server listens on; a readiness probe aimed at another port is a problem."""
        port = listening_port(plan.argv)
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        if probe is not None:
            probed = (
                pod.ports.get(probe.get("port")) if isinstance(probe.get("port"), str) else probe.get("port")
            )
            if probed != port:
                self.problems.append(
                    f"{where}: the readiness probe asks port {probe.get('port')}; the server's is {port}"
                )
        return port

    def environment(
        self, container: dict[str, Any], namespace: str, pod_name: str, where: str
    ) -> dict[str, str]:
        """The container's variables: ``envFrom`` first, then ``env`` (later entries win)."""
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            kind = "Secret" if "secretRef" in source else "ConfigMap"
            reference = source.get("secretRef") or source.get("configMapRef") or {}
            data = self.stores.get((kind, namespace, reference.get("name", "")))
            if data is None and not reference.get("optional"):
                why = self.missing(kind, namespace, str(reference.get("name")))
                self.problems.append(f"{where}: envFrom {kind} {reference.get('name')}: {why}")
            env.update({source.get("prefix", "") + key: value for key, value in (data or {}).items()})
        fields = {"metadata.name": pod_name, "metadata.namespace": namespace, "spec.nodeName": "node-0",
                  "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}  # fmt: skip
        for item in container.get("env") or []:
            name, source = item["name"], item.get("valueFrom") or {}
            if "value" in item:
                env[name] = str(item["value"])
            elif "fieldRef" in source:
                env[name] = fields.get(source["fieldRef"].get("fieldPath", ""), "")
            elif "secretKeyRef" in source or "configMapKeyRef" in source:
                value = self.key_value(source, namespace, f"{where}: {name}")
                if value is not None:
                    env[name] = value
        return env

    def key_value(self, source: dict[str, Any], namespace: str, where: str) -> str | None:
        """A ``secretKeyRef``'s or ``configMapKeyRef``'s value; a missing one is a problem unless optional."""
        kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
        reference = source.get("secretKeyRef") or source.get("configMapKeyRef") or {}
        name, key = reference.get("name"), reference.get("key")
        data = self.stores.get((kind, namespace, str(name)))
        if data is not None and key in data:
            return data[key]
        if not reference.get("optional"):
            why = (
                self.missing(kind, namespace, str(name))
                if data is None
                else (f"a key no step creates (they create {sorted(data)})")
            )
            self.problems.append(f"{where} reads key {key} of {kind} {name}: {why}")
        return None

    def missing(self, kind: str, namespace: str, name: str) -> str:
        """Why a Secret or ConfigMap is not there: nobody creates it, or only in another namespace."""
        elsewhere = sorted(ns for (k, ns, n) in self.stores if (k, n) == (kind, name) and ns != namespace)
        article = "a Secret" if kind == "Secret" else "a ConfigMap"
        where = f" in namespace {namespace} (created in {', '.join(elsewhere)})" if elsewhere else ""
        return f"{article} no step creates{where}"

    def add_service(self, deployment: Deployment, manifest: str, document: dict[str, Any]) -> None:
        """A Service's names reach the database or the server of the pods it selects (its target
        port must be the one the server listens on)."""
        spec, metadata = document.get("spec") or {}, document["metadata"]
        selector, namespace, name = spec.get("selector") or {}, metadata["namespace"], metadata["name"]
        names = [
            name,
            f"{name}.{namespace}",
            f"{name}.{namespace}.svc",
            f"{name}.{namespace}.svc.cluster.local",
        ]
        for pod in self.pods:
            if not selector or pod.namespace != namespace or not selector.items() <= pod.labels.items():
                continue
            for port in spec.get("ports") or []:
                target = port.get("targetPort", port["port"])
                target_port = pod.ports.get(target) if isinstance(target, str) else int(target)
                if pod.database is not None:
                    database = DatabaseService(
                        int(port["port"]),
                        pod.database.user,
                        pod.database.password,
                        pod.database.database,
                        pod.database.trust,
                    )
                    deployment.database_hosts.update(dict.fromkeys(names, database))
                for listen in pod.server_ports:
                    if target_port == listen:
                        deployment.server_hosts.update(dict.fromkeys(names, (int(port["port"]), listen)))
            missing = [listen for listen in pod.server_ports if names[0] not in deployment.server_hosts]
            if missing:
                self.problems.append(
                    f"{manifest}: Service/{name} sends no port to the server's port {missing[0]}"
                )
