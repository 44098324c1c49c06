# Run by `cmake --install` (CMakeLists.txt, "Installation"): installs
# spindle.sbatch as DATADIR/spindle/scripts/slurm/spindle.sbatch with the
# installed tree as the default SPINDLE_ROOT, so that
# `sbatch PREFIX/share/spindle/scripts/slurm/spindle.sbatch` finds its
# launcher from any submit directory. In the repository the script finds
# the launcher through the submit directory (the repository root) instead.
#
# Needs SPINDLE_SOURCE_DIR, SPINDLE_BUILD_DIR and SPINDLE_INSTALL_DATADIR
# (set by the install(CODE) before it); CMAKE_INSTALL_PREFIX is the install's prefix
# (`cmake --install --prefix P` included), DESTDIR is honoured.
set(source "${SPINDLE_SOURCE_DIR}/scripts/slurm/spindle.sbatch")
if(IS_ABSOLUTE "${SPINDLE_INSTALL_DATADIR}")
  set(root "${SPINDLE_INSTALL_DATADIR}")
else()
  set(root "${CMAKE_INSTALL_PREFIX}/${SPINDLE_INSTALL_DATADIR}")
endif()
# The path goes inside a double-quoted "${SPINDLE_ROOT:-PATH}": characters
# the shell would expand there, or a "}" that would end it, are refused.
if(root MATCHES "[\"$`\\}]")
  message(FATAL_ERROR "install prefix ${root}: the installed spindle.sbatch cannot name a path with \", $, `, \\ or }; install elsewhere")
endif()
file(READ "${source}" text)
set(from [=[${SPINDLE_ROOT:-${SLURM_SUBMIT_DIR:-.}}]=])
string(FIND "${text}" "${from}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${source}: no '${from}' to point at the installed tree")
endif()
string(REPLACE "${from}" "\${SPINDLE_ROOT:-${root}}" text "${text}")
# Written beside the build, then installed from there (file(INSTALL) lists
# it in install_manifest.txt and keeps the mode); a folder per installed
# tree, so that two installs of one build to different prefixes at once
# (tests under ctest -j) do not take each other's copy.
string(MD5 tree "${root}")
set(staged "${SPINDLE_BUILD_DIR}/install-sbatch/${tree}/spindle.sbatch")
file(WRITE "${staged}" "${text}")
file(INSTALL DESTINATION "${root}/scripts/slurm" TYPE FILE FILES "${staged}"
     PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
