# SPDX-License-Identifier: Apache-2.0
"""Offline validation of the Kubernetes manifests in this folder.

No API server is reachable here, and `kubectl create --dry-run=client`
needs one: it asks the server for its API groups and OpenAPI schema before
it checks anything. So every object of a built-in kind is checked against
the Kubernetes API's types as the official Python client (Debian's
python3-kubernetes) was generated from them: every field must exist at its
place (a misspelt or misplaced key is an error), have its type (string,
integer, boolean, list, map, object), and every required field and enum
value is checked by the model's own constructor. Then what the API server
would reject beyond types: a workload's selector must match its pod labels,
a Service must select pods of some workload here and name their ports.
The two Prometheus Operator kinds are custom resources the client does not
know: the ServiceMonitor's fields are checked against the few its CRD
defines that we use, and the PrometheusRule's groups must equal
packaging/prometheus/kvshare-rules.yml (which promtool tests:
tests/ops/prometheus_rules_test.yml). With --kvshared, the ConfigMap's
kvshared.conf passes `kvshared --check-config` (with pool.env's size); with
--kubectl, both variants render (`kubectl kustomize`, offline: this folder,
the host pool, and ../kubernetes-cuda, the GPU pool) and their output is
checked too: RuntimeClass nvidia in the cuda variant only, the pool's size
from pool.env alone (kvshared's --pool-bytes, the memory request).
Of admission, two things: the namespace carries a Pod Security level that
admits its pods (hostPath needs `privileged`), and every priority class is
defined here (system-* classes are admitted in kube-system only).

Not seen here: the rest of admission (quotas, webhooks), defaults the
server fills in, whether the image, runtime class or node labels exist on
a cluster, and the custom resources' full CRD schemas.

Usage: /usr/bin/python3 validate.py [--kvshared PATH] [--kubectl PATH] [--dir DIR]
       /usr/bin/python3 validate.py --write-prometheusrule
Exit status: 0 valid, 1 errors (listed), 77 python3-kubernetes or
python3-yaml missing.
"""

import glob
import os
import subprocess
import sys
import tempfile

try:
    import yaml
    import kubernetes.client
    import kubernetes.client.models as models
except ImportError as e:
    print("skipped: %s (Debian: python3-kubernetes, python3-yaml)" % e)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = os.path.join(HERE, "..", "prometheus", "kvshare-rules.yml")
PROMETHEUSRULE = os.path.join(HERE, "prometheusrule.yaml")

# The ServiceMonitor fields of the Prometheus Operator's CRD
# (monitoring.coreos.com/v1) that these manifests may use.
SERVICEMONITOR = {
    "spec": {"selector": "selector", "namespaceSelector": {"any": bool, "matchNames": list},
             "jobLabel": str, "endpoints": [{
                 "port": str, "path": str, "interval": str, "scrapeTimeout": str,
                 "honorLabels": bool, "scheme": str,
                 "relabelings": [{"sourceLabels": list, "targetLabel": str,
                                  "replacement": str, "regex": str, "action": str,
                                  "separator": str}],
                 "metricRelabelings": [{"sourceLabels": list, "targetLabel": str,
                                        "replacement": str, "regex": str, "action": str}]}]},
}


class Checker:
    def __init__(self):
        self.errors = []
        self.config = kubernetes.client.Configuration()
        self.config.client_side_validation = True

    def error(self, where, msg):
        self.errors.append("%s: %s" % (where, msg))

    def typed(self, value, typ, where):
        """Checks value (parsed YAML) against an OpenAPI type name of the
        Python client: 'str', 'int', 'list[V1Container]', 'dict(str, str)',
        'V1PodSpec', 'object' (int-or-string, free-form)."""
        if typ.startswith("list["):
            if not isinstance(value, list):
                return self.error(where, "expected a list, got %r" % (value,))
            for i, item in enumerate(value):
                self.typed(item, typ[5:-1], "%s[%d]" % (where, i))
        elif typ.startswith("dict("):
            if not isinstance(value, dict):
                return self.error(where, "expected a map, got %r" % (value,))
            inner = typ[5:-1].split(", ", 1)[1]
            for k, v in value.items():
                self.typed(v, inner, "%s.%s" % (where, k))
        elif typ == "str":
            if not isinstance(value, str):
                self.error(where, "expected a string, got %r (quote it)" % (value,))
        elif typ == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                self.error(where, "expected an integer, got %r" % (value,))
        elif typ == "float":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                self.error(where, "expected a number, got %r" % (value,))
        elif typ == "bool":
            if not isinstance(value, bool):
                self.error(where, "expected true or false, got %r" % (value,))
        elif typ in ("object", "datetime", "date"):
            pass
        else:
            self.model(value, getattr(models, typ), where)

    def model(self, value, cls, where):
        if not isinstance(value, dict):
            return self.error(where, "expected an object (%s), got %r" % (cls.__name__, value))
        by_json = {j: a for a, j in cls.attribute_map.items()}
        for key, v in value.items():
            if key not in by_json:
                self.error("%s.%s" % (where, key), "no such field in %s" % cls.__name__)
                continue
            self.typed(v, cls.openapi_types[by_json[key]], "%s.%s" % (where, key))
        # Required fields and enum values: the model's setters check them.
        kwargs = {by_json[k]: v for k, v in value.items() if k in by_json}
        try:
            cls(local_vars_configuration=self.config, **kwargs)
        except (ValueError, TypeError) as e:
            self.error(where, "%s: %s" % (cls.__name__, e))

    def custom(self, value, schema, where):
        """A small hand-written schema: a dict of fields, [item schema], a
        Python type, or "selector" (a V1LabelSelector)."""
        if schema == "selector":
            return self.model(value, models.V1LabelSelector, where)
        if isinstance(schema, type):
            if not isinstance(value, schema) or (schema is not bool and isinstance(value, bool)):
                self.error(where, "expected %s, got %r" % (schema.__name__, value))
            return
        if isinstance(schema, list):
            if not isinstance(value, list):
                return self.error(where, "expected a list")
            for i, item in enumerate(value):
                self.custom(item, schema[0], "%s[%d]" % (where, i))
            return
        if not isinstance(value, dict):
            return self.error(where, "expected an object")
        for key, v in value.items():
            if key not in schema:
                self.error("%s.%s" % (where, key), "not a field this check knows")
            else:
                self.custom(v, schema[key], "%s.%s" % (where, key))


def model_of(obj):
    """apps/v1 DaemonSet -> models.V1DaemonSet; None for an unknown kind."""
    version = obj.get("apiVersion", "").split("/")[-1]
    name = version[:1].upper() + version[1:] + obj.get("kind", "")
    return getattr(models, name, None)


def pod_labels(obj):
    return (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def check_objects(ck, objects, rules):
    workloads = [(w, o) for w, o in objects if o.get("kind") in ("DaemonSet", "Deployment")]
    for where, obj in objects:
        kind = obj.get("kind")
        if kind == "ServiceMonitor":
            ck.custom({k: v for k, v in obj.items()
                       if k not in ("apiVersion", "kind", "metadata")}, SERVICEMONITOR, where)
            ck.model(obj.get("metadata"), models.V1ObjectMeta, where + ".metadata")
        elif kind == "PrometheusRule":
            ck.model(obj.get("metadata"), models.V1ObjectMeta, where + ".metadata")
            if obj.get("spec") != {"groups": rules["groups"]}:
                ck.error(where, "spec.groups differ from packaging/prometheus/kvshare-rules.yml: "
                                "run validate.py --write-prometheusrule")
        elif kind == "Kustomization":
            continue
        else:
            cls = model_of(obj)
            if cls is None:
                ck.error(where, "unknown kind %s %s" % (obj.get("apiVersion"), kind))
                continue
            ck.model(obj, cls, where)
        if kind in ("DaemonSet", "Deployment"):
            sel = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            labels = pod_labels(obj)
            if not sel or any(labels.get(k) != v for k, v in sel.items()):
                ck.error(where, "spec.selector.matchLabels %r do not match the pod's labels %r"
                         % (sel, labels))
        if kind == "Service":
            sel = (obj.get("spec") or {}).get("selector") or {}
            pods = [o for _, o in workloads
                    if sel and all(pod_labels(o).get(k) == v for k, v in sel.items())]
            if not pods:
                ck.error(where, "selects no pods of the workloads here")
            ports = {p.get("name") for o in pods
                     for c in o["spec"]["template"]["spec"].get("containers", [])
                     for p in c.get("ports", [])}
            for p in (obj.get("spec") or {}).get("ports", []):
                t = p.get("targetPort")
                if isinstance(t, str) and t not in ports:
                    ck.error(where, "targetPort %r is no container port of its pods" % t)


def pods(objects):
    """(where, pod spec) of every workload."""
    return [(w, ((o.get("spec") or {}).get("template") or {}).get("spec") or {})
            for w, o in objects if o.get("kind") in ("DaemonSet", "Deployment")]


def check_admission(ck, objects):
    """What a cluster's admission would refuse that the types cannot say:
    a namespace of ours without a Pod Security level that its pods need
    (hostPath or a root container are refused below `privileged`), and a
    priority class that is neither defined here nor a system class in
    kube-system (where alone those are admitted)."""
    namespaces = {(o.get("metadata") or {}).get("name"): (w, o) for w, o in objects
                  if o.get("kind") == "Namespace"}
    for name, (where, obj) in namespaces.items():
        labels = (obj.get("metadata") or {}).get("labels") or {}
        level = labels.get("pod-security.kubernetes.io/enforce")
        if level not in ("privileged", "baseline", "restricted"):
            ck.error(where, "no pod-security.kubernetes.io/enforce label (privileged, baseline "
                            "or restricted)")
        elif level != "privileged":
            for w, spec in pods(objects):
                if any("hostPath" in v for v in spec.get("volumes") or []):
                    ck.error(w, "a hostPath volume, refused by the namespace's Pod Security "
                                "level %s" % level)
    defined = {(o.get("metadata") or {}).get("name") for _, o in objects
               if o.get("kind") == "PriorityClass"}
    for w, spec in pods(objects):
        pc = spec.get("priorityClassName")
        if pc and pc not in defined and not pc.startswith("system-"):
            ck.error(w, "priorityClassName %s is not defined here" % pc)
        elif pc and pc.startswith("system-"):
            ck.error(w, "priorityClassName %s is admitted only in kube-system: define a "
                        "PriorityClass" % pc)


def read_pool(folder):
    """pool.env's pool_bytes: the pool's size, set there only."""
    with open(os.path.join(folder, "pool.env")) as f:
        for line in f:
            if line.startswith("pool_bytes="):
                return line.split("=", 1)[1].strip()
    return None


def kvshared_pod(objects):
    for w, o in objects:
        if o.get("kind") == "DaemonSet" and (o.get("metadata") or {}).get("name") == "kvshared":
            spec = o["spec"]["template"]["spec"]
            return w, spec, [c for c in spec["containers"] if c.get("name") == "kvshared"][0]
    return None, None, None


def check_variants(ck, folder, host, cuda):
    """The two rendered variants: the host pool without a runtime class, the
    cuda one with RuntimeClass nvidia; the pool's size from pool.env alone,
    as kvshared's --pool-bytes and as the host variant's memory request."""
    pool = read_pool(folder)
    if not pool:
        return ck.error("pool.env", "no pool_bytes=")
    for name, objects in (("host", host), ("cuda", cuda)):
        if objects is None:
            continue
        where, spec, c = kvshared_pod(objects)
        if spec is None:
            ck.error(name, "no DaemonSet kvshared")
            continue
        rc = spec.get("runtimeClassName")
        if name == "host" and rc is not None:
            ck.error(where, "the host variant needs no runtime class, has %s" % rc)
        if name == "cuda" and rc != "nvidia":
            ck.error(where, "the cuda variant's runtimeClassName is %r, not nvidia" % rc)
        cmd = c.get("command") or []
        env = {e.get("name"): e for e in c.get("env") or []}
        ref = ((env.get("KVSHARE_POOL_BYTES") or {}).get("valueFrom") or {}).get(
            "configMapKeyRef") or {}
        maps = {(o.get("metadata") or {}).get("name"): o for _, o in objects
                if o.get("kind") == "ConfigMap"}
        if "$(KVSHARE_POOL_BYTES)" not in cmd or ref.get("key") != "pool_bytes" or \
                ((maps.get(ref.get("name")) or {}).get("data") or {}).get("pool_bytes") != pool:
            ck.error(where, "kvshared's --pool-bytes is not pool.env's %s" % pool)
        for cm in maps.values():
            for line in ((cm.get("data") or {}).get("kvshared.conf") or "").split("\n"):
                if line.split("=")[0].strip() in ("pool_bytes", "pool_blocks"):
                    ck.error(where, "kvshared.conf sizes the pool (%s): pool.env does" % line)
        memory = ((c.get("resources") or {}).get("requests") or {}).get("memory")
        if name == "host" and str(memory) != pool:
            ck.error(where, "the memory request %s is not pool.env's %s" % (memory, pool))
    # The number itself: in pool.env and nowhere else among the sources.
    for path in glob.glob(os.path.join(folder, "**", "*"), recursive=True):
        if os.path.isfile(path) and os.path.basename(path) != "pool.env" and \
                not path.endswith(".py"):
            with open(path, errors="replace") as f:
                if pool in f.read():
                    ck.error(os.path.relpath(path, folder), "repeats the pool size %s" % pool)


def render(ck, kubectl, folder, rules, label):
    r = subprocess.run([kubectl, "kustomize", folder], capture_output=True, text=True)
    if r.returncode != 0:
        ck.error(label, "kubectl kustomize: " + r.stderr)
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as t:
        t.write(r.stdout)
        t.flush()
        rendered = load(ck, [t.name])
    rendered = [("%s:%s" % (label, w.split(" ", 1)[1]), o) for w, o in rendered]
    check_objects(ck, rendered, rules)
    check_admission(ck, rendered)
    return rendered


def load(ck, paths):
    objects = []
    for path in paths:
        with open(path) as f:
            try:
                docs = list(yaml.safe_load_all(f))
            except yaml.YAMLError as e:
                ck.error(os.path.basename(path), "not YAML: %s" % e)
                continue
            for i, doc in enumerate(docs):
                if not isinstance(doc, dict):
                    if doc is not None:
                        ck.error("%s#%d" % (os.path.basename(path), i), "not an object")
                    continue
                if doc is not None:
                    objects.append(("%s#%d %s/%s" % (os.path.basename(path), i,
                                                     doc.get("kind"),
                                                     (doc.get("metadata") or {}).get("name")),
                                    doc))
    return objects


def write_prometheusrule(rules):
    obj = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "kvshare",
                        "labels": {"app.kubernetes.io/name": "kvshared",
                                   "app.kubernetes.io/part-of": "kvshare"}},
           "spec": {"groups": rules["groups"]}}
    with open(PROMETHEUSRULE, "w") as f:
        f.write("# Generated from packaging/prometheus/kvshare-rules.yml by\n"
                "#     /usr/bin/python3 packaging/kubernetes/validate.py --write-prometheusrule\n"
                "# (validate.py fails when the two differ). What each alert means:\n"
                "# docs/OPERATING.md, \"On call\".\n")
        yaml.dump(obj, f, Dumper=_BlockDumper, sort_keys=False, width=100)


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (the PromQL expressions) as `|` blocks, as
    the rules file has them."""


def _str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def main(argv):
    kvshared = kubectl = None
    folder = HERE
    args = list(argv)
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    if args == ["--write-prometheusrule"]:
        write_prometheusrule(rules)
        return 0
    while args:
        flag = args.pop(0)
        if flag == "--kvshared" and args:
            kvshared = args.pop(0)
        elif flag == "--kubectl" and args:
            kubectl = args.pop(0)
        elif flag == "--dir" and args:
            folder = os.path.abspath(args.pop(0))
        else:
            print(__doc__.split("Usage: ")[1].split("\n")[0])
            return 2
    ck = Checker()
    paths = sorted(glob.glob(os.path.join(folder, "*.yaml")) +
                   glob.glob(os.path.join(folder, "examples", "*.yaml")))
    objects = load(ck, paths)
    check_objects(ck, objects, rules)
    check_admission(ck, objects)
    checked = len([o for _, o in objects if o.get("kind") != "Kustomization"])
    if kvshared:
        r = subprocess.run([kvshared, "--check-config", os.path.join(folder, "kvshared.conf"),
                            "--pool-bytes", read_pool(folder) or "0"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            ck.error("kvshared.conf", r.stdout + r.stderr)
    if kubectl:
        host = render(ck, kubectl, folder, rules, "kustomize")
        cuda_dir = os.path.join(folder, "..", "kubernetes-cuda")
        cuda = None
        if os.path.isdir(cuda_dir):
            cuda = render(ck, kubectl, cuda_dir, rules, "kustomize-cuda")
        check_variants(ck, folder, host, cuda)
        checked += len(host or []) + len(cuda or [])
    for e in ck.errors:
        print("error: " + e)
    print("%d objects checked, %d errors" % (checked, len(ck.errors)))
    return 1 if ck.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
