# Shared by .ci/foreign-arch and .ci/sid-root / .ci/sid-suite: a Debian root made with
# debootstrap, and running commands in it. Sourced (not run); the caller sets -euo
# pipefail and cds to the repository.
#
#   root_tools [packages...]      debootstrap (and these) installed with apt-get if missing
#   root_mirror                   MIRROR, if unset: the Debian archive apt uses here
#   root_make ROOT SUITE PACKAGES [debootstrap options...]
#                                 a minbase root, once (a marker says it is complete)
#   root_enter ROOT               resolv.conf, /etc/hosts, /proc and /dev/pts (unmounted
#                                 by the last run to leave),
#                                 this machine's CA bundle as ROOT/work/ca-bundle.crt
#   inside ROOT CMD               CMD under /bin/sh in the root, with root_env (its PATH
#                                 starts with ROOT_VENV/bin, default /work/venv/bin)

start=${start:-$SECONDS}
step() { printf '\n=== %s (%ds)\n' "$*" "$((SECONDS - start))"; }
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

# The command, and once more if it fails (a network step).
retry() { "$@" || { echo "retrying once: $*" >&2; sleep 5; "$@"; }; }

root_tools() {
    local missing=0 tool
    command -v debootstrap >/dev/null || missing=1
    for tool in "$@"; do dpkg -s "$tool" >/dev/null 2>&1 || missing=1; done
    if [ "$missing" = 1 ]; then
        retry $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive retry $sudo apt-get install -y -qq debootstrap "$@" >/dev/null
    fi
}

root_mirror() {
    if [ -z "${MIRROR:-}" ]; then
        # The first Debian archive apt is configured with (deb822 or one-line format).
        MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            /etc/apt/sources.list.d/*.sources 2>/dev/null \
            | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n1 | tr -d ' ' || true)
        MIRROR=${MIRROR:-http://deb.debian.org/debian}
    fi
}

root_debootstrap() {  # ROOT SUITE PACKAGES [options...]: one attempt, from nothing
    local root=$1 suite=$2 packages=$3
    shift 3
    $sudo rm -rf "$root"
    $sudo mkdir -p "$root"
    $sudo debootstrap --variant=minbase --include="$packages" "$@" \
        "$suite" "$root" "$MIRROR" >"$root.debootstrap.log" 2>&1
}

root_make() {  # ROOT SUITE PACKAGES [debootstrap options...]
    local root=$1 suite=$2
    if [ -e "$root/.sepp-lite-root" ]; then return 0; fi
    root_mirror
    step "a Debian $suite root in $root from $MIRROR (a few minutes, once)"
    if ! retry root_debootstrap "$@"; then
        tail -n 20 "$root.debootstrap.log" >&2
        echo "FAIL: debootstrap of $suite from $MIRROR (log: $root.debootstrap.log)" >&2
        exit 1
    fi
    $sudo touch "$root/.sepp-lite-root"
}

root_enter() {  # ROOT
    local root=$1
    $sudo mkdir -p "$root/work"
    # Where this machine reaches the package index through a TLS-inspecting proxy, the
    # root needs this machine's CA bundle too.
    local bundle=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
    if [ -f "$bundle" ]; then $sudo cp "$bundle" "$root/work/ca-bundle.crt"; fi
    $sudo cp /etc/resolv.conf "$root/etc/resolv.conf"
    # debootstrap writes no /etc/hosts, and the TLS tests connect to "localhost".
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
        | $sudo tee "$root/etc/hosts" >/dev/null
    # /proc, mounted by the first run in the root and unmounted by the last one to
    # leave (runs on several interpreters may share a root at once).
    ROOT_USER=$root/.users/$$
    trap root_leave EXIT
    $sudo mkdir -p "$root/.users"
    $sudo touch "$ROOT_USER"
    if ! mountpoint -q "$root/proc"; then $sudo mount -t proc proc "$root/proc"; fi
    # Terminals (a test runs the CLI on a pseudo-terminal): this machine's.
    if ! mountpoint -q "$root/dev/pts"; then $sudo mount --bind /dev/pts "$root/dev/pts"; fi
    # A clean environment in the root: none of this machine's pip settings, its CA
    # bundle and proxy if it has them.
    root_env=(PATH=${ROOT_VENV:-/work/venv}/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8
              PIP_DISABLE_PIP_VERSION_CHECK=1)
    if [ -f "$root/work/ca-bundle.crt" ]; then root_env+=(PIP_CERT=/work/ca-bundle.crt); fi
    local name
    for name in HTTPS_PROXY https_proxy HTTP_PROXY http_proxy NO_PROXY no_proxy; do
        if [ -n "${!name:-}" ]; then root_env+=("$name=${!name}"); fi
    done
}

root_leave() {
    if [ -z "${ROOT_USER:-}" ]; then return 0; fi
    local users=${ROOT_USER%/*} pid
    $sudo rm -f "$ROOT_USER"
    ROOT_USER=""
    for pid in $(ls "$users"); do  # forget runs that ended without leaving
        kill -0 "$pid" 2>/dev/null || $sudo rm -f "$users/$pid"
    done
    if [ -z "$(ls "$users")" ]; then
        $sudo umount "${users%/.users}/dev/pts" || true
        $sudo umount "${users%/.users}/proc" || true
    fi
}

inside() {  # ROOT CMD
    $sudo chroot "$1" /usr/bin/env -i "${root_env[@]}" /bin/sh -c "$2"
}
