"""Build and cache the VM images: a Debian root with stock kernels, NFS, BCC, and a
venv with the project's dependencies. A kernel whose headers need a newer toolchain
than the bookworm root has (7.3's: trixie's gcc-14, libelf1t64) lives in a root of its
own release (ROOTS); each root is an image of its own.

A cache entry lives under CACHE_ROOT/<key>, where the key hashes every input of the
build (the root's name, this file, the boot files baked into the image, the project's
declared dependencies), so changing any of them builds a new entry. The project itself
is not in the image: each VM run installs it from a 9p share.
"""

import fcntl
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

VM_DIR = Path(__file__).resolve().parent.parent
REPO = VM_DIR.parent.parent
BOOTFILES = VM_DIR / "bootfiles"
CACHE_ROOT = Path(os.environ.get("SLOTSCOPE_VM_CACHE", "/var/cache/slotscope/vm"))
KEEP_ENTRIES = 3  # finished images kept; each is ~2.5 GB (1 GB of it torch)

VENV = "/opt/slotscope-venv"
PACKAGES = [
    "nfs-kernel-server", "nfs-common", "rpcbind", "python3", "python3-venv",
    "python3-bpfcc", "bpfcc-tools", "iproute2", "kmod", "procps", "util-linux",
    "ca-certificates", "busybox-static",
]


@dataclass(frozen=True)
class Root:
    """One image: a Debian release's root filesystem and the kernels booted on it, each
    kernel name -> the suite whose linux-image-amd64 metapackage picks its ABI. A suite
    of another release (bullseye-security in bookworm) is pinned low: only what nothing
    of the root's own release provides comes from it (5.10's headers want bullseye's
    gcc-10 package)."""
    release: str
    python: str                 # its python3's version, for the CPU torch wheel
    kernels: dict


ROOTS = {
    # 5.10's headers exist in bullseye-security, 6.1's only in bookworm-security; 6.12 comes
    # from bookworm-backports.
    "bookworm": Root("bookworm", "3.11", {"5.10": "bullseye-security", "6.1": "bookworm-security",
                                          "6.12": "bookworm-backports"}),
    # 7.3's headers depend on trixie's gcc-14, libelf1t64 and libssl3t64, which replace
    # bookworm's libraries: a root of trixie's own.
    "trixie": Root("trixie", "3.13", {"7.3": "trixie-backports"}),
}
KERNELS = {kernel: name for name, root in ROOTS.items() for kernel in root.kernels}   # kernel -> its root
# Modules the initramfs needs to reach the root disk (modprobe adds their dependencies).
INITRD_MODULES = ["virtio_pci", "virtio_blk", "ext4"]
# ext4's crc32c, a soft dependency that modprobe does not follow, up to 6.x; 7.x has no
# crc32c_generic (its ext4 pulls crc32c-cryptoapi in itself): named where the kernel has it.
INITRD_SOFT_MODULES = ["crc32c_generic"]
FREE_SPACE = 3 << 30  # room in the root filesystem for exported files and captures


class BuildError(RuntimeError):
    pass


@dataclass
class Image:
    """A finished cache entry."""
    path: Path

    @property
    def manifest(self):
        return json.loads((self.path / "manifest.json").read_text())

    def kernel(self, name):
        k = self.manifest["kernels"].get(name)
        if k is None:
            raise BuildError(f"kernel {name!r} is not in image {self.path} "
                             f"(has: {', '.join(self.manifest['kernels'])})")
        return self.path / k["vmlinuz"], self.path / k["initrd"]

    @property
    def rootfs(self):
        return self.path / "rootfs.img"


def project_dependencies(extra="test"):
    """The dependencies the venv needs, as declared in pyproject.toml; with extra="clients",
    the real checkpoint clients' (tests/vm/guest/clients.py) alone."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = meta.get("optional-dependencies", {})
    if extra == "clients":
        return sorted(extras.get("clients", []))
    return sorted(meta.get("dependencies", []) + extras.get(extra, []))


def cache_key(root):
    h = hashlib.sha256(root.encode() + b"\0")
    for f in [Path(__file__), *sorted(BOOTFILES.iterdir())]:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(json.dumps([project_dependencies(), project_dependencies("clients")]).encode())
    return h.hexdigest()[:16]


def log(msg):
    print(f"[vm-image] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    """Run a command; on failure raise with the tail of its output."""
    p = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if p.returncode != 0:
        tail = "\n".join(p.stdout.splitlines()[-25:])
        raise BuildError(f"command failed ({p.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return p.stdout


class Chroot:
    """Commands in the root filesystem being built, with /proc mounted and a clean
    environment (the host's pip and apt settings must not leak in)."""
    ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "DEBIAN_FRONTEND": "noninteractive"}

    def __init__(self, root):
        self.root = root

    def __enter__(self):
        run(["mount", "-t", "proc", "proc", self.root / "proc"])
        return self

    def __exit__(self, *exc):
        subprocess.run(["umount", "-l", self.root / "proc"], check=False)

    def __call__(self, *cmd):
        return run(["chroot", self.root, *cmd], env=self.ENV)


def apt_sources():
    """The mirror and security mirror this host's apt uses (the only reachable ones)."""
    mirror, security = "http://deb.debian.org/debian", None
    src = Path("/etc/apt/sources.list.d/debian.sources")
    if src.exists():
        for stanza in src.read_text().split("\n\n"):
            fields = dict(line.split(":", 1) for line in stanza.splitlines()
                          if ":" in line and not line.startswith("#"))
            uri = fields.get("URIs", "").split()[0] if fields.get("URIs") else None
            if uri and "-security" in fields.get("Suites", ""):
                security = uri
            elif uri:
                mirror = uri
    return mirror.rstrip("/"), (security or mirror + "-security").rstrip("/")


def umount_under(path):
    """Lazily unmount anything left mounted below path (a killed earlier build)."""
    prefix = str(path) + "/"
    for line in reversed(Path("/proc/mounts").read_text().splitlines()):
        target = line.split()[1]
        if target.startswith(prefix):
            subprocess.run(["umount", "-l", target], check=False)


def remove_tree(path):
    umount_under(path)
    shutil.rmtree(path, ignore_errors=True)


class Steps:
    """Times each build step and prints it."""
    def __init__(self):
        self.times = {}

    def __call__(self, name, fn, *args):
        log(f"{name} ...")
        t0 = time.monotonic()
        out = fn(*args)
        self.times[name] = round(time.monotonic() - t0, 1)
        log(f"{name}: {self.times[name]} s")
        return out


def write_apt_sources(root, release, kernels):
    """The release's suites, and those of another release a kernel comes from, pinned below
    the release's own (apt_preferences: 100, as backports are)."""
    mirror, security = apt_sources()
    releases = [release, *sorted({suite.split("-")[0] for suite in kernels.values()} - {release})]
    lines = []
    for r in releases:
        lines += [f"deb {mirror} {r} main", f"deb {mirror} {r}-updates main", f"deb {security} {r}-security main"]
    lines.append(f"deb {mirror} {release}-backports main")
    (root / "etc/apt/sources.list").write_text("\n".join(lines) + "\n")
    (root / "etc/apt/preferences.d/other-releases").write_text("".join(
        f"Package: *\nPin: release n={r}{suffix}\nPin-Priority: 100\n\n"
        for r in releases[1:] for suffix in ("", "-updates", "-security")))


def build(stage, name):
    """Build every artifact of root `name` into the directory stage; return the manifest."""
    spec = ROOTS[name]
    root = stage / "rootfs"
    mirror, _ = apt_sources()
    step = Steps()
    step("debootstrap", run, ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
                              spec.release, root, mirror])
    write_apt_sources(root, spec.release, spec.kernels)
    # pip in the chroot must trust the same CAs as the host (TLS is intercepted here).
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/ca-certificates.crt")
    kernels = {}
    with Chroot(root) as ch:
        step("apt-get update", ch, "apt-get", "update", "-q")
        # A kernel package would build an initramfs nobody uses (make_initrd makes ours).
        ch("dpkg-divert", "--local", "--rename", "--add", "/usr/sbin/update-initramfs")
        ch("ln", "-s", "/bin/true", "/usr/sbin/update-initramfs")
        for kernel, suite in spec.kernels.items():
            kernels[kernel] = step(f"kernel {kernel}", install_kernel, ch, stage, spec.release, suite)
        step("python venv", make_venv, ch)
        clients = step("checkpoint clients", install_clients, ch, spec.python)
        ch("apt-get", "clean")
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    shutil.copy(BOOTFILES / "vminit", root / "sbin/vminit")
    (root / "etc/hostname").write_text("vm\n")
    # as Debian's installer writes it: torchrun and gloo look their host name up, and an
    # unresolvable one costs a resolver timeout per lookup
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n127.0.1.1\tvm\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    for kernel, k in kernels.items():
        step(f"initramfs {kernel}", make_initrd, root, stage, kernel, k["abi"])
    step("ext4 image", make_rootfs_image, root, stage / "rootfs.img")
    remove_tree(root)
    return {"root": name, "release": spec.release, "kernels": kernels, "dependencies": project_dependencies(), "clients": clients,
            "step_seconds": step.times,
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def install_kernel(ch, stage, release, suite):
    """The kernel the suite's linux-image-amd64 points at, and its headers (BCC
    compiles against them)."""
    deps = ch("apt-cache", "-t", suite, "depends", "linux-image-amd64")
    abi = next((line.split("linux-image-", 1)[1].strip() for line in deps.splitlines()
                if "Depends: linux-image-" in line), None)
    if not abi:
        raise BuildError(f"cannot resolve linux-image-amd64 in {suite}:\n{deps}")
    # A suite of the root's own release is the target release: a backports kernel wants its
    # suite's newer linux-base, which backports (NotAutomatic) never give otherwise. Another
    # release's suite is not (its pin keeps it below the root's own packages).
    target = ["-t", suite] if suite.startswith(release) else []
    ch("apt-get", "install", "-y", "-q", "--no-install-recommends", *target, f"linux-image-{abi}",
       f"linux-headers-{abi}")
    vmlinuz = f"vmlinuz-{abi}"
    shutil.copy(ch.root / "boot" / vmlinuz, stage / vmlinuz)
    return {"abi": abi, "suite": suite, "vmlinuz": vmlinuz, "initrd": f"initrd-{abi}.img"}


def make_venv(ch):
    ch("python3", "-m", "venv", "--system-site-packages", VENV)  # system site: Debian's bcc
    # setuptools>=70 builds wheels without the separate "wheel" package, which
    # `pip install --no-build-isolation` of the project at each run relies on.
    ch(f"{VENV}/bin/pip", "install", "-q", "--disable-pip-version-check",
       "setuptools>=70", *project_dependencies())
    ch(f"{VENV}/bin/python", "-c", "import bcc, pyarrow, numpy, pyroute2, textual, pytest")


def install_clients(ch, python):
    """The real checkpoint clients (pyproject's `clients` extra) into the venv. The index's
    default torch is the CUDA build (5.5 GB with its nvidia wheels); the CPU build pinned there
    is one 192 MB wheel, which the host's pip finds (its settings say where) and the image's,
    run clean, does not: the host downloads it. -> their versions, or a one-line reason when
    there is no CPU build to be had (the image is still built; the client scenarios say why)."""
    torch, *others = sorted(project_dependencies("clients"), key=lambda req: not req.startswith("torch"))
    wheels = ch.root / "tmp/wheels"
    wheels.mkdir()
    p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", python, "--platform", "manylinux_2_28_x86_64",
                        "-d", wheels, torch], check=False, capture_output=True, text=True)
    found = sorted(wheels.glob("torch-*.whl"))
    if p.returncode != 0 or not found:
        reason = (p.stderr.strip().splitlines() or ["no wheel"])[-1]
        log(f"no CPU build of {torch} here, so no real checkpoint clients in the image: {reason}")
        return {"missing": f"{torch}: {reason}"}
    ch(f"{VENV}/bin/pip", "install", "-q", "--disable-pip-version-check", f"/tmp/wheels/{found[0].name}", *others)
    shutil.rmtree(wheels)
    out = ch(f"{VENV}/bin/python", "-c",
             "import torch, safetensors; print(torch.__version__, safetensors.__version__)")
    torch_version, st_version = out.split()
    return {"torch": torch_version, "safetensors": st_version}


# Compressed modules (Debian's kernels since 6.x: .ko.xz; others .ko.zst) -> the plain .ko.
DECOMPRESS = {".xz": lzma.decompress,
              ".zst": lambda data: run_bytes(["zstd", "-dc"], data)}


def run_bytes(cmd, data):
    p = subprocess.run(cmd, input=data, capture_output=True, check=False)
    if p.returncode != 0:
        raise BuildError(f"command failed ({p.returncode}): {' '.join(cmd)}: {p.stderr.decode(errors='replace')}")
    return p.stdout


def make_initrd(root, stage, name, abi):
    tree = stage / f"initrd-{name}"
    (tree / "bin").mkdir(parents=True)
    (tree / "mods").mkdir()
    shutil.copy(root / "bin/busybox", tree / "bin/busybox")  # busybox-static
    shutil.copy(BOOTFILES / "initrd-init", tree / "init")
    soft = [m for m in INITRD_SOFT_MODULES
            if subprocess.run(["chroot", root, "modinfo", "-k", abi, "-n", m], env=Chroot.ENV, capture_output=True,
                              check=False).returncode == 0]
    show = run(["chroot", root, "modprobe", "-S", abi, "--show-depends", "-a", *INITRD_MODULES, *soft],
               env=Chroot.ENV)
    order = []
    for line in show.splitlines():
        if not line.startswith("insmod "):
            continue  # "builtin ..." lines
        ko = Path(line.split()[1])
        data = (root / ko.relative_to("/")).read_bytes()
        if ko.suffix in DECOMPRESS:  # busybox insmod cannot decompress
            data, ko = DECOMPRESS[ko.suffix](data), ko.with_suffix("")
        if ko.name not in order:
            (tree / "mods" / ko.name).write_bytes(data)
            order.append(ko.name)
    (tree / "mods/order").write_text("\n".join(order) + "\n")
    img = stage / f"initrd-{abi}.img"
    run(["sh", "-c", f"cd '{tree}' && find . | cpio -o -H newc 2>/dev/null | gzip -1 > '{img}'"])
    shutil.rmtree(tree)


def make_rootfs_image(root, img):
    used = int(run(["du", "-sb", root]).split()[0])
    with open(img, "wb") as f:
        f.truncate(used + FREE_SPACE)  # sparse
    run(["mkfs.ext4", "-q", "-F", "-L", "vmroot", "-d", root, img])


def prune(keep, name):
    """Keep the KEEP_ENTRIES newest entries of root `name` (an entry from before ROOTS is a
    bookworm one)."""
    entries = sorted((p for p in CACHE_ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and _root_of(p) == name), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [e for e in entries if e != keep][KEEP_ENTRIES - 1:]:
        log(f"removing old image {old}")
        shutil.rmtree(old, ignore_errors=True)


def _root_of(entry):
    try:
        return json.loads((entry / "manifest.json").read_text()).get("root", "bookworm")
    except (OSError, ValueError):
        return None


def ensure_image(rebuild=False, kernel="6.1"):
    """Return the cached image that boots `kernel` for the current inputs, building it if
    needed. A lock serialises concurrent builds; a finished entry appears by an atomic rename."""
    if kernel not in KERNELS:
        raise BuildError(f"no image has kernel {kernel!r} (known: {', '.join(KERNELS)})")
    name = KERNELS[kernel]
    key = cache_key(name)
    final = CACHE_ROOT / key
    if final.is_dir() and not rebuild:
        return Image(final)
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir() and not rebuild:
            log(f"image {key} was built meanwhile")
            return Image(final)
        for stale in CACHE_ROOT.glob(".stage-*"):  # left by a killed build
            remove_tree(stale)
        stage = CACHE_ROOT / f".stage-{key}-{os.getpid()}"
        stage.mkdir()
        log(f"building image {key} ({name}) in {stage}")
        t0 = time.monotonic()
        try:
            manifest = build(stage, name)
            manifest["key"] = key
            manifest["build_seconds"] = round(time.monotonic() - t0, 1)
            (stage / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            if final.exists():  # --rebuild: the old entry goes away first
                shutil.rmtree(final)
            os.rename(stage, final)
        except BaseException:
            remove_tree(stage)
            raise
        log(f"image {key} built in {manifest['build_seconds']} s: {final}")
        prune(final, name)
        return Image(final)
