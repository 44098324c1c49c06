#!/usr/bin/env bash
# Runs a script of this repository (default scripts/test.sh) from a fresh
# clone inside a bare Debian 12 (debootstrap's minbase variant, what the
# debian:12 container image holds: no python3, git, sudo or compiler), as
# the README promises both of its first commands work there.
#
# Usage (root, network to deb.debian.org): scripts/fresh-debian.sh [DIR] [SCRIPT]
#   DIR     where the Debian tree goes (default /var/tmp/spindle-fresh-debian;
#           a tree from an earlier run is removed first)
#   SCRIPT  the repository's script to run there (default scripts/test.sh;
#           scripts/demo.sh for the demo)
# The clone is of this repository's HEAD (commit what you want checked).
# Prints the script's output; exits with its status. Leaves DIR in place
# (unmounted) for a look at its logs; remove it with `rm -rf DIR`.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-/var/tmp/spindle-fresh-debian}"
script="${2:-scripts/test.sh}"

[ "$(id -u)" -eq 0 ] || { echo "fresh-debian: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
[ -f "$root/$script" ] || { echo "fresh-debian: no $script in $root" >&2; exit 2; }
command -v debootstrap > /dev/null || apt-get install -y -qq --no-install-recommends debootstrap

unmount() {   # the three mounts below, each with what it holds
  local m
  for m in dev sys proc; do
    if mountpoint -q "$dir/$m" 2> /dev/null; then umount -R "$dir/$m" || umount -R -l "$dir/$m" || true; fi
  done
}
# An existing DIR is removed only when this script made it (its marker
# file) or it is an empty folder: a mistyped DIR such as /home stays.
marker="$dir/.spindle-fresh-debian"
if [ -e "$dir" ] && [ ! -e "$marker" ] && ! rmdir "$dir" 2> /dev/null; then
  echo "fresh-debian: $dir exists and is no tree of this script (no $marker): not removed; pick another DIR" >&2
  exit 2
fi
trap unmount EXIT
if [ -e "$dir" ]; then
  unmount
  rm -rf --one-file-system "$dir"
fi

echo "fresh-debian: debootstrap --variant=minbase bookworm $dir"
debootstrap --variant=minbase bookworm "$dir" http://deb.debian.org/debian > "$dir.debootstrap.log" 2>&1 ||
  { tail -20 "$dir.debootstrap.log" >&2; exit 1; }
touch "$marker"
cat > "$dir/etc/apt/sources.list" << 'EOF'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
# What a container runtime provides: name resolution, and the host's name
# in /etc/hosts (without it, every Open MPI start waits seconds on DNS for
# this host's name).
cp /etc/resolv.conf "$dir/etc/resolv.conf"
cp /etc/hosts "$dir/etc/hosts"
mount -t proc proc "$dir/proc"
# Recursive binds made slaves: unmounting them later must not unmount the
# host's own /sys and /dev submounts (shared propagation).
mount --rbind /sys "$dir/sys" && mount --make-rslave "$dir/sys"
mount --rbind /dev "$dir/dev" && mount --make-rslave "$dir/dev"   # /dev/shm with it: Open MPI's shared memory

# A clone of HEAD, as CI checks out a clean clone (no build folders, no
# untracked files).
git clone -q "$root" "$dir/root/spindle"
echo "fresh-debian: $(git -C "$dir/root/spindle" log -1 --format='%h %s' | cut -c1-100)"
echo "fresh-debian: running $script in the bare Debian 12 tree"
status=0
chroot "$dir" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 bash -c "cd /root/spindle && $script" || status=$?
echo "fresh-debian: $script exited $status"
exit "$status"
