#!/usr/bin/env bash
# slotscope set-up and entry points for a fresh Debian/Ubuntu machine.
#   sudo ./dev.sh demo   # install what is missing, then run the main job on the embedded default
#   sudo ./dev.sh test   # install what is missing, then run every test tier (unit, live, vm)
#   ./dev.sh setup       # only install (idempotent; quick when already done)
# Anything after the command is passed on (e.g. `./dev.sh test -m unit`).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv="$here/.venv"
say() { echo "dev.sh: $*" >&2; }

need_root() { [ "$(id -u)" = 0 ] || { say "this step needs root (apt, kernel headers): run it with sudo"; exit 1; }; }

apt_packages() {
    # Debian calls BCC python3-bpfcc; Ubuntu too. qemu/debootstrap serve the VM rig, tmux the TUI test,
    # chromium-headless-shell the screenshot test of the HTML report, prometheus the test scraping watch --metrics,
    # systemd's systemd-analyze the check of deploy/'s unit.
    local want=(python3-bpfcc bpfcc-tools python3-venv qemu-system-x86 debootstrap tmux busybox-static cpio
                chromium-headless-shell prometheus systemd)
    local missing=()
    for p in "${want[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    need_root
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

kernel_headers() {
    # BCC compiles against /lib/modules/$(uname -r)/build. Prefer the distribution's headers for the
    # running kernel; where it has none (custom kernels), link Debian's generic headers: syscall and
    # sched tracepoint programs do not depend on struct layouts, so they compile and run correctly.
    local mod="/lib/modules/$(uname -r)"
    [ -e "$mod/build/include" ] && return 0
    need_root
    if apt-get install -y -qq "linux-headers-$(uname -r)" >/dev/null 2>&1; then return 0; fi
    dpkg-query -W -f='${Status}' linux-headers-amd64 2>/dev/null | grep -q "ok installed" \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-headers-amd64 >/dev/null
    local arch common
    arch=$(ls -d /usr/src/linux-headers-*-amd64 | sort -V | tail -1)
    common=${arch%-amd64}-common
    say "no headers for kernel $(uname -r) in the distribution: linking $(basename "$arch") (fine for header-independent tracepoint programs)"
    mkdir -p "$mod"
    ln -sfn "$arch" "$mod/build"
    ln -sfn "$common" "$mod/source"
}

python_env() {
    local py stamp
    py=$(command -v python3)
    stamp="$venv/.slotscope-stamp"
    local want
    want=$(cat "$here/pyproject.toml" | sha256sum | cut -c1-16)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import bcc, slotscope.agent" 2>/dev/null; then
        return 0
    fi
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    # The distribution's bcc is pure Python over libbcc: make it importable from the venv.
    local bccdir site
    bccdir=$(/usr/bin/python3 -c 'import bcc, os; print(os.path.dirname(bcc.__file__))')
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    ln -sfn "$bccdir" "$site/bcc"
    say "installing slotscope and its Python dependencies into $venv"
    local log="$venv/setup.log"
    if ! { "$venv/bin/pip" install --upgrade pip && "$venv/bin/pip" install -e "$here[test]"; } >"$log" 2>&1; then
        tail -20 "$log" >&2
        say "pip failed (full log: $log)"
        exit 1
    fi
    # The real checkpoint clients of the live tests (torch's CPU build: a CUDA build is 5.5 GB).
    # Optional: where pip finds no CPU build, those tests skip and say why.
    if ! "$venv/bin/pip" install -e "$here[clients]" >>"$log" 2>&1; then
        say "no CPU build of torch here (see $log): the live tests of real checkpoint clients will skip"
    fi
    echo "$want" > "$stamp"
}

setup() { apt_packages; kernel_headers; python_env; }

cmd=${1:-}; shift || true
case "$cmd" in
    setup) setup ;;
    demo) setup; exec "$venv/bin/slotscope" demo "$@" ;;
    test)
        setup
        cd "$here"
        rc=0; "$venv/bin/python" -m pytest "$@" || rc=$?
        # pytest's 5 means "no tests ran": never a pass.
        [ "$rc" = 5 ] && { say "no tests ran"; exit 1; }
        exit "$rc" ;;
    *) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
