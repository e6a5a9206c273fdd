#!/usr/bin/env bash
# The README's two commands as a new user runs them: clone the checkout's HEAD into a new folder, then run
# the first fenced command that does not mention pytest (install + the main job) and the first that does
# (install + the tests), each from the clone's root, timed. Feeds BENCHMARKS.md, "The whole job" and
# "The test suite". Usage, from the repository root: bash bench/fresh_clone.sh [WORK]  (default: a temp folder)
set -u
repo="$(pwd)"; work="${1:-$(mktemp -d)}"
git clone -q "$repo" "$work/clone" || exit 2
cd "$work/clone" || exit 2
mapfile -t cmds < <(python3 - <<'PY'
import re
text = open("README.md", encoding="utf-8").read()
lines = [l.strip().removeprefix("$").strip() for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
         for l in block.splitlines() if l.strip() and not l.strip().startswith("#")]
print(next((l for l in lines if "pytest" not in l), ""))
print(next((l for l in lines if "pytest" in l), ""))
PY
)
for i in 0 1; do
  name=$([ "$i" = 0 ] && echo main || echo tests)
  echo "$name: ${cmds[$i]}"
  start=$(date +%s); bash -c "${cmds[$i]}" > "$work/$name.log" 2>&1; rc=$?
  echo "$name: rc $rc in $(( $(date +%s) - start )) s (log: $work/$name.log)"; tail -3 "$work/$name.log"
done
