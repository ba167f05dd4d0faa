#!/usr/bin/env bash
# Builds the images of docker/ with podman, tagged as the chart expects (<registry>/autorl/<name>:
# <appVersion>, registry from charts/autorl/values.yaml), and prints their sizes. `make images` runs it.
# No image ships `autorl run` (services/local-run, the single-machine mode): the cluster runs
# experiments with the controller, each service in its own image.
#
#   GPU=1 (default)  every tag the chart's default values name: the gpu evaluator (OpenCompass, and vLLM
#                    in /opt/vllm) and the agent runner with PyPI's CUDA torch, tagged <appVersion>
#   GPU=0            the CPU variants instead, tagged <appVersion>-cpu (what the container tests run;
#                    the chart selects them with agents.image.tag and evaluator.image.tag)
#   REGISTRY=HOST    tag for another registry (default: the chart's image.registry)
#   BASE_IMAGE=IMG   the Python 3.11 base of every image (default python:3.11-slim; where it cannot be
#                    pulled, a Debian bookworm minbase made here with debootstrap)
#   BUILD_CA_BUNDLE  a CA bundle for HTTPS through a proxy, mounted into the build, never stored
#   PIP_CACHE_DIR    the pip cache mounted into the builds (default /var/tmp/autorl-pip-cache)
#   PARALLEL=0       one image after another (default 1: those that depend on no other side by side)
#   --list           print each image it would build (tag, Dockerfile, build arguments) and build nothing
# The host's pip configuration (find-links, extra index URLs, cert) is mounted read-only into the
# builds, so locally available wheels are used; nothing of it is saved in an image layer.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/docker/containers.conf}"

GPU="${GPU:-1}"
case "$GPU" in 0|1) ;; *) echo "make images: GPU must be 0 or 1, not '$GPU'" >&2; exit 2;; esac
PARALLEL="${PARALLEL:-1}"
case "$PARALLEL" in 0|1) ;; *) echo "make images: PARALLEL must be 0 or 1, not '$PARALLEL'" >&2; exit 2;; esac
LIST=0
case "${1:-}" in
  "") ;;
  --list) LIST=1 ;;
  *) echo "make images: unknown argument '$1' (--list prints the plan)" >&2; exit 2;;
esac
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/autorl/Chart.yaml)
REGISTRY="${REGISTRY:-$(sed -n 's/^  registry: *\([^ #]*\).*$/\1/p' charts/autorl/values.yaml | head -1)}"
REPO="$REGISTRY/autorl"
TORCH_INDEX_URL="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
WORK="$PWD/build/images"
mkdir -p "$WORK"

die() { echo "make images: $*" >&2; exit 1; }

# 1. Tools: podman (buildah's engine), runc, debootstrap.
install_tools() {
  missing=""
  for tool in podman:podman buildah:buildah runc:runc debootstrap:debootstrap; do
    command -v "${tool%%:*}" >/dev/null || [ -x "/usr/sbin/${tool%%:*}" ] || missing="$missing ${tool##*:}"
  done
  if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null; }
    else
      die "needs:$missing (sudo apt-get install$missing)"
    fi
  fi
}

# 2. The host's pip sources, mounted read-only into every build as /etc/pip.conf.
pip_sources() {
  volumes=(-v "${PIP_CACHE_DIR:-/var/tmp/autorl-pip-cache}:/root/.cache/pip")
  mkdir -p "${PIP_CACHE_DIR:-/var/tmp/autorl-pip-cache}"
  pip_get() { python3 -m pip config list 2>/dev/null | sed -n "s/^[^ ]*\.$1='\(.*\)'$/\1/p" | tail -1; }
  find_links=$(pip_get find-links); extra_index=$(pip_get extra-index-url); index=$(pip_get index-url)
  cert="${BUILD_CA_BUNDLE:-$(pip_get cert)}"
  {
    echo "[global]"
    for dir in $find_links; do [ -d "$dir" ] && volumes+=(-v "$dir:$dir:ro"); done
    [ -n "$find_links" ] && echo "find-links = $find_links"
    for url in $index $extra_index; do
      # A local index's pages link to files beside it: its parent folder is mounted.
      case "$url" in file://*) root=$(dirname "${url#file://}"); [ -d "$root" ] && volumes+=(-v "$root:$root:ro");; esac
    done
    [ -n "$index" ] && echo "index-url = $index"
    [ -n "$extra_index" ] && echo "extra-index-url = $extra_index"
    if [ -n "$cert" ]; then
      [ -f "$cert" ] || die "BUILD_CA_BUNDLE/pip cert $cert is not a file"
      volumes+=(-v "$cert:/run/autorl-build/ca.crt:ro")
      echo "cert = /run/autorl-build/ca.crt"
    fi
  } > "$WORK/pip.conf"
  volumes+=(-v "$WORK/pip.conf:/etc/pip.conf:ro")
  if [ -n "$TORCH_INDEX_URL" ] && ! python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=10)" "$TORCH_INDEX_URL/torch/" 2>/dev/null; then
    echo "make images: $TORCH_INDEX_URL is unreachable; torch comes from the pip sources configured here"
    TORCH_INDEX_URL=""
  fi
}

# 3. The base image of every image (the gpu evaluator's too): BASE_IMAGE, else python:3.11-slim, else
# a Debian bookworm minbase (Python 3.11) made with debootstrap.
BASE_IMAGE="${BASE_IMAGE:-}"
base_image() {
  if [ -n "$BASE_IMAGE" ]; then return; fi
  BASE_IMAGE=docker.io/library/python:3.11-slim
  if [ "$LIST" = 1 ]; then return; fi
  if ! podman image exists "$BASE_IMAGE" && ! timeout 120 podman pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    BASE_IMAGE=localhost/autorl/python:3.11-bookworm
    if ! podman image exists "$BASE_IMAGE"; then
      [ "$(id -u)" = 0 ] || die "no registry for python:3.11-slim; building the base with debootstrap needs root (or set BASE_IMAGE)"
      echo "make images: python:3.11-slim cannot be pulled; building $BASE_IMAGE with debootstrap"
      rootfs=$(mktemp -d /var/tmp/autorl-base.XXXXXX)
      debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" \
        "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$WORK/debootstrap.log" 2>&1 \
        || { rm -rf "$rootfs"; die "debootstrap failed: $WORK/debootstrap.log"; }
      rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
      tar -C "$rootfs" -c . | podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
      rm -rf "$rootfs"
    fi
  fi
}

if [ "$LIST" = 0 ]; then install_tools; pip_sources; fi
base_image

# 4. The images. Those that depend on no other are built at the same time (each build spends most of
# its time in one pip process or in committing a layer: on two cores, side by side halves the wait);
# each build's output goes to build/images/<name>.log, shown when it fails. Dockerfiles built side by
# side never begin a stage with the same step: two builds that make the same layer at once keep a copy
# each, and the next build, continuing from one, misses the other image's cached dependencies.
build() {  # TAG DOCKERFILE [--build-arg ...]
  local tag=$1 file=$2; shift 2
  if [ "$LIST" = 1 ]; then echo "$tag $file $*"; return; fi
  local name=${tag##*/}; name=${name%%:*}
  local start=$SECONDS
  if podman build --network host --layers "${volumes[@]}" -f "$file" -t "$tag" "$@" . >"$WORK/$name.log" 2>&1; then
    echo "== $tag ($file) built in $((SECONDS - start)) s"
  else
    tail -n 30 "$WORK/$name.log" >&2
    echo "make images: building $tag failed (podman build -f $file; its log: $WORK/$name.log)" >&2
    return 1
  fi
}
if [ "$GPU" = 1 ]; then torch_tag="$APP_VERSION"; torch_index=""; else torch_tag="$APP_VERSION-cpu"; torch_index="$TORCH_INDEX_URL"; fi
agent_images() {  # the example custom agent is built on the agent runner's image
  build "$REPO/agent-runner:$torch_tag" docker/agent-runner.Dockerfile \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_INDEX_URL="$torch_index" \
  && build "$REPO/example-custom-agent:$APP_VERSION" docker/example-custom-agent.Dockerfile \
    --build-arg AGENT_RUNNER_IMAGE="$REPO/agent-runner:$torch_tag"
}
evaluator_image() {  # both variants: OpenCompass with the CPU torch; gpu adds vLLM in an environment of its own
  local variant=gpu tag="$APP_VERSION"
  if [ "$GPU" = 0 ]; then variant=cpu; tag="$APP_VERSION-cpu"; fi
  build "$REPO/evaluator-worker:$tag" docker/evaluator-worker.Dockerfile \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg VARIANT="$variant" --build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL"
}
service_images() {
  build "$REPO/grader:$APP_VERSION" docker/grader.Dockerfile --build-arg BASE_IMAGE="$BASE_IMAGE" \
  && build "$REPO/controller:$APP_VERSION" docker/controller.Dockerfile --build-arg BASE_IMAGE="$BASE_IMAGE"
}
if [ "$LIST" = 1 ]; then
  service_images; agent_images; evaluator_image
elif [ "$PARALLEL" = 0 ]; then
  service_images && agent_images && evaluator_image || die "an image failed to build (its log is named above)"
else
  echo "make images: building side by side (logs in $WORK/)"
  pids=()
  for group in service_images agent_images evaluator_image; do "$group" & pids+=($!); done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ] || die "an image failed to build (its log is named above)"
fi

[ "$LIST" = 1 ] && exit 0
podman images --filter "reference=$REPO/*" --format '{{.Repository}}:{{.Tag}}  {{.Size}}'
if [ "$GPU" = 0 ]; then
  echo "make images: CPU variants; install the chart with --set agents.image.tag=$APP_VERSION-cpu --set evaluator.image.tag=$APP_VERSION-cpu (make images GPU=1 builds the chart's default tags)"
fi
