#!/usr/bin/env bash
# make image-test: build docker/Dockerfile for real and smoke-test `paratrain serve` inside it,
# on a machine without Docker or a registry: Debian's mmdebstrap makes the base file system,
# buildah builds (chroot isolation: no daemon, no namespaces needed) and runs the image.
#   1. mmdebstrap bookworm -> localhost/paratrain-debian:test
#   2. docker/test-base.Dockerfile: a venv with the CPU build of torch -> localhost/paratrain-base:test
#   3. docker/Dockerfile on that base -> localhost/paratrain:test
#   4. in the image, as its user: serve on loopback ports; Jupyter 403 without the token and 200
#      with it; ssh with the key runs `paratrain doctor --json`; root and password logins are
#      refused; SIGTERM to serve stops both servers.
# Needs root and: apt-get install mmdebstrap buildah podman openssh-client curl. TORCH_WHEEL: a CPU torch
# wheel for Debian's Python 3.11 (default: `pip download torch==2.13.0` into the work dir).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-$(mktemp -d /tmp/paratrain-image-test.XXXXXX)}
JPORT=${JPORT:-18931}
SPORT=${SPORT:-12931}
start=$(date +%s)
step() { echo "image-test: [$(($(date +%s) - start)) s] $*"; }

step "base file system (mmdebstrap bookworm)"
[ -f "$WORK/debian.tar" ] || mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,ca-certificates bookworm "$WORK/debian.tar" \
    http://deb.debian.org/debian
podman import --quiet "$WORK/debian.tar" localhost/paratrain-debian:test >/dev/null

step "test base: venv + CPU torch"
mkdir -p "$WORK/ctx"
cp /etc/ssl/certs/ca-certificates.crt "$WORK/ctx/"
if [ -z "${TORCH_WHEEL:-}" ]; then
    pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
        --dest "$WORK/ctx" "torch==2.13.0"
    TORCH_WHEEL=$(basename "$(ls "$WORK"/ctx/torch-*.whl | head -1)")
else
    cp "$TORCH_WHEEL" "$WORK/ctx/" && TORCH_WHEEL=$(basename "$TORCH_WHEEL")
fi
buildah bud --quiet --isolation chroot -f docker/test-base.Dockerfile \
    --build-arg TORCH_WHEEL="$TORCH_WHEEL" -t localhost/paratrain-base:test "$WORK/ctx" >/dev/null

step "the image (docker/Dockerfile)"
buildah bud --quiet --isolation chroot --format docker -f docker/Dockerfile \
    --build-arg BASE_IMAGE=localhost/paratrain-base:test -t localhost/paratrain:test . >/dev/null

buildah inspect --format '{{.Docker.Config.Healthcheck.Test}}' localhost/paratrain:test \
    | grep -q "paratrain doctor --quick --json" || { echo "image-test: no doctor healthcheck"; exit 1; }
buildah inspect --format '{{.Docker.Config.User}}' localhost/paratrain:test | grep -qx paratrain \
    || { echo "image-test: the image does not run as its user"; exit 1; }

step "smoke test inside the image"
rm -f "$WORK/id" "$WORK/id.pub"
ssh-keygen -q -t ed25519 -N "" -f "$WORK/id"
box=$(buildah from localhost/paratrain:test)
cleanup() {
    pkill -TERM -f "paratrain serve --bind 127.0.0.1 --jupyter-port $JPORT" 2>/dev/null || true
    buildah rm "$box" >/dev/null 2>&1 || true
}
trap cleanup EXIT
buildah run --isolation chroot --user paratrain --env HOME=/home/paratrain \
    --env "SSH_AUTHORIZED_KEYS=$(cat "$WORK/id.pub")" "$box" -- \
    paratrain serve --bind 127.0.0.1 --jupyter-port "$JPORT" --ssh-port "$SPORT" \
    >"$WORK/serve.log" 2>&1 &
for _ in $(seq 120); do
    code=$(curl -s -o /dev/null -w "%{http_code}" "http://127.0.0.1:$JPORT/api/status" || true)
    [ "$code" = 403 ] && grep -q "Server listening" "$WORK/serve.log" && break
    sleep 0.5
done
fail() { echo "image-test: FAILED: $*"; cat "$WORK/serve.log"; exit 1; }
[ "$code" = 403 ] || fail "Jupyter without the token answered $code, not 403"
token=$(grep -o "token=[A-Za-z0-9_-]*" "$WORK/serve.log" | head -1 | cut -d= -f2)
code=$(curl -s -o /dev/null -w "%{http_code}" -H "Authorization: token $token" \
    "http://127.0.0.1:$JPORT/api/status")
[ "$code" = 200 ] || fail "Jupyter with the token answered $code, not 200"
ssh_opts=(-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10
          -o LogLevel=ERROR -p "$SPORT")
ssh "${ssh_opts[@]}" -o BatchMode=yes -i "$WORK/id" paratrain@127.0.0.1 \
    paratrain doctor --json --quick | python3 -c \
    "import json, sys; r = json.load(sys.stdin); print('image-test: doctor in the image: python', r['facts']['python'])" \
    || fail "ssh with the key did not run paratrain doctor --json"
if ssh "${ssh_opts[@]}" -o BatchMode=yes -i "$WORK/id" root@127.0.0.1 true 2>/dev/null; then
    fail "root logged in"
fi
if ssh "${ssh_opts[@]}" -o PubkeyAuthentication=no -o NumberOfPasswordPrompts=1 \
    -o PreferredAuthentications=password,keyboard-interactive paratrain@127.0.0.1 true \
    </dev/null 2>/dev/null; then
    fail "a password login got in"
fi
pkill -TERM -f "^/opt/venv/bin/python3 /opt/venv/bin/paratrain serve --bind 127.0.0.1 --jupyter-port $JPORT"
for _ in $(seq 40); do
    pgrep -f "ServerApp.port=$JPORT" >/dev/null || pgrep -f "sshd -D -e -f /home/paratrain" >/dev/null \
        || break
    sleep 0.5
done
grep -q "SIGTERM: stopping jupyter, sshd" "$WORK/serve.log" || fail "serve did not stop on SIGTERM"
if pgrep -f "ServerApp.port=$JPORT" >/dev/null; then fail "Jupyter outlived SIGTERM"; fi
step "passed: Jupyter 403/200, ssh key login ran doctor, root and password refused, SIGTERM stopped both"
