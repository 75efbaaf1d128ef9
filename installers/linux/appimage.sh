#!/usr/bin/env bash
# AppImage recipe: wraps the PyInstaller folder (build/dist/localchat) in an AppDir and runs appimagetool.
# appimagetool downloads its runtime from GitHub at build time, so this runs in GitHub CI (the
# installers workflow), not on machines without internet.
set -euo pipefail
cd "$(dirname "$0")/../.."
version="${VERSION:-$(python -c 'import localchat; print(localchat.__version__)')}"
appdir="build/AppDir"
rm -rf "$appdir" && mkdir -p "$appdir/usr/share/applications" "$appdir/usr/share/doc/localchat"
cp -R build/dist/localchat "$appdir/usr/lib-localchat"
cp installers/linux/localchat.desktop "$appdir/localchat.desktop"
cp installers/linux/localchat.desktop "$appdir/usr/share/applications/"
cp installers/licenses/* "$appdir/usr/share/doc/localchat/"
cp installers/linux/localchat.svg "$appdir/localchat.svg"
cat > "$appdir/AppRun" <<'RUN'
#!/bin/sh
here="$(dirname "$(readlink -f "$0")")"
exec "$here/usr/lib-localchat/localchat" "$@"
RUN
chmod +x "$appdir/AppRun"
tool="build/appimagetool"
if [[ ! -x "$tool" ]]; then
  curl -fsSL -o "$tool" \
    "https://github.com/AppImage/appimagetool/releases/download/continuous/appimagetool-x86_64.AppImage"
  chmod +x "$tool"
fi
ARCH=x86_64 "$tool" --appimage-extract-and-run "$appdir" "build/installers/localchat-$version-x86_64.AppImage"
