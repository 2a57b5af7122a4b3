#!/usr/bin/env bash
# Builds the GPU check kit: the `nanoddp` CLI and the test binaries a GPU run needs, in
# release, stripped, with run.sh, the PyTorch comparison and a small Fashion-MNIST, in one
# folder that runs on a machine with a GPU and no Rust (see tools/gpu-kit/README.md).
#
#   tools/gpu-kit/build.sh [--full-data | --subset N] [--all-tests | --tests LIST]
#                          [--variant NAME=REV ...] [BUNDLE_DIR]
#
# BUNDLE_DIR defaults to target/gpu-kit ($CARGO_TARGET_DIR/gpu-kit when that is set).
# --full-data  bundle /usr/share/datasets/fashion-mnist (30 MB) instead of the shipped
#              3,000-image subset: throughput figures on the subset are mostly start-up.
# --all-tests  bundle every test binary, not only those with a CUDA test instance plus
#              tests/cuda_backend, tests/collectives and tests/train (which run.sh runs).
# --tests LIST bundle only these test binaries (comma-separated names: conv,gemm,numerics):
#              each embeds every kernel's fatbin (about 15 MB), so a kit with all of them
#              and the full data passes 200 MB; a machine that takes 64 MB wants a few.
# --subset N   the first N training images of /usr/share/datasets/fashion-mnist (and all
#              10,000 test images): throughput worth comparing in a smaller kit (20,000
#              images: 13 MB where the full set is 30 MB).
# --variant NAME=REV  also the CLI built at git revision REV (a commit, branch or tag; built
#              in a temporary worktree, release, stripped: about 8 MB packed), as
#              bin/nanoddp-NAME: run.sh's variants step trains and profiles each beside the
#              kit's own CLI, alternated in one sitting. Repeatable.
#
# nvcc is found as the build script (build/nvcc.rs) finds it (NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, PATH; never with
# NANODDP_NO_NVCC=1), then in .ci/run's venv ($NANODDP_CUDA_VENV, /opt/nanoddp-cuda-venv).
# Without it the kernels are compiled by NVRTC on the GPU machine at run time.
set -euo pipefail

kit_src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(cd "$kit_src/../.." && pwd -P)
cd "$repo"

full_data=0
subset=""
all_tests=0
only_tests=""
variants=()
bundle=""
expect=""
for arg in "$@"; do
  case "$expect" in
    tests) only_tests=$arg; expect=""; continue ;;
    subset) subset=$arg; expect=""; continue ;;
    variant) variants+=("$arg"); expect=""; continue ;;
  esac
  case "$arg" in
    --full-data) full_data=1 ;;
    --subset) expect=subset ;;
    --subset=*) subset=${arg#--subset=} ;;
    --variant) expect=variant ;;
    --variant=*) variants+=("${arg#--variant=}") ;;
    --all-tests) all_tests=1 ;;
    --tests) expect=tests ;;
    --tests=*) only_tests=${arg#--tests=} ;;
    -h|--help) sed -n '/^set -e/q; 2,$p' "$kit_src/build.sh" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "build.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
    *) [ -z "$bundle" ] || { echo "build.sh: one bundle folder only" >&2; exit 2; }
       bundle=$arg ;;
  esac
done
case "$expect" in
  tests) echo "build.sh: --tests needs a list (conv,gemm,...)" >&2; exit 2 ;;
  subset) echo "build.sh: --subset needs a number of images" >&2; exit 2 ;;
  variant) echo "build.sh: --variant needs NAME=REV" >&2; exit 2 ;;
esac
if [ -n "$subset" ]; then
  case "$subset" in '' | *[!0-9]* | 0) echo "build.sh: --subset takes a positive number of images" >&2; exit 2 ;; esac
  [ "$full_data" = 0 ] || { echo "build.sh: --subset and --full-data exclude each other" >&2; exit 2; }
fi
for v in "${variants[@]}"; do
  name=${v%%=*} rev=${v#*=}
  case "$name" in '' | *[!A-Za-z0-9_.-]*)
    echo "build.sh: --variant $v: NAME must be letters, digits, '.', '_' or '-', then =REV" >&2; exit 2 ;;
  esac
  if [ "$name" = "$v" ] || [ -z "$rev" ]; then echo "build.sh: --variant $v: write NAME=REV" >&2; exit 2; fi
  git rev-parse --verify --quiet "$rev^{commit}" >/dev/null ||
    { echo "build.sh: --variant $v: no commit $rev in this repository" >&2; exit 2; }
done
if [ -n "$only_tests" ] && [ "$all_tests" = 1 ]; then
  echo "build.sh: --tests and --all-tests exclude each other" >&2; exit 2
fi
bundle=${bundle:-${CARGO_TARGET_DIR:-target}/gpu-kit}
MAX_MB=${GPUKIT_MAX_MB:-60}

say() { printf '[gpu-kit] %s\n' "$*"; }
banner() {
  printf '\n%s\n' "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  for line in "$@"; do printf '!!! %s\n' "$line" >&2; done
  printf '%s\n\n' "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
}
need() { command -v "$1" >/dev/null 2>&1 || { echo "build.sh: $1 is required ($2)" >&2; exit 1; }; }
need cargo "a Rust toolchain"
need python3 "to read cargo's JSON messages"
if command -v strip >/dev/null 2>&1; then :; else need objcopy "binutils, to strip the binaries"; fi

# ------------------------------------------------------------------ nvcc, as the build script (build/nvcc.rs) finds it
works() { [ -n "$1" ] && "$1" --version >/dev/null 2>&1; }
nvcc=""
if [ "${NANODDP_NO_NVCC:-}" = 1 ]; then
  nvcc_note="NANODDP_NO_NVCC=1: built without nvcc on purpose"
else
  candidates=()
  [ -n "${NVCC:-}" ] && candidates+=("$NVCC")
  [ -n "${CUDA_HOME:-}" ] && candidates+=("$CUDA_HOME/bin/nvcc")
  [ -n "${CUDA_PATH:-}" ] && candidates+=("$CUDA_PATH/bin/nvcc")
  p=$(command -v nvcc 2>/dev/null || true)
  [ -n "$p" ] && candidates+=("$p")
  for c in "${candidates[@]}"; do
    if works "$c"; then nvcc=$c; break; fi
  done
  if [ -z "$nvcc" ]; then
    # .ci/run installs nvcc from PyPI into this venv; use it rather than build without.
    for c in "${NANODDP_CUDA_VENV:-/opt/nanoddp-cuda-venv}"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc; do
      if works "$c"; then
        nvcc=$c
        export NVCC="$c"
        say "nvcc not set or on PATH: using .ci/run's venv, NVCC=$c"
        break
      fi
    done
  fi
  nvcc_note=${nvcc:+"nvcc $nvcc"}
  nvcc_note=${nvcc_note:-"no nvcc found (NVCC, CUDA_HOME, CUDA_PATH, PATH, .ci/run's venv)"}
fi
if [ -z "$nvcc" ]; then
  banner "NO NVCC: $nvcc_note." \
    "The kit will carry no SASS: on the GPU machine the driver JIT-compiles the PTX shipped" \
    "in kernels/ptx/, and no ptxas report is bundled." \
    "For prebuilt SASS (sm_80, sm_90) set NVCC=/path/to/nvcc; see the README's PyPI recipe."
fi

# ------------------------------------------------------------------ build
say "cargo test --release --no-run (the CLI and every test binary; may wait for cargo's lock)"
msgs=$(mktemp)
trap 'rm -f "$msgs"' EXIT
cargo test --release --no-run --message-format=json-render-diagnostics >"$msgs"

# kind<TAB>name<TAB>executable, and the nanoddp build script's OUT_DIR.
listing=$(python3 - "$msgs" <<'PY'
import json, sys
seen = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and "nanoddp" in m.get("package_id", "") \
            and m.get("package_id", "").startswith("path+"):
        print("outdir\t-\t" + m["out_dir"])
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind, name, test = m["target"]["kind"][0], m["target"]["name"], m["profile"]["test"]
    if kind == "bin" and not test:
        key = "bin/" + name
    elif kind == "test":
        key = "tests/" + name
    elif test and kind in ("lib", "bin"):
        key = "unit/%s-%s" % (name, kind)  # a crate's own #[cfg(test)] tests
    else:
        continue  # examples and benches are built by cargo test but not tests
    seen[key] = m["executable"]
for key, exe in sorted(seen.items()):
    print(key.split("/")[0] + "\t" + key + "\t" + exe)
PY
)
out_dir=$(printf '%s\n' "$listing" | awk -F'\t' '$1=="outdir"{print $3}' | tail -n 1)
cli=$(printf '%s\n' "$listing" | awk -F'\t' '$2=="bin/nanoddp"{print $3}')
if [ -z "$cli" ] || [ ! -x "$cli" ]; then echo "build.sh: cargo built no nanoddp binary" >&2; exit 1; fi

prebuilt=no
if [ -n "$out_dir" ] && compgen -G "$out_dir/*.fatbin" >/dev/null; then prebuilt=yes; fi
if [ "$prebuilt" = no ] && [ -n "$nvcc" ]; then
  banner "nvcc was found ($nvcc) but the build embedded no fatbin (OUT_DIR ${out_dir:-unknown})." \
    "The kit relies on NVRTC at run time; check cargo's warnings above."
fi

# ------------------------------------------------------------------ the bundle folder
if [ -e "$bundle" ]; then
  if [ -f "$bundle/kit-info.txt" ] || [ -z "$(ls -A "$bundle")" ]; then
    rm -rf "$bundle"
  else
    echo "build.sh: $bundle exists and is not a gpu-kit bundle; choose another folder" >&2
    exit 1
  fi
fi
mkdir -p "$bundle"/{bin,tests,unit,root}
bundle=$(cd "$bundle" && pwd -P)

# Test binaries read files through paths baked in at compile time with env!():
# CARGO_MANIFEST_DIR (tests/data, kernels/, examples/custom_kernel, Cargo.toml) and
# CARGO_BIN_EXE_nanoddp (the CLI). root/ mirrors those parts of the repository; run.sh makes
# the baked paths lead to it (a symlink) when they do not exist on the GPU machine.
manifest_dir=$repo
cp Cargo.toml "$bundle/root/"
cp -r kernels "$bundle/root/"
mkdir -p "$bundle/root/tests" "$bundle/root/examples"
cp -r tests/data "$bundle/root/tests/"
[ -d examples/custom_kernel ] && cp -r examples/custom_kernel "$bundle/root/examples/"
case "$cli" in
  "$manifest_dir"/*) bin_rel=${cli#"$manifest_dir"/} ;;
  *) bin_rel="" ;;  # CARGO_TARGET_DIR outside the repository: run.sh links the path itself
esac
if [ -n "$bin_rel" ]; then
  mkdir -p "$bundle/root/$(dirname "$bin_rel")"
  up=$(dirname "$bin_rel" | sed 's|[^/][^/]*|..|g')
  ln -s "$up/../bin/nanoddp" "$bundle/root/$bin_rel"
fi

# Which test binaries: those with a test instance whose name contains "cuda", and the three
# run.sh runs in full. Listing a libtest binary runs no test.
full_set=" tests/cuda_backend tests/collectives tests/train "
included=()
excluded=()
while IFS=$'\t' read -r group key exe; do
  case "$group" in tests|unit) ;; *) continue ;; esac
  if [ -n "$only_tests" ]; then
    if [[ ",$only_tests," == *",${key#*/},"* || ",$only_tests," == *",$key,"* ]]; then
      included+=("$key	$exe")
    else
      excluded+=("$key")
    fi
    continue
  fi
  n_cuda=$("$exe" --list 2>/dev/null | grep ': test$' | grep -c cuda || true)
  if [ "$all_tests" = 1 ] || [ "$n_cuda" -gt 0 ] || [[ "$full_set" == *" $key "* ]]; then
    included+=("$key	$exe")
  else
    excluded+=("$key")
  fi
done <<<"$listing"
if [ -n "$only_tests" ]; then
  IFS=, read -r -a wanted <<<"$only_tests"
  for name in "${wanted[@]}"; do
    found=0
    for entry in "${included[@]}"; do
      key=${entry%%	*}
      [ "${key#*/}" = "$name" ] || [ "$key" = "$name" ] && found=1
    done
    if [ "$found" = 0 ]; then
      rm -rf "$bundle"  # made above by this run
      echo "build.sh: --tests: no test binary named $name (the names: tests/*.rs)" >&2
      exit 2
    fi
  done
fi

strip_mode=${GPUKIT_STRIP:-debug}   # debug: keep symbols (named backtraces); all: smallest
copy_binaries() {
  local key exe
  for entry in "bin/nanoddp	$cli" "${included[@]}"; do
    key=${entry%%	*}
    exe=${entry#*	}
    if [ "$strip_mode" = all ]; then
      if command -v strip >/dev/null 2>&1; then strip -o "$bundle/$key" "$exe"
      else objcopy --strip-all "$exe" "$bundle/$key"; fi
    elif command -v objcopy >/dev/null 2>&1; then
      objcopy --strip-debug "$exe" "$bundle/$key"
    else
      strip --strip-debug -o "$bundle/$key" "$exe"
    fi
    chmod 755 "$bundle/$key"
  done
}
copy_binaries
rmdir "$bundle/unit" 2>/dev/null || true

# Each --variant: the CLI at its revision, from a temporary worktree, in a target folder the
# variants share (the dependencies build once).
variant_note=""
for v in "${variants[@]}"; do
  name=${v%%=*} rev=${v#*=}
  tree=$(mktemp -d)
  say "variant $name: building the CLI at $rev ($(git rev-parse --short "$rev"))"
  git worktree add --detach --quiet "$tree" "$rev"
  if ! (cd "$tree" && CARGO_TARGET_DIR="$repo/target/gpu-kit-variants" cargo build --release --locked --bin nanoddp); then
    git worktree remove --force "$tree"
    echo "build.sh: --variant $v: the build failed" >&2
    exit 1
  fi
  git worktree remove --force "$tree"
  objcopy --strip-all "$repo/target/gpu-kit-variants/release/nanoddp" "$bundle/bin/nanoddp-$name"
  chmod 755 "$bundle/bin/nanoddp-$name"
  variant_note="$variant_note $name=$(git rev-parse --short "$rev")"
done

# The CUDA stand-in, for run.sh's profile step: the launch profile its PTX executor counts
# (bench kernels --backend cuda on it), whose H100 estimates the report sets beside ncu's.
standin_lib=$(dirname "$cli")/cuda-standin/libcuda.so.1
if [ -f "$standin_lib" ]; then
  mkdir -p "$bundle/standin"
  cp "$standin_lib" "$bundle/standin/"
  ln -s libcuda.so.1 "$bundle/standin/libcuda.so"
fi

# Training data for run.sh's train and PyTorch steps.
data_note="the 3,000/1,000-image subset from tests/data; throughput on it is mostly start-up"
if [ "$full_data" = 1 ]; then
  if [ -d /usr/share/datasets/fashion-mnist ]; then
    mkdir -p "$bundle/data/fashion-mnist"
    cp /usr/share/datasets/fashion-mnist/*.gz "$bundle/data/fashion-mnist/"
    data_note="full Fashion-MNIST (60,000/10,000) from /usr/share/datasets/fashion-mnist"
  else
    say "--full-data: /usr/share/datasets/fashion-mnist not found; bundling the subset"
  fi
fi
if [ -n "$subset" ]; then
  if [ -d /usr/share/datasets/fashion-mnist ]; then
    mkdir -p "$bundle/data/fashion-mnist"
    python3 - /usr/share/datasets/fashion-mnist "$bundle/data/fashion-mnist" "$subset" <<'PY'
import gzip, shutil, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, header in (("train-images-idx3-ubyte.gz", 16), ("train-labels-idx1-ubyte.gz", 8)):
    data = gzip.open(f"{src}/{name}").read()
    count = struct.unpack(">I", data[4:8])[0]
    n = min(n, count)
    item = (len(data) - header) // count
    out = data[:4] + struct.pack(">I", n) + data[8:header] + data[header:header + n * item]
    with gzip.open(f"{dst}/{name}", "wb", compresslevel=6) as f:
        f.write(out)
for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
    shutil.copy(f"{src}/{name}", f"{dst}/{name}")
PY
    data_note="the first $subset training images of Fashion-MNIST and its 10,000 test images (--subset)"
  else
    say "--subset: /usr/share/datasets/fashion-mnist not found; bundling the 3,000-image subset"
  fi
fi
if [ ! -d "$bundle/data/fashion-mnist" ]; then
  mkdir -p "$bundle/data"
  ln -s ../root/tests/data/fashion-mnist-subset "$bundle/data/fashion-mnist"
fi

# tests/train draws a plot, which needs a TrueType font; GPU machines often have none.
for f in /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf /usr/share/fonts/dejavu/DejaVuSans.ttf \
         /usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf; do
  if [ -f "$f" ]; then
    mkdir -p "$bundle/fonts"
    cp "$f" "$bundle/fonts/DejaVuSans.ttf"
    for c in /usr/share/doc/fonts-dejavu-core/copyright /usr/share/licenses/dejavu-sans-fonts/LICENSE; do
      if [ -f "$c" ]; then cp "$c" "$bundle/fonts/DejaVuSans.LICENSE"; break; fi
    done
    break
  fi
done
[ -d "$bundle/fonts" ] || say "no DejaVu Sans here to bundle: tests/train's plot test needs one on the GPU machine"

cp "$kit_src/run.sh" "$kit_src/torch_lenet_gpu.py" "$kit_src/README.md" "$bundle/"
chmod 755 "$bundle/run.sh"

size_mb() { du -sb "$1" | awk '{printf "%.1f", $1 / 1048576}'; }
over() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }
if over "$(size_mb "$bundle")" "$MAX_MB" && [ "$strip_mode" = debug ]; then
  strip_mode=all
  say "over ${MAX_MB} MB with symbols kept: stripping the binaries fully (backtraces lose names)"
  copy_binaries
fi

# NVRTC (optional): compiles the kernels on the GPU machine when no prebuilt one fits.
nvrtc_note="not bundled: no libnvrtc.so.13 on LD_LIBRARY_PATH"
IFS=: read -r -a ld_dirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${ld_dirs[@]}"; do
  if [ -z "$d" ] || [ ! -e "$d/libnvrtc.so.13" ]; then continue; fi
  nvrtc_files=("$d/libnvrtc.so.13")
  for f in "$d"/libnvrtc-builtins.so.*; do [ -e "$f" ] && nvrtc_files+=("$f"); done
  add=$(du -cbL "${nvrtc_files[@]}" | tail -n 1 | awk '{printf "%.1f", $1 / 1048576}')
  total=$(awk -v a="$(size_mb "$bundle")" -v b="$add" 'BEGIN { printf "%.1f", a + b }')
  if over "$total" "$MAX_MB"; then
    nvrtc_note="not bundled: $d/libnvrtc.so.13 and its builtins are ${add} MB, the kit would be ${total} MB (limit ${MAX_MB} MB, GPUKIT_MAX_MB); the GPU machine's CUDA provides NVRTC if needed"
  else
    mkdir -p "$bundle/lib"
    cp -L "${nvrtc_files[@]}" "$bundle/lib/"
    inc=$(dirname "$d")/include
    if [ -e "$inc/cuda_fp16.h" ]; then cp -rL "$inc" "$bundle/lib/include"; fi
    nvrtc_note="bundled from $d (${add} MB) in lib/"
  fi
  break
done
say "NVRTC: $nvrtc_note"

# ------------------------------------------------------------------ kit-info.txt
git_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then git_rev="$git_rev+uncommitted changes"; fi
{
  echo "# written by tools/gpu-kit/build.sh; read by run.sh (key=value)"
  echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "built_on=$(uname -n) $(uname -m)"
  echo "git=$git_rev"
  echo "rustc=$(rustc --version 2>/dev/null || echo unknown)"
  echo "nvcc=${nvcc:-none}"
  echo "prebuilt_kernels=$prebuilt"
  echo "manifest_dir=$manifest_dir"
  echo "bin_exe=$cli"
  echo "bin_exe_rel=$bin_rel"
  echo "data=$data_note"
  echo "nvrtc=$nvrtc_note"
  echo "strip=$strip_mode"
  echo "variants=${variant_note# }"
  echo "tests=$(for e in "${included[@]}"; do printf '%s ' "${e%%	*}"; done)"
  if [ -n "$only_tests" ]; then
    echo "not_bundled=${excluded[*]:-} (not in --tests)"
  else
    echo "not_bundled=${excluded[*]:-} (no test instance named *cuda*; --all-tests bundles them)"
  fi
} >"$bundle/kit-info.txt"

# ------------------------------------------------------------------ summary
say "bundle: $bundle"
(cd "$bundle" && find . \( -type f -o -type l \) | sort | while read -r f; do
  if [ -L "$f" ]; then printf '  %-48s -> %s\n' "$f" "$(readlink "$f")"
  else printf '  %-48s %8s KiB\n' "$f" "$(( $(stat -c %s "$f") / 1024 ))"; fi
done) | grep -v '^  ./root/kernels/\|^  ./lib/include/' || true
say "kernels prebuilt by nvcc: $prebuilt (${nvcc:-no nvcc})"
say "not bundled (no *cuda* test instance): ${excluded[*]:-none}"
say "total size: $(size_mb "$bundle") MB ($(du -sh "$bundle" | cut -f1) on disk)"
if [ "$prebuilt" = no ]; then
  banner "REMINDER: this kit has NO prebuilt kernels (no nvcc); it relies on NVRTC at run time."
fi
if over "$(size_mb "$bundle")" "$MAX_MB"; then
  say "note: over the ${MAX_MB} MB target (--full-data adds 30 MB)"
fi
say "carry it: tar -C '$(dirname "$bundle")' -czf gpu-kit.tar.gz '$(basename "$bundle")'; on the GPU machine: tar xzf gpu-kit.tar.gz && $(basename "$bundle")/run.sh"
