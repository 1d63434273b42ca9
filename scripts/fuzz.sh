#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer on the stable toolchain.
#
#   scripts/fuzz.sh TARGET [SECONDS]     fuzz one target (default 600 s)
#   scripts/fuzz.sh all [SECONDS]        every target in turn
#
# Targets: file_image sqlite_record flow_file step_stdout json_arg duration
# run_id gate_name export_line (crates/steadfast-cli/src/fuzzing.rs). New inputs that
# reach new code are kept in fuzz/corpus-work/TARGET; crashes land in
# fuzz/artifacts/TARGET. Copy findings (minimised) into fuzz/corpus/TARGET,
# which `cargo test` replays. Prints one summary line per target:
# executions, run time, findings.
#
# `cargo fuzz` wants a nightly toolchain for its sanitizer flags; this script
# passes the SanitizerCoverage flags that stable rustc accepts and links
# libFuzzer through the libfuzzer-sys crate (built with the machine's C++
# compiler), without AddressSanitizer. Rust code is memory-safe without it;
# panics, overflows (debug assertions are on) and broken assertions are what
# the targets look for.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
targets=(file_image sqlite_record flow_file step_stdout json_arg duration run_id gate_name export_line)
which="${1:?usage: scripts/fuzz.sh TARGET|all [SECONDS]}"
secs="${2:-600}"
if [ "$which" = all ]; then set -- "${targets[@]}"; else set -- "$which"; fi

export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
triple="$(rustc -vV | sed -n "s/^host: //p")"
# With --target, RUSTFLAGS reach only the fuzzed code, not build scripts.
cargo build --release --bins --target "$triple"

for t in "$@"; do
  mkdir -p "corpus-work/$t" "artifacts/$t"
  log="artifacts/$t/fuzz.log"
  set +e
  "target/$triple/release/$t" "corpus-work/$t" "corpus/$t" -max_total_time="$secs" -max_len=65536 \
    -timeout=10 -rss_limit_mb=4096 -artifact_prefix="artifacts/$t/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  time=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$log" >/dev/null; echo "${secs}s")
  finds=$(find "artifacts/$t" -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' | wc -l)
  echo "fuzz $t: $runs executions in $time, exit $rc, findings $finds (log $log)"
done
