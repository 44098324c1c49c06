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
SPINDLE_GPU_TARGETS=(spindle-plan spindle-run spindle-profile test_gpu gpu_tool gpu compare_runs loop)

# One line naming the working tree's state: the commit and a hash of every
# difference from it (tracked changes, and the untracked files git does not
# ignore, by name and content). A build carried from another machine is
# used only where the line is the same.
spindle_tree_stamp() {
  local root=$1 head diff
  head=$(git -C "$root" rev-parse HEAD 2>/dev/null) || { echo "no-git"; return; }
  diff=$( { git -C "$root" diff HEAD --binary
            git -C "$root" ls-files --others --exclude-standard -z | (cd "$root" && xargs -0 -r sha256sum); } |
          sha256sum | cut -c1-16)
  echo "$head $diff"
}
