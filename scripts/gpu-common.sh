# shellcheck shell=bash
# Sourced by scripts/gpu-check.sh and scripts/gpu-prebuild.sh: what both
# must agree on.

# nvcc on PATH: as found, else the toolkit's in /usr/local/cuda/bin; false
# when neither is there.
spindle_nvcc_on_path() {
  command -v nvcc > /dev/null && return 0
  [ -x /usr/local/cuda/bin/nvcc ] || return 1
  PATH="$PATH:/usr/local/cuda/bin"
}

# The targets the GPU check builds and runs.
# shellcheck disable=SC2034 # read by the scripts that source this file
SPINDLE_GPU_TARGETS=(spindle-plan spindle-run spindle-profile test_gpu gpu_tool gpu compare_runs loop)

# One line naming the working tree's content: a hash over the path and
# content of every file git lists (tracked, and untracked but not ignored)
# that exists. A build carried from another machine is used only where the
# line is the same. Content, not the commit: the lent GPU machine gets this
# tree's files with the .git of the session's start (seen 2026-12-04: a
# commit-based stamp never matched after a commit), so its HEAD and index
# may be older than its files; a file deleted since is listed there but
# absent, and skipped on both sides.
spindle_tree_stamp() {
  local root=$1
  git -C "$root" rev-parse --git-dir > /dev/null 2>&1 || { echo "no-git"; return; }
  (cd "$root" && git ls-files -co --exclude-standard -z | LC_ALL=C sort -zu |
     while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done | xargs -0 -r sha256sum) |
    sha256sum | cut -c1-16
}
