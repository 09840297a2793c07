#!/usr/bin/env bash
# dashboards/ and docker/ cannot drift from what the gateway exports:
#  - every arka: metric named by the Grafana dashboard, the alert rules, the compose file and the
#    Kubernetes manifests (the HPA's arka_X custom metric included) is one that gw_met_render
#    produces: the list comes from `test_gw_metrics --names`, which renders a registry with every
#    family populated (a self-test shows the check rejects a made-up name);
#  - the dashboard has the ${datasource} and model_name variables, every panel and query uses
#    ${datasource}, and it shows TTFT and ITL p50/p99 through histogram_quantile over _bucket;
#  - every JSON and YAML file under dashboards/ and docker/ parses (python3 json and yaml);
#  - with promtool: `promtool check config` and `promtool check rules` pass, every dashboard query
#    parses as PromQL (checked as recording rules), and `promtool test rules` shows each alert
#    firing on synthetic series of one model and staying quiet for a healthy one;
#  - the Dockerfiles build from the right bases and copy files that exist.
# Skipped (77) when the test_gw_metrics binary is not built (no gateway in this build).
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=${ARKA_BUILD:-$ROOT/build}
MET=${ARKA_MET_BIN:-$BUILD/bin/test_gw_metrics}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
cd "$ROOT"

if [ ! -x "$MET" ]; then
    echo "SKIP: $MET not built (the gateway is not part of this build)"
    exit 77
fi
"$MET" --names >"$TMP/names" 2>"$TMP/e" && ok || bad "test_gw_metrics --names: $(cat "$TMP/e")"
n=$(wc -l <"$TMP/names")
[ "$n" -ge 40 ] && grep -qx 'arka:num_requests_waiting' "$TMP/names" &&
    grep -qx 'arka:time_to_first_token_seconds_bucket' "$TMP/names" && ok || bad "--names printed $n names"

PY=python3
command -v "$PY" >/dev/null || { echo "FAIL: python3 not found"; exit 1; }

# The checks that need parsing. Prints one "FAIL: ..." line per problem and "OK <n>" per passed
# check; writes the PromQL of the dashboard as recording rules, and the alert unit test, into $TMP.
cat >"$TMP/check.py" <<'EOF'
import json, os, re, sys

root, tmp, names_file = sys.argv[1], sys.argv[2], sys.argv[3]
exported = set(open(names_file).read().split())
fails, oks = [], [0]
def ok(): oks[0] += 1
def bad(msg): fails.append(msg)
NAME = re.compile(r"arka:[A-Za-z_][A-Za-z0-9_:]*")

try:
    import yaml
except ImportError:
    yaml = None
    print("note: python3 yaml module missing (Debian python3-yaml): YAML files not parsed")

def unknown(text):
    return sorted({n for n in NAME.findall(text) if n not in exported})

# The check itself must be able to fail.
if unknown('sum(rate(arka:no_such_metric_total[5m])) / arka:num_requests_waiting') == ['arka:no_such_metric_total']:
    ok()
else:
    bad("self-test: a made-up metric name was not reported")

# Every JSON and YAML file parses.
docs = {}
for top in ("dashboards", "docker"):
    for d, _, files in os.walk(os.path.join(root, top)):
        for f in sorted(files):
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)
            try:
                if f.endswith(".json"):
                    docs[rel] = [json.load(open(p))]
                elif f.endswith((".yml", ".yaml")) and yaml:
                    docs[rel] = list(yaml.safe_load_all(open(p)))
                else:
                    continue
                ok()
            except Exception as e:
                bad(f"{rel}: does not parse: {e}")

# Every arka: name in the monitoring and deployment files is exported.
for top in ("dashboards", "docker"):
    for d, _, files in os.walk(os.path.join(root, top)):
        for f in sorted(files):
            if not f.endswith((".json", ".yml", ".yaml")):
                continue
            p = os.path.join(d, f)
            u = unknown(open(p).read())
            if u: bad(f"{os.path.relpath(p, root)} names metrics the gateway does not export: {u}")
            else: ok()

# The dashboard.
dash = json.load(open(os.path.join(root, "dashboards/grafana/arka.json")))
tv = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
if tv.get("datasource", {}).get("type") == "datasource" and tv["datasource"].get("query") == "prometheus": ok()
else: bad("dashboard: no datasource variable of type datasource (prometheus)")
mv = tv.get("model_name", {})
mq = mv.get("query", {})
mq = mq.get("query", "") if isinstance(mq, dict) else mq
if mv.get("type") == "query" and "model_name" in mq and not unknown(mq) and NAME.search(mq): ok()
else: bad(f"dashboard: model_name variable missing or not a label_values query: {mv}")
exprs = []
def walk(panels):
    for p in panels:
        if p.get("type") == "row":
            walk(p.get("panels", []))
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            bad(f"dashboard panel '{p.get('title')}': datasource is not ${{datasource}}")
        ts = p.get("targets", [])
        if not ts: bad(f"dashboard panel '{p.get('title')}': no queries")
        for t in ts:
            e = t.get("expr", "")
            if t.get("datasource", {}).get("uid") != "${datasource}":
                bad(f"dashboard panel '{p.get('title')}' query {t.get('refId')}: datasource is not ${{datasource}}")
            if not NAME.search(e): bad(f"dashboard panel '{p.get('title')}': query names no arka: metric: {e}")
            if 'model_name=~"$model_name"' not in e: bad(f"dashboard panel '{p.get('title')}': query ignores $model_name: {e}")
            exprs.append((p.get("title"), e))
walk(dash.get("panels", []))
ok()
allq = "\n".join(e for _, e in exprs)
for metric in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
    for qu in ("0.5", "0.99"):
        if re.search(r"histogram_quantile\(%s, sum by \([^)]*le\) \(rate\(arka:%s_bucket" % (re.escape(qu), metric), allq): ok()
        else: bad(f"dashboard: no p{float(qu)*100:g} of {metric} from histogram_quantile over rate of _bucket")
for metric in ("request_success_total", "prompt_tokens_total", "generation_tokens_total", "num_requests_waiting",
               "num_requests_running", "kv_cache_usage_perc", "batch_size_bucket", "http_requests_total",
               "tenant_requests_total", "tenant_generation_tokens_total"):
    if "arka:" + metric in allq: ok()
    else: bad(f"dashboard: no panel shows arka:{metric}")

# The dashboard's PromQL as recording rules, for promtool check rules (Grafana's variables
# replaced by values PromQL accepts).
rules = []
for i, (title, e) in enumerate(exprs):
    e = e.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$model_name", ".*")
    rules.append({"record": f"dashboard:query_{i}", "expr": e})
with open(os.path.join(tmp, "dash_rules.json"), "w") as f:
    json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)   # JSON is YAML

# Alert rules: the metrics they watch, and a unit test for promtool with the annotations left out
# (annotations are templates over $value; check rules validates them).
if yaml:
    alerts = yaml.safe_load(open(os.path.join(root, "dashboards/prometheus/alerts.yml")))
    names = []
    for g in alerts["groups"]:
        for r in g["rules"]:
            names.append(r["alert"])
            r.pop("annotations", None)
            if not NAME.search(r["expr"]): bad(f"alert {r['alert']}: names no arka: metric")
    want = {"ArkaQueueHigh", "ArkaKVCacheNearlyFull", "ArkaHighErrorRate", "ArkaExecutorRestarts", "ArkaTTFTHigh"}
    if want <= set(names): ok()
    else: bad(f"alerts.yml lacks {sorted(want - set(names))}")
    with open(os.path.join(tmp, "alerts_bare.yml"), "w") as f:
        yaml.safe_dump(alerts, f)
    S = lambda name, labels, values: {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}
    series = []
    for model, hot in (("hot", True), ("calm", False)):
        m = {"model_name": model}
        series += [
            S("arka:num_requests_waiting", m, "40x30" if hot else "3x30"),
            S("arka:kv_cache_usage_perc", m, "0.99x30" if hot else "0.4x30"),
            S("arka:http_requests_total", {**m, "route": "/v1/completions", "status": "200"}, "0+60x30"),
            S("arka:http_requests_total", {**m, "route": "/v1/completions", "status": "500"}, "0+30x30" if hot else "0x30"),
            S("arka:executor_restarts_total", {**m, "executor": "0"}, "0+1x30" if hot else "1x30"),
            S("arka:fallback_admissions_total", m, "0+5x30" if hot else "0x30"),
            S("arka:redis_errors_total", m, "0+5x30" if hot else "0x30"),
        ]
        for le in ("0.1", "1", "10", "+Inf"):
            fast = le != "0.1" and le != "1"
            series.append(S("arka:time_to_first_token_seconds_bucket", {**m, "le": le},
                            ("0+10x30" if fast else "0x30") if hot else "0+10x30"))
    for s in series:
        u = unknown(s["series"])
        if u: bad(f"alert test series uses unexported {u}")
    exp = {
        "ArkaQueueHigh": [{"severity": "warning", "model_name": "hot"}],
        "ArkaKVCacheNearlyFull": [{"severity": "warning", "model_name": "hot"}],
        "ArkaHighErrorRate": [{"severity": "critical", "model_name": "hot"}],
        "ArkaExecutorRestarts": [{"severity": "critical", "model_name": "hot", "executor": "0"}],
        "ArkaTTFTHigh": [{"severity": "warning", "model_name": "hot"}],
        "ArkaQuotaStoreDegraded": [{"severity": "warning", "model_name": "hot"}],
    }
    tests = [{"interval": "1m", "input_series": series,
              "alert_rule_test": [{"eval_time": "25m", "alertname": a, "exp_alerts": [{"exp_labels": l} for l in exp.get(a, [])]}
                                  for a in names] +
                                 # before the `for` durations have passed nothing fires
                                 [{"eval_time": "3m", "alertname": a, "exp_alerts": []}
                                  for a in ("ArkaQueueHigh", "ArkaKVCacheNearlyFull", "ArkaTTFTHigh")]}]
    with open(os.path.join(tmp, "alerts_test.yml"), "w") as f:
        yaml.safe_dump({"rule_files": [os.path.join(tmp, "alerts_bare.yml")], "evaluation_interval": "1m",
                        "tests": tests}, f)

    # compose: the services, and the mounts that provision Grafana and Prometheus exist.
    compose = yaml.safe_load(open(os.path.join(root, "docker/compose.yml")))
    sv = compose.get("services", {})
    for s in ("gateway", "gateway-cuda", "redis", "prometheus", "grafana"):
        if s in sv: ok()
        else: bad(f"compose.yml: no service {s}")
    for s in ("prometheus", "grafana"):
        for v in sv.get(s, {}).get("volumes", []):
            src = v.split(":")[0]
            if src.startswith("."):
                if os.path.exists(os.path.normpath(os.path.join(root, "docker", src))): ok()
                else: bad(f"compose.yml: {s} mounts {src}, which does not exist")
    devs = sv.get("gateway-cuda", {}).get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    if any("gpu" in d.get("capabilities", []) for d in devs) and sv.get("gateway-cuda", {}).get("profiles") == ["cuda"]: ok()
    else: bad("compose.yml: gateway-cuda has no GPU reservation or is not in the cuda profile")

    # k8s: GPU resources, the HPA's custom metric is an exported one.
    kinds = {}
    for f in ("configmap.yaml", "deployment.yaml", "service.yaml", "hpa.yaml"):
        for d in yaml.safe_load_all(open(os.path.join(root, "docker/k8s", f))):
            if d: kinds[d["kind"]] = d
    if set(kinds) >= {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"}: ok()
    else: bad(f"k8s: kinds {sorted(kinds)}")
    c = kinds.get("Deployment", {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]
    if str(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")) == "1": ok()
    else: bad("k8s deployment: no nvidia.com/gpu limit")
    if "arka.conf" in kinds.get("ConfigMap", {}).get("data", {}): ok()
    else: bad("k8s configmap: no arka.conf")
    for mt in kinds.get("HorizontalPodAutoscaler", {}).get("spec", {}).get("metrics", []):
        n = (mt.get("pods") or mt.get("external") or mt.get("object") or {}).get("metric", {}).get("name", "")
        if n.startswith("arka_") and "arka:" + n[5:] in exported and n == "arka_num_requests_waiting": ok()
        else: bad(f"k8s hpa: metric {n} is not arka_num_requests_waiting (adapter name of an exported metric)")

for m in fails: print("FAIL: " + m)
print(f"OK {oks[0]}")
EOF
"$PY" "$TMP/check.py" "$ROOT" "$TMP" "$TMP/names" >"$TMP/py.out" 2>&1
rc=$?
grep -v '^OK ' "$TMP/py.out"
npy=$(awk '/^OK /{print $2}' "$TMP/py.out")
nfail=$(grep -c '^FAIL: ' "$TMP/py.out")
[ $rc -eq 0 ] && [ -n "$npy" ] || bad "check.py exited $rc"
pass=$((pass + ${npy:-0}))
fail=$((fail + nfail))

# Dockerfiles: bases, build flags, and what they copy exists.
grep -q '^FROM debian:12 AS build' docker/Dockerfile.gateway && grep -q 'scripts/setup.sh' docker/Dockerfile.gateway &&
    grep -q 'CMD \["serve"\]' docker/Dockerfile.gateway && ok || bad "Dockerfile.gateway: base, setup.sh or serve missing"
grep -q '^FROM nvidia/cuda:.*-devel-.* AS build' docker/Dockerfile.executor-cuda &&
    grep -q '^FROM nvidia/cuda:.*-runtime-' docker/Dockerfile.executor-cuda &&
    grep -q 'ARG WITH_GATEWAY=OFF' docker/Dockerfile.executor-cuda &&
    grep -q -- '-DARKA_WITH_GATEWAY=${WITH_GATEWAY}' docker/Dockerfile.executor-cuda && ok ||
    bad "Dockerfile.executor-cuda: bases or the executor-only default missing"
for f in docker/Dockerfile.gateway docker/Dockerfile.executor-cuda; do
    for src in $(awk '$1 == "COPY" && $2 !~ /^--from/ && $2 != "." {print $2}' "$f"); do
        [ -e "$src" ] && ok || bad "$f copies $src, which does not exist"
    done
done

if command -v promtool >/dev/null 2>&1; then
    promtool check config dashboards/prometheus/prometheus.yml >"$TMP/o" 2>&1 && ok ||
        bad "promtool check config: $(cat "$TMP/o")"
    promtool check rules dashboards/prometheus/alerts.yml >"$TMP/o" 2>&1 && ok ||
        bad "promtool check rules alerts.yml: $(cat "$TMP/o")"
    promtool check rules "$TMP/dash_rules.json" >"$TMP/o" 2>&1 && ok ||
        bad "dashboard queries are not valid PromQL: $(cat "$TMP/o")"
    if [ -f "$TMP/alerts_test.yml" ]; then
        promtool test rules "$TMP/alerts_test.yml" >"$TMP/o" 2>&1 && ok ||
            bad "promtool test rules (alerts on synthetic series): $(cat "$TMP/o")"
    fi
else
    echo "note: promtool not on PATH (Debian package prometheus): config, rules and PromQL not checked"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
