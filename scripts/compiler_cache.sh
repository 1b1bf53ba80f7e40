# Sourced by scripts/build.sh and scripts/test.sh: when ccache is on the machine (a Debian
# package that scripts/install_deps.sh installs), compilers run through it, so that the CUDA
# build (build-cuda/) and later rebuilds reuse the objects build/ compiled: most of the CUDA
# build's host objects are the same compilation (CI: about four in five). CCACHE_BASEDIR is the
# repository root, so paths inside it hash as relative ones and build folders side by side share
# entries; deploy/build_image.sh mounts this cache into the image's build. Sets
# `compiler_cache_flags` (cmake arguments; empty without ccache).
compiler_cache_flags=()
if command -v ccache > /dev/null; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
  # The locale (LANG, LC_*) only changes the language of diagnostics; left out of the hash, the
  # image's build (deploy/build_release.sh, which sets the same) reuses these objects whatever
  # locale each side runs in.
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-locale}"
  compiler_cache_flags=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
