#!/usr/bin/env bash
# nanoddp's GPU check: runs the kit's steps on a machine with an NVIDIA GPU and writes one
# markdown report. Needs bash, coreutils, grep, sed and python3 (for the PyTorch step); no
# Rust. Every step has a time limit; a failing step is recorded and the run goes on. Exits 1
# if any step failed or timed out, 0 otherwise (skipped steps do not fail the run).
#
#   run.sh [--out FILE | FILE] [--steps LIST] [--data DIR] [--timeout-scale N]
#
#   --out FILE          the report (default ./gpu-report.md); full logs go to FILE's name
#                       without .md plus .logs/ (default ./gpu-report.logs/)
#   --steps LIST        comma-separated, in this order when run: system, tests, train, bench,
#                       profile, variants, torch, sanitizer (default: all)
#   --tests LIST        with the tests step: only these binaries (e.g. conv,pool,train)
#   --data DIR          Fashion-MNIST for the train and PyTorch steps (default: the kit's
#                       data/fashion-mnist)
#   --timeout-scale N   multiply every time limit by the integer N (slow machines)
#   PYTHON=/path/python3 picks the interpreter for the PyTorch step.
#   VARIANT_ROUNDS=N    rounds of the variants step (default 3): each round trains the kit's
#                       CLI and every bin/nanoddp-NAME (build.sh --variant) once, in turn.
set -u
set -o pipefail

kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
out=gpu-report.md
steps=all
only_tests=""
data=""
scale=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a file}; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --steps) steps=${2:?--steps needs a list}; shift 2 ;;
    --steps=*) steps=${1#--steps=}; shift ;;
    --data) data=${2:?--data needs a folder}; shift 2 ;;
    --data=*) data=${1#--data=}; shift ;;
    --tests) only_tests=${2:?--tests needs a list}; shift 2 ;;
    --tests=*) only_tests=${1#--tests=}; shift ;;
    --timeout-scale) scale=${2:?--timeout-scale needs an integer}; shift 2 ;;
    --timeout-scale=*) scale=${1#--timeout-scale=}; shift ;;
    -h|--help) sed -n '/^set -u/q; 2,$p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
case "$scale" in '' | *[!0-9]* | 0) echo "run.sh: --timeout-scale takes a positive integer" >&2; exit 2 ;; esac
for s in ${steps//,/ }; do
  case "$s" in all|system|tests|train|bench|profile|variants|torch|sanitizer) ;;
    *) echo "run.sh: unknown step '$s' (system, tests, train, bench, profile, variants, torch, sanitizer)" >&2; exit 2 ;;
  esac
done
want() { [[ ",$steps," == *",all,"* || ",$steps," == *",$1,"* ]]; }
limit() { echo $(( $1 * scale )); }

case "$out" in /*) report=$out ;; *) report=$PWD/$out ;; esac
logs=${report%.md}.logs
mkdir -p "$logs" || { echo "run.sh: cannot create $logs" >&2; exit 2; }
rm -f "$logs"/*.log "$logs"/*.jsonl
details=$logs/.details.md
: >"$details"

info() { # a value from kit-info.txt (written by build.sh)
  local line
  [ -f "$kit/kit-info.txt" ] || return 0
  while IFS= read -r line; do
    case "$line" in "$1="*) printf '%s' "${line#*=}"; return 0 ;; esac
  done <"$kit/kit-info.txt"
}
cli=$kit/bin/nanoddp
data=${data:-$kit/data/fashion-mnist}
case "$data" in /*) ;; *) data=$PWD/$data ;; esac
PYTHON=${PYTHON:-python3}
started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
export RUST_BACKTRACE=1

# ------------------------------------------------------------------ recording steps
S_TITLE=() S_STATUS=() S_RC=() S_WALL=() S_NOTE=()
TEST_ROWS=() SAN_ROWS=() TRAIN_ROWS=() TORCH_ROWS=() RATIO_ROWS=() ENV_NOTES=() MODEL_ROWS=()
VARIANT_ROWS=() VARIANT_KERNEL_ROWS=()
state="in progress"

md_cell() { local s=${1//|/\\|}; printf '%s' "${s//$'\n'/ }"; }

# run_step ID TITLE LIMIT_S COMMAND... : runs COMMAND in $STEP_CWD under `timeout`, output to
# $logs/ID.log; sets CUR_* for the checks that follow and for finish_step.
run_step() {
  CUR_ID=$1 CUR_TITLE=$2 CUR_LIMIT=$3
  shift 3
  CUR_LOG=$logs/$CUR_ID.log
  CUR_CMD=$(printf '%q ' "$@")
  CUR_NOTE=""
  CUR_EXCLUDE='^$'   # lines left out of the report's excerpt (never of the full log)
  printf '[run.sh] %-58s ' "$CUR_TITLE" >&2
  local t0 t1
  t0=$(date +%s%N)
  CUR_T0=$t0
  # In the background and waited for, so that a signal to this script is handled at once
  # (bash runs traps only between foreground commands; `timeout` keeps its child out of the
  # terminal's process group, so Ctrl-C reaches only this script).
  (cd "$STEP_CWD" && exec timeout -k 20 "$CUR_LIMIT" "$@") >"$CUR_LOG" 2>&1 </dev/null &
  CHILD=$!
  wait "$CHILD"
  CUR_RC=$?
  CHILD=""
  t1=$(date +%s%N)
  set_wall "$t0" "$t1"
  case "$CUR_RC" in
    0) CUR_STATUS=PASS ;;
    77) CUR_STATUS=SKIP ;;
    124|137) CUR_STATUS=TIMEOUT; CUR_NOTE="killed after the ${CUR_LIMIT} s limit" ;;
    126|127) CUR_STATUS=FAIL; CUR_NOTE="command not found or not executable" ;;
    *) CUR_STATUS=FAIL ;;
  esac
}

last_line() { grep -v '^[[:space:]]*$' "$CUR_LOG" 2>/dev/null | tail -n 1 | cut -c1-200; }
set_wall() { local ms=$(( ($2 - $1) / 1000000 )); CUR_WALL="$(( ms / 1000 )).$(( ms % 1000 / 100 ))"; }
note() { CUR_NOTE=${CUR_NOTE:+$CUR_NOTE; }$1; }

# shellcheck disable=SC2016 # the backquotes are markdown
finish_step() {
  local n=$(( ${#S_TITLE[@]} + 1 )) lines=25
  if [ "$CUR_STATUS" != PASS ] && [ -z "$CUR_NOTE" ]; then CUR_NOTE=$(last_line); fi
  S_TITLE+=("$CUR_TITLE") S_STATUS+=("$CUR_STATUS") S_RC+=("$CUR_RC") S_WALL+=("$CUR_WALL") S_NOTE+=("$CUR_NOTE")
  printf '%s %s s%s\n' "$CUR_STATUS" "$CUR_WALL" "${CUR_NOTE:+  ($CUR_NOTE)}" >&2
  case "$CUR_STATUS" in FAIL|TIMEOUT|INTERRUPTED) lines=60 ;; esac
  {
    printf '\n### %d. %s: %s\n\n' "$n" "$CUR_TITLE" "$CUR_STATUS"
    printf -- '- command: `%s`\n' "${CUR_CMD% }"
    printf -- '- working directory: `%s`\n' "$STEP_CWD"
    printf -- '- exit status: %s; wall time: %s s (limit %s s)\n' "$CUR_RC" "$CUR_WALL" "$CUR_LIMIT"
    [ -n "$CUR_NOTE" ] && printf -- '- note: %s\n' "$CUR_NOTE"
    printf -- '- full output: `%s`\n\n' "$CUR_LOG"
    printf '````text\n'
    if [ -s "$CUR_LOG" ]; then grep -vE "$CUR_EXCLUDE" "$CUR_LOG" | tail -n "$lines" | cut -c1-400; else echo "(no output)"; fi
    printf '````\n'
  } >>"$details"
  write_report
}

# A step that is not run (or a check with no command): recorded with its reason.
record() { # STATUS TITLE NOTE
  CUR_STATUS=$1 CUR_TITLE=$2 CUR_NOTE=$3 CUR_RC=- CUR_WALL=-
  local n=$(( ${#S_TITLE[@]} + 1 ))
  S_TITLE+=("$CUR_TITLE") S_STATUS+=("$CUR_STATUS") S_RC+=(-) S_WALL+=(-) S_NOTE+=("$CUR_NOTE")
  printf '[run.sh] %-58s %s  (%s)\n' "$CUR_TITLE" "$CUR_STATUS" "$CUR_NOTE" >&2
  printf '\n### %d. %s: %s\n\n- %s\n' "$n" "$CUR_TITLE" "$CUR_STATUS" "$CUR_NOTE" >>"$details"
  write_report
}

count() { local want=$1 n=0 s; for s in "${S_STATUS[@]}"; do [ "$s" = "$want" ] && n=$((n + 1)); done; echo "$n"; }

write_report() {
  local tmp=$report.tmp i
  {
    echo "# nanoddp GPU report"
    echo
    echo "- run: $started on \`$(uname -n)\` ($(uname -sr)), $state"
    echo "- kit: \`$kit\`, built $(info built_at) on $(info built_on) from git $(info git)"
    echo "- kernels: prebuilt by nvcc: $(info prebuilt_kernels) ($(info nvcc)); NVRTC in the kit: $(info nvrtc)"
    if [ "$data" = "$kit/data/fashion-mnist" ]; then
      echo "- training data: \`$data\`: $(info data)"
    else
      echo "- training data: \`$data\` (--data)"
    fi
    echo "- steps: ${#S_TITLE[@]} recorded: $(count PASS) passed, $(count FAIL) failed, $(count TIMEOUT) timed out, $(count INTERRUPTED) interrupted, $(count SKIP) skipped"
    for i in "${ENV_NOTES[@]}"; do echo "- $i"; done
    echo
    echo "## Summary"
    echo
    echo "| # | step | status | exit | wall s | note |"
    echo "|---:|---|---|---:|---:|---|"
    for i in "${!S_TITLE[@]}"; do
      printf '| %d | %s | **%s** | %s | %s | %s |\n' "$((i + 1))" "$(md_cell "${S_TITLE[$i]}")" "${S_STATUS[$i]}" \
        "${S_RC[$i]}" "${S_WALL[$i]}" "$(md_cell "${S_NOTE[$i]}")"
    done
    if [ ${#TEST_ROWS[@]} -gt 0 ]; then
      echo
      echo "## CUDA test suite (NANODDP_EXPECT_CUDA=1)"
      echo
      echo "| binary | filter | passed | failed | ignored | filtered out | CUDA instances skipped | status |"
      echo "|---|---|---:|---:|---:|---:|---:|---|"
      printf '%s\n' "${TEST_ROWS[@]}"
    fi
    if [ ${#TRAIN_ROWS[@]} -gt 0 ] || [ ${#TORCH_ROWS[@]} -gt 0 ]; then
      echo
      echo "## Training: nanoddp and PyTorch, same LeNet, batch 256, 2 epochs, SGD lr 0.1 momentum 0.9, cosine decay"
      echo
      echo "| run | status | last epoch |"
      echo "|---|---|---|"
      [ ${#TRAIN_ROWS[@]} -gt 0 ] && printf '%s\n' "${TRAIN_ROWS[@]}"
      [ ${#TORCH_ROWS[@]} -gt 0 ] && printf '%s\n' "${TORCH_ROWS[@]}"
      if [ ${#RATIO_ROWS[@]} -gt 0 ]; then echo; printf -- '- %s\n' "${RATIO_ROWS[@]}"; fi
      echo
      echo "(images/s: the training loop of the last epoch, test evaluation excluded.)"
      [[ "$(readlink -f "$data")" == *fashion-mnist-subset* ]] &&
        echo "(This data is the 3,000-image subset: an epoch is 12 steps, mostly start-up; build the kit with --full-data or pass --data for figures worth quoting.)"
    fi
    if [ ${#MODEL_ROWS[@]} -gt 0 ]; then
      echo
      echo "## One step's kernels: measured (ncu) beside the launch profile's H100 estimate"
      echo
      echo "(The estimate is nanoddp's model from the counts the stand-in's PTX executor takes, docs/kernel-profile.md; launches matched by kernel name and order.)"
      echo
      echo "| kernel | ncu µs | estimate µs | measured / estimate | inst/FFMA (PTX) |"
      echo "|---|---:|---:|---:|---:|"
      printf '%s\n' "${MODEL_ROWS[@]}"
    fi
    if [ ${#VARIANT_ROWS[@]} -gt 0 ]; then
      echo
      echo "## Variants: the kit's CLI against build.sh --variant builds, alternated (fp32, 1 GPU, graphs)"
      echo
      echo "| build | images/s, each round | median | against the kit's |"
      echo "|---|---|---:|---:|"
      printf '%s\n' "${VARIANT_ROWS[@]}"
      if [ ${#VARIANT_KERNEL_ROWS[@]} -gt 0 ]; then
        echo
        echo "One steady step's kernels (ncu, µs), launch by launch:"
        echo
        printf '%s\n' "${VARIANT_KERNEL_ROWS[@]}"
      fi
    fi
    if [ ${#SAN_ROWS[@]} -gt 0 ]; then
      echo
      echo "## compute-sanitizer over the kernel tests (filter \`cuda\`)"
      echo
      echo "| tool | binary | summary | tests | status |"
      echo "|---|---|---|---|---|"
      printf '%s\n' "${SAN_ROWS[@]}"
    fi
    echo
    echo "## Steps in detail"
    cat "$details"
    echo
    echo "Full output of every step: \`$logs/\`"
  } >"$tmp" && mv -f "$tmp" "$report"
}

# ------------------------------------------------------------------ clean-up of what we create
CREATED=()   # symlinks and folders this run made, removed at exit (last first)
cleanup() {
  local i p
  for (( i = ${#CREATED[@]} - 1; i >= 0; i-- )); do
    p=${CREATED[$i]}
    if [ -L "$p" ]; then rm -f "$p"; elif [ -d "$p" ]; then rmdir "$p" 2>/dev/null; fi
  done
  CREATED=()
}
CHILD=""
interrupted() {
  trap '' INT TERM
  state="INTERRUPTED"
  if [ -n "$CHILD" ]; then   # the step in flight: stop it (timeout passes TERM on) and record it
    kill -TERM "$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
    CHILD=""
    CUR_RC=130 CUR_STATUS=INTERRUPTED
    set_wall "$CUR_T0" "$(date +%s%N)"
    note "the run was interrupted during this step"
    finish_step
  fi
  printf '\n[run.sh] interrupted; report so far: %s\n' "$report" >&2
  write_report
  cleanup
  exit 130
}
trap cleanup EXIT
trap interrupted INT TERM

# mkdir -p that remembers which folders it made.
make_dirs() {
  local d=$1 missing=()
  while [ ! -d "$d" ] && [ "$d" != / ]; do missing=("$d" "${missing[@]}"); d=$(dirname "$d"); done
  for d in "${missing[@]}"; do mkdir "$d" 2>/dev/null || return 1; CREATED+=("$d"); done
}
link() { # link TARGET PATH, remembered
  make_dirs "$(dirname "$2")" && ln -s "$1" "$2" 2>/dev/null && CREATED+=("$2")
}

cuda_tool_dirs() { # the CUDA toolkit's bin folders, into CUDA_TOOL_DIRS
  CUDA_TOOL_DIRS=()
  [ -n "${CUDA_HOME:-}" ] && CUDA_TOOL_DIRS+=("$CUDA_HOME/bin")
  [ -n "${CUDA_PATH:-}" ] && CUDA_TOOL_DIRS+=("$CUDA_PATH/bin")
  CUDA_TOOL_DIRS+=(/usr/local/cuda/bin)
  local d
  for d in /usr/local/cuda-*/bin; do [ -d "$d" ] && CUDA_TOOL_DIRS+=("$d"); done
  return 0
}

find_tool() { # NAME DIR...: PATH first, then the folders given
  local name=$1 d
  shift
  command -v "$name" 2>/dev/null && return 0
  for d in "$@"; do [ -x "$d/$name" ] && { echo "$d/$name"; return 0; }; done
  return 1
}

printf '[run.sh] report: %s\n' "$report" >&2
if [ ! -x "$cli" ] || [ ! -f "$kit/kit-info.txt" ]; then
  echo "run.sh: $kit is not a built kit (no bin/nanoddp or kit-info.txt): run tools/gpu-kit/build.sh first" >&2
  exit 2
fi
work=$logs/work
mkdir -p "$work"
STEP_CWD=$work

# ------------------------------------------------------------------ libraries
# NVRTC compiles kernels when no prebuilt one fits the GPU: the kit's copy, else the CUDA
# installation's. libcuda comes from the driver's usual places.
if [ -d "$kit/lib" ]; then
  export LD_LIBRARY_PATH="$kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ -d "$kit/lib/include" ] && export NANODDP_CUDA_INCLUDE="${NANODDP_CUDA_INCLUDE:-$kit/lib/include}"
  ENV_NOTES+=("NVRTC: the kit's \`lib/\` is on LD_LIBRARY_PATH")
else
  have_nvrtc=""
  IFS=: read -r -a ld_dirs <<<"${LD_LIBRARY_PATH:-}"
  for d in "${ld_dirs[@]}"; do [ -n "$d" ] && [ -e "$d/libnvrtc.so.13" ] && have_nvrtc=$d; done
  if [ -z "$have_nvrtc" ]; then
    for d in "${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
      if [ -e "$d/libnvrtc.so.13" ]; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        have_nvrtc=$d
        break
      fi
    done
  fi
  if [ -n "$have_nvrtc" ]; then
    ENV_NOTES+=("NVRTC: libnvrtc.so.13 from \`$have_nvrtc\`")
  else
    ENV_NOTES+=("NVRTC: no libnvrtc.so.13 found (needed only when no prebuilt kernel fits the GPU)")
  fi
fi

# `train --plot` (run by tests/train) needs a TrueType font: the system's DejaVu Sans, else the kit's copy.
system_font=""
for f in /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf /usr/share/fonts/dejavu/DejaVuSans.ttf \
         /usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf; do
  [ -f "$f" ] && system_font=$f && break
done
if [ -z "${NANODDP_FONT:-}" ] && [ -z "$system_font" ] && [ -f "$kit/fonts/DejaVuSans.ttf" ]; then
  export NANODDP_FONT="$kit/fonts/DejaVuSans.ttf"
  ENV_NOTES+=("font for \`--plot\`: none installed; NANODDP_FONT set to the kit's \`fonts/DejaVuSans.ttf\`")
fi

case ":${LD_LIBRARY_PATH:-}:" in
  *cuda-standin*) ENV_NOTES+=("WARNING: LD_LIBRARY_PATH names a cuda-standin folder: the CUDA steps may run on nanoddp's CPU stand-in for the driver, not on a GPU") ;;
esac

# ------------------------------------------------------------------ system
gpus=0
smi=$(find_tool nvidia-smi /usr/local/nvidia/bin /usr/lib/wsl/lib /usr/bin) || smi=""
if want system; then
  if [ -n "$smi" ]; then
    # shellcheck disable=SC2016 # $1 expands in the inner bash
    run_step nvidia-smi "nvidia-smi (GPUs, driver)" "$(limit 60)" \
      bash -c '"$1" || exit; echo; "$1" --query-gpu=index,name,driver_version,memory.total,compute_cap,pcie.link.gen.current,pcie.link.width.current --format=csv; echo; "$1" topo -m || true' _ "$smi"
    finish_step
  else
    record FAIL "nvidia-smi (GPUs, driver)" "nvidia-smi not found (PATH, /usr/local/nvidia/bin, /usr/lib/wsl/lib): no NVIDIA driver here"
  fi
fi
if [ -n "$smi" ]; then
  gpus=$("$smi" -L 2>/dev/null | grep -c '^GPU ')
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
    [ "${#visible[@]}" -lt "$gpus" ] && gpus=${#visible[@]}
  fi
  gpu_names=$("$smi" --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | tr '\n' ';')
  ENV_NOTES+=("GPUs: $gpus visible${gpu_names:+ (${gpu_names%;}; name, driver)}")
else
  ENV_NOTES+=("GPUs: none found (no nvidia-smi)")
fi
if want system; then
  run_step info "nanoddp info" "$(limit 120)" "$cli" info
  CUR_EXCLUDE='^  [a-z]+ +[a-z0-9_]+ +sm_[0-9]+ '   # the per-kernel resource rows: in the log
  grep -q 'no CUDA driver' "$CUR_LOG" && note "nanoddp found no CUDA driver"
  finish_step
fi

# ------------------------------------------------------------------ layout for the tests
# Test binaries find data through CARGO_MANIFEST_DIR and CARGO_BIN_EXE_nanoddp, baked in at
# build time (paths on the build machine). Make those paths lead to the kit's root/ when they
# do not exist here; use them as they are when they do (the build machine's checkout).
manifest=$(info manifest_dir)
bin_exe=$(info bin_exe)
test_cwd=$kit/root
layout_status=PASS
layout_note=""
if want tests || want sanitizer; then
  if [ -e "$manifest" ]; then
    if [ "$(cd "$manifest" && pwd -P)" = "$(cd "$kit/root" && pwd -P)" ]; then
      layout_note="\`$manifest\` already leads to the kit's root/"
    else
      layout_note="\`$manifest\` exists (a checkout?): the tests read tests/data, kernels/ and Cargo.toml from it"
    fi
    test_cwd=$manifest
  elif link "$kit/root" "$manifest"; then
    layout_note="linked \`$manifest\` -> kit's root/ (removed at the end)"
    test_cwd=$manifest
  else
    layout_status=FAIL
    layout_note="cannot create \`$manifest\` (the build machine's path, baked into the tests): tests that read data files or run the CLI will fail; run as a user who may create it, or build the kit in a path that exists here"
  fi
  if [ -n "$bin_exe" ] && [ ! -e "$bin_exe" ]; then
    if link "$cli" "$bin_exe"; then
      layout_note="$layout_note; linked \`$bin_exe\` -> kit's bin/nanoddp (removed at the end)"
    else
      layout_status=FAIL
      layout_note="$layout_note; cannot create \`$bin_exe\` (the CLI's baked path): tests that run the CLI will fail"
    fi
  elif [ -n "$bin_exe" ] && [ "$(readlink -f "$bin_exe")" != "$(readlink -f "$cli")" ]; then
    layout_note="$layout_note; the tests run the CLI found at \`$bin_exe\`, not the kit's copy"
  fi
  record "$layout_status" "test layout (baked paths)" "$layout_note"
fi

# ------------------------------------------------------------------ the CUDA test suite
# libtest's summary line: "test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 10 filtered out; ..."
field() { sed -nE "s/.* ([0-9]+) $1.*/\\1/p" <<<"$2"; }
check_tests() { # BINARY FILTER: counts from the log; CUDA instances that skipped fail the step
  local name=$1 filter=$2 summary passed failed ignored filtered skips first
  summary=$(grep -E '^test result: ' "$CUR_LOG" | tail -n 1)
  passed=$(field passed "$summary") failed=$(field failed "$summary")
  ignored=$(field ignored "$summary") filtered=$(field 'filtered out' "$summary")
  skips=$(grep -E 'skipped: ' "$CUR_LOG" | grep -vc 'a CUDA driver is present')
  if [ -z "$summary" ]; then
    note "no libtest summary line (crashed or killed?)"
    [ "$CUR_STATUS" = PASS ] && CUR_STATUS=FAIL
  else
    note "${passed:-?} passed, ${failed:-?} failed"
  fi
  if [ "${skips:-0}" -gt 0 ] && [ "$CUR_STATUS" = PASS ]; then
    first=$(grep -E 'skipped: ' "$CUR_LOG" | grep -v 'a CUDA driver is present' | head -n 1 | sed -E 's/.*skipped: //' | cut -c1-160)
    CUR_STATUS=FAIL
    note "$skips test instance(s) skipped although NANODDP_EXPECT_CUDA=1: $first"
  fi
  TEST_ROWS+=("| \`$name\` | ${filter:-(all)} | ${passed:--} | ${failed:--} | ${ignored:--} | ${filtered:--} | ${skips:-0} | **$CUR_STATUS** |")
}

# tests/collectives and tests/train hold slow CPU and emulator tests too: their CUDA tests are
# named cuda like every other binary's.
full_set=" tests/cuda_backend "
# NANODDP_EXPECT_CUDA=1: CUDA test instances fail instead of skipping when no GPU is usable.
# NANODDP_STANDIN_GPUS=0: where no driver loads, the tests fall back to nanoddp's CPU stand-in
# for it (target/<profile>/cuda-standin, a baked path); showing no GPUs, it makes them fail
# rather than pass on the CPU. A real driver is always loaded first.
cuda_env=(env NANODDP_EXPECT_CUDA=1 NANODDP_STANDIN_GPUS=0)
if want tests; then
  STEP_CWD=$test_cwd
  for bin in "$kit"/tests/* "$kit"/unit/*; do
    [ -x "$bin" ] || continue
    name=${bin#"$kit"/}
    if [ -n "$only_tests" ] && [[ ",$only_tests," != *",${name#*/},"* && ",$only_tests," != *",$name,"* ]]; then
      continue
    fi
    if [[ "$full_set" == *" $name "* ]]; then
      run_step "test-${name//\//-}" "$name (all tests)" "$(limit 1200)" "${cuda_env[@]}" "$bin" --show-output
      check_tests "$name" ""
    else
      run_step "test-${name//\//-}" "$name (filter cuda)" "$(limit 300)" "${cuda_env[@]}" "$bin" cuda --show-output
      check_tests "$name" cuda
    fi
    finish_step
  done
  STEP_CWD=$work
fi

# ------------------------------------------------------------------ training
rate() { sed -nE 's/.* ([0-9]+) img\/s.*/\1/p' <<<"$1"; }
ratio() { local x=$(( $1 * 100 / $2 )); printf '%d.%02dx' $(( x / 100 )) $(( x % 100 )); }
last_epoch() { grep -E '^epoch ' "$1" | tail -n 1 | sed -E 's/ +/ /g'; }
train_args=(--backend cuda --epochs 2 --batch 256 --lr 0.1 --momentum 0.9 --weight-decay 0 --data "$data")
if want train; then
  if [ "$gpus" = 0 ]; then
    record SKIP "nanoddp train --backend cuda" "no GPU found"
    TRAIN_ROWS+=("| nanoddp | SKIP | no GPU |")
  else
    # One GPU with and without graphs; 4 ranks on the visible GPUs (round-robin: on one GPU
    # the multi-rank path runs for real); every visible GPU when there are others.
    runs=("1 on" "1 off" "4 on")
    [ "$gpus" -gt 1 ] && [ "$gpus" != 4 ] && runs+=("$gpus on")
    for spec in "${runs[@]}"; do
      read -r n graph <<<"$spec"
      run_step "train-devices-$n-graph-$graph" "nanoddp train --backend cuda --devices $n --cuda-graph $graph" \
        "$(limit 900)" "$cli" train "${train_args[@]}" --devices "$n" --cuda-graph "$graph" \
        --metrics "$logs/train-devices-$n-graph-$graph.jsonl"
      line=$(last_epoch "$CUR_LOG")
      [ -n "$line" ] && note "$line"
      TRAIN_ROWS+=("| nanoddp \`--devices $n --cuda-graph $graph\` | $CUR_STATUS | $(md_cell "${line:-$(last_line)}") |")
      [ "$spec" = "1 on" ] && [ -n "$line" ] && NANODDP_RATE=$(rate "$line")
      finish_step
    done
  fi
fi

if want bench; then
  run_step bench-kernels "nanoddp bench kernels --backend cuda" "$(limit 600)" "$cli" bench kernels --backend cuda
  finish_step
fi

# ------------------------------------------------------------------ one step's kernels
# The sum of one steady training step's kernel times (Nsight Compute, clocks as they run),
# beside the step time the train step measured: how far the host or the gaps between
# kernels keep the GPU from its own work. One rank, from the stream (--cuda-graph off: ncu
# profiles kernels one launch at a time); an fp32 step is 12 launches, the first too (the
# stand-in's call audit, docs/cuda-standin.md), and the skip passes the first 10 steps.
if want profile; then
  cuda_tool_dirs
  ncu=$(find_tool ncu "${CUDA_TOOL_DIRS[@]}") || ncu=""
  if [ -z "$ncu" ]; then
    record SKIP "ncu: one step's kernel times" "ncu not found on PATH nor in ${CUDA_TOOL_DIRS[*]}"
  elif [ "$gpus" = 0 ]; then
    record SKIP "ncu: one step's kernel times" "no GPU found"
  else
    run_step profile-step "ncu: the kernels of one steady step (fp32, batch 256, 1 GPU)" "$(limit 600)" \
      "$ncu" --clock-control none --csv --metrics gpu__time_duration.sum --launch-skip 120 \
      --launch-count 12 "$cli" train --backend cuda --devices 1 --cuda-graph off --epochs 1 \
      --max-steps 12 --batch 256 --data "$data"
    sum=$("$PYTHON" - "$CUR_LOG" <<'PY'
import csv, sys
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3}
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 3]
head = next((r for r in rows if "Metric Value" in r), None)
if head:
    unit, value, name = head.index("Metric Unit"), head.index("Metric Value"), head.index("Metric Name")
    us = [float(r[value].replace(",", "")) * scale.get(r[unit], float("nan"))
          for r in rows if r is not head and r[name] == "gpu__time_duration.sum"]
    print(f"{len(us)} kernels, {sum(us):.1f} us")
PY
)
    note "${sum:-no gpu__time_duration.sum rows in the output of ncu}"
    if [ -n "$sum" ] && [ -n "${NANODDP_RATE:-}" ] && [ "$NANODDP_RATE" -gt 0 ]; then
      RATIO_ROWS+=("one steady step's kernels (ncu, graph off): $sum; the step at --devices 1 with graphs: $(( 256 * 1000000 / NANODDP_RATE )) us ($NANODDP_RATE img/s at batch 256)")
    fi
    ncu_log=$CUR_LOG
    finish_step
    # The same step's launches counted on the CPU by the kit's stand-in (no GPU involved),
    # each launch's H100 estimate beside the time ncu measured.
    if [ -f "$kit/standin/libcuda.so.1" ]; then
      run_step profile-model "the launch profile (stand-in, CPU) beside ncu" "$(limit 600)" \
        env LD_LIBRARY_PATH="$kit/standin" NANODDP_STANDIN_GPUS=1 "$cli" bench kernels --backend cuda --batch 256
      while IFS= read -r row; do MODEL_ROWS+=("$row"); done < <("$PYTHON" - "$ncu_log" "$CUR_LOG" <<'PY'
import csv, sys
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3}
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 3]
head = next((r for r in rows if "Metric Value" in r), None)
measured = {}
if head:
    unit, value, name = head.index("Metric Unit"), head.index("Metric Value"), head.index("Metric Name")
    kernel = head.index("Kernel Name")
    for r in rows:
        if r is head or r[name] != "gpu__time_duration.sum":
            continue
        k = r[kernel].split("(")[0].strip()
        measured.setdefault(k, []).append(float(r[value].replace(",", "")) * scale.get(r[unit], float("nan")))
# The profile's tables: the work table gives inst/FFMA, the memory table the estimate.
work, model, table = {}, [], 0
for line in open(sys.argv[2], errors="replace"):
    f = line.split()
    if len(f) > 1 and f[0] == "#":
        table += 1
        continue
    if table == 1 and len(f) >= 12 and f[0].isdigit():
        work.setdefault(f[1], []).append(f[9])
    if table == 2 and len(f) >= 14 and f[0].isdigit():
        model.append((f[1], f[12]))
seen = {}
for k, est in model:
    i = seen.get(k, 0)
    seen[k] = i + 1
    got = measured.get(k, [])
    m = got[i] if i < len(got) else None
    per = work.get(k, ["-"] * (i + 1))
    ratio = f"{m / float(est):.2f}" if m is not None and est not in ("?", "0.0") else "-"
    print(f"| `{k}` | {m:.1f} | {est} | {ratio} | {per[i] if i < len(per) else '-'} |" if m is not None
          else f"| `{k}` | - | {est} | - | {per[i] if i < len(per) else '-'} |")
PY
)
      note "${#MODEL_ROWS[@]} launches set beside ncu's"
      finish_step
    fi
  fi
fi

# ------------------------------------------------------------------ variants
# A/B in one sitting: the kit's CLI and each build.sh --variant build (bin/nanoddp-NAME) train
# in turn, VARIANT_ROUNDS rounds, so that the GPU's drift reaches them alike; medians and
# ratios against the kit's. Then, with ncu, each build's kernels of one steady step side by
# side (launches matched by order).
if want variants; then
  variant_bins=("$cli")
  for b in "$kit"/bin/nanoddp-*; do [ -x "$b" ] && variant_bins+=("$b"); done
  variant_of() { case "$1" in "$cli") echo kit ;; *) basename "$1" | sed 's/^nanoddp-//' ;; esac; }
  if [ ${#variant_bins[@]} = 1 ]; then
    record SKIP "variants: the kit's CLI against other builds" "no variants in this kit (build.sh --variant NAME=REV)"
  elif [ "$gpus" = 0 ]; then
    record SKIP "variants: the kit's CLI against other builds" "no GPU found"
  else
    declare -A variant_rates=()
    rounds=${VARIANT_ROUNDS:-3}
    case "$rounds" in '' | *[!0-9]* | 0) rounds=3 ;; esac
    for round in $(seq 1 "$rounds"); do
      for b in "${variant_bins[@]}"; do
        v=$(variant_of "$b")
        run_step "variant-$v-$round" "variant $v, round $round: train (fp32, graphs)" "$(limit 600)" \
          "$b" train "${train_args[@]}" --devices 1 --cuda-graph on
        line=$(last_epoch "$CUR_LOG")
        r=$(rate "$line")
        [ -n "$r" ] && variant_rates[$v]="${variant_rates[$v]:-}$r "
        note "${line:-no epoch line}"
        finish_step
      done
    done
    median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {if (NR) print (NR % 2 ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2))}'; }
    base=$(median "${variant_rates[kit]:-}")
    for b in "${variant_bins[@]}"; do
      v=$(variant_of "$b")
      m=$(median "${variant_rates[$v]:-}")
      vs="-"
      [ -n "$m" ] && [ -n "$base" ] && [ "$base" -gt 0 ] && vs=$(ratio "$m" "$base")
      rates=${variant_rates[$v]:-none}
      VARIANT_ROWS+=("| $v | ${rates% } | ${m:--} | $vs |")
    done
    cuda_tool_dirs
    ncu=$(find_tool ncu "${CUDA_TOOL_DIRS[@]}") || ncu=""
    if [ -z "$ncu" ]; then
      record SKIP "variants: one step's kernels (ncu)" "ncu not found on PATH nor in ${CUDA_TOOL_DIRS[*]}"
    else
      variant_logs=()
      for b in "${variant_bins[@]}"; do
        v=$(variant_of "$b")
        run_step "variant-$v-ncu" "variant $v: ncu over one steady step" "$(limit 600)" \
          "$ncu" --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum \
          --launch-skip 120 --launch-count 12 "$b" train --backend cuda --devices 1 --cuda-graph off \
          --epochs 1 --max-steps 12 --batch 256 --data "$data"
        variant_logs+=("$v=$CUR_LOG")
        finish_step
      done
      while IFS= read -r row; do VARIANT_KERNEL_ROWS+=("$row"); done < <("$PYTHON" - "${variant_logs[@]}" <<'PY'
import csv, sys
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3}
builds = []
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    rows = [r for r in csv.reader(open(path, errors="replace")) if len(r) > 3]
    head = next((r for r in rows if "Metric Value" in r), None)
    launches = []
    if head:
        unit, value, metric = head.index("Metric Unit"), head.index("Metric Value"), head.index("Metric Name")
        kernel = head.index("Kernel Name")
        launches = [(r[kernel].split("(")[0].strip(), float(r[value].replace(",", "")) * scale.get(r[unit], float("nan")))
                    for r in rows if r is not head and r[metric] == "gpu__time_duration.sum"]
    builds.append((name, launches))
print("| # | " + " | ".join(f"{n}: kernel | µs" for n, _ in builds) + " |")
print("|---:|" + "---|---:|" * len(builds))
for i in range(max(len(l) for _, l in builds)):
    cells = [f"`{l[i][0]}` | {l[i][1]:.1f}" if i < len(l) else "- | -" for _, l in builds]
    print(f"| {i + 1} | " + " | ".join(cells) + " |")
print("| | " + " | ".join(f"total | **{sum(t for _, t in l):.1f}**" for _, l in builds) + " |")
PY
)
    fi
  fi
fi

# ------------------------------------------------------------------ PyTorch, same model
if want torch; then
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    record SKIP "PyTorch LeNet (eager, compile, graphed)" "no $PYTHON"
  else
    for mode in eager compile graphed; do
      run_step "torch-$mode" "PyTorch LeNet, $mode" "$(limit 900)" env PYTHONUNBUFFERED=1 "$PYTHON" \
        "$kit/torch_lenet_gpu.py" --mode "$mode" --data "$data" --epochs 2 --batch 256 --lr 0.1 --momentum 0.9 --weight-decay 0
      line=$(grep -E '^torch ' "$CUR_LOG" | tail -n 1 | sed -E 's/ +/ /g')
      skipline=$(grep -E '^SKIP: ' "$CUR_LOG" | head -n 1)
      [ -n "$skipline" ] && note "${skipline#SKIP: }"
      [ -n "$line" ] && note "$line"
      [ "$CUR_STATUS" = PASS ] && [ -n "$skipline" ] && [ -z "$line" ] && CUR_STATUS=SKIP
      TORCH_ROWS+=("| PyTorch $mode (fp32, TF32 off) | $CUR_STATUS | $(md_cell "${line:-${skipline:-$(last_line)}}") |")
      if [ -n "$line" ] && [ -n "${NANODDP_RATE:-}" ]; then
        r=$(rate "$line")
        [ -n "$r" ] && [ "$r" -gt 0 ] && RATIO_ROWS+=("nanoddp (1 GPU) / PyTorch $mode, last epoch images/s: $NANODDP_RATE / $r = $(ratio "$NANODDP_RATE" "$r")")
      fi
      finish_step
      [ "$CUR_STATUS" = SKIP ] && [ "$mode" = eager ] && [[ "$skipline" == *"no usable CUDA GPU"* || "$skipline" == *"not importable"* ]] && {
        record SKIP "PyTorch LeNet, compile and graphed" "as eager: ${skipline#SKIP: }"
        TORCH_ROWS+=("| PyTorch compile, graphed | SKIP | as eager |")
        break
      }
    done
  fi
fi

# ------------------------------------------------------------------ compute-sanitizer
if want sanitizer; then
  cuda_tool_dirs
  san=$(find_tool compute-sanitizer "${CUDA_TOOL_DIRS[@]}") || san=""
  if [ -z "$san" ]; then
    record SKIP "compute-sanitizer" "not found on PATH nor in ${CUDA_TOOL_DIRS[*]}"
  else
    if command -v compute-sanitizer >/dev/null 2>&1; then where="on PATH"; else where="not on PATH; found"; fi
    ENV_NOTES+=("compute-sanitizer: $where \`$san\` ($("$san" --version 2>/dev/null | grep -i version | head -n 1))")
    [ "$gpus" -gt 0 ] || ENV_NOTES+=("compute-sanitizer ran with no GPU visible: its summaries below cover no kernel")
    STEP_CWD=$test_cwd
    for tool in memcheck racecheck synccheck; do
      for k in conv gemm pool loss optim elementwise; do
        bin=$kit/tests/$k
        if [ ! -x "$bin" ]; then
          record SKIP "compute-sanitizer $tool tests/$k" "tests/$k is not in the kit"
          continue
        fi
        run_step "sanitizer-$tool-$k" "compute-sanitizer --tool $tool tests/$k cuda" "$(limit 240)" \
          "${cuda_env[@]}" "$san" --tool "$tool" --error-exitcode 86 --print-limit 20 "$bin" cuda --show-output
        summary=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$CUR_LOG" | sed -E 's/^=+ *//' | tr '\n' ' ' | sed 's/ $//')
        tests=$(grep -E '^test result: ' "$CUR_LOG" | tail -n 1 | sed -E 's/^test result: ([^.]*)\. ([0-9]+ passed; [0-9]+ failed).*/\1, \2/')
        case "$CUR_RC" in
          0) ;;
          86) note "the sanitizer reported errors" ;;
          124|137) ;;
          *) note "the tests failed under the sanitizer (exit $CUR_RC): see the test step above" ;;
        esac
        note "${summary:-no ERROR SUMMARY line}"
        TEST_SKIPS=$(grep -E 'skipped: ' "$CUR_LOG" | grep -vc 'a CUDA driver is present')
        if [ "$TEST_SKIPS" -gt 0 ] && [ "$CUR_STATUS" = PASS ]; then
          CUR_STATUS=FAIL
          note "$TEST_SKIPS CUDA instance(s) skipped: nothing ran on a GPU"
        fi
        SAN_ROWS+=("| $tool | \`tests/$k\` | ${summary:-none} | ${tests:-no summary} | **$CUR_STATUS** |")
        finish_step
      done
    done
    STEP_CWD=$work
  fi
fi

# ------------------------------------------------------------------ done
state="complete"
write_report
cleanup
failed=$(( $(count FAIL) + $(count TIMEOUT) ))
printf '[run.sh] %d steps: %d passed, %d failed, %d timed out, %d skipped. Report: %s\n' \
  "${#S_TITLE[@]}" "$(count PASS)" "$(count FAIL)" "$(count TIMEOUT)" "$(count SKIP)" "$report" >&2
[ "$failed" -eq 0 ]
